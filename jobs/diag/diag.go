// Package diag holds two diagnostic job kinds for operators: noop, which completes at
// once, and sleep, which holds its lease for a while (respecting cancellation unless
// its args say otherwise). They
// prove a deployment works end to end (`fenceq enqueue noop`) and let an operator watch
// heartbeats, leases and shutdowns (`fenceq enqueue sleep --args '{"duration":"30s"}'`).
package diag

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fenceq/fenceq"
)

// Kinds.
const (
	NoopKind  = "noop"
	SleepKind = "sleep"
	WaitKind  = "wait"
)

// MaxSleep bounds a sleep job's duration.
const MaxSleep = 24 * time.Hour

// NoopArgs are the args of a noop job: none.
type NoopArgs struct{}

// Kind implements fenceq.JobArgs.
func (NoopArgs) Kind() string { return NoopKind }

// SleepArgs are the args of a sleep job: {"duration": "5s"}.
type SleepArgs struct {
	// Duration is how long the job sleeps, in Go duration syntax ("5s", "1m30s").
	Duration Duration `json:"duration"`
	// IgnoreCancel makes the job sleep its whole duration whatever happens to its
	// context, then report success: a handler stuck in a call that takes no context.
	// Its lease may be revoked meanwhile (its worker cut off from the database); its
	// late completion is then rejected by the fence. Default false.
	IgnoreCancel bool `json:"ignore_cancel,omitempty"`
}

// Kind implements fenceq.JobArgs.
func (SleepArgs) Kind() string { return SleepKind }

// Duration is a time.Duration that reads and writes JSON as a Go duration string.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"5s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// WaitArgs are the args of a wait job: {"signal": "go", "timeout": "1m"}. Its first
// attempt waits for the signal (fenceq.WaitForSignal), holding no lease; woken, it
// completes with output {"signal": <payload>} or, when the timeout ended the wait,
// {"timed_out": true}. It lets an operator watch a wait and a signal end to end
// (`fenceq jobs signal ID go`).
type WaitArgs struct {
	Signal string `json:"signal"`
	// Timeout bounds the wait (0: none).
	Timeout Duration `json:"timeout,omitempty"`
}

// Kind implements fenceq.JobArgs.
func (WaitArgs) Kind() string { return WaitKind }

// ValidateWait checks the args of a wait job before it is enqueued.
func ValidateWait(raw []byte) error {
	var a WaitArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return fmt.Errorf("wait args: %w", err)
	}
	if a.Signal == "" {
		return fmt.Errorf("wait args: signal: empty; name the signal to wait for")
	}
	if d := time.Duration(a.Timeout); d < 0 || d > MaxSleep {
		return fmt.Errorf("wait args: timeout %s must be between 0 and %s", d, MaxSleep)
	}
	return nil
}

// ValidateSleep checks the args of a sleep job before it is enqueued.
func ValidateSleep(raw []byte) error {
	var a SleepArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return fmt.Errorf("sleep args: %w", err)
	}
	if d := time.Duration(a.Duration); d < 0 || d > MaxSleep {
		return fmt.Errorf("sleep args: duration %s must be between 0 and %s", d, MaxSleep)
	}
	return nil
}

// Register adds the noop and sleep handlers.
func Register(hs *fenceq.Handlers) {
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[NoopArgs]) error { return nil }, nil)
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[WaitArgs]) error {
		var payload json.RawMessage
		switch err := job.Signal(ctx, job.Args.Signal, &payload); {
		case errors.Is(err, fenceq.ErrNoSignal):
			return fenceq.WaitForSignal(job.Args.Signal, time.Duration(job.Args.Timeout))
		case errors.Is(err, fenceq.ErrSignalTimeout):
			return fenceq.RecordOutput(ctx, map[string]any{"timed_out": true})
		case err != nil:
			return err
		}
		return fenceq.RecordOutput(ctx, map[string]any{"signal": payload})
	}, nil)
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[SleepArgs]) error {
		d := time.Duration(job.Args.Duration)
		if d < 0 || d > MaxSleep {
			return fenceq.JobDiscard(fmt.Errorf("sleep duration %s must be between 0 and %s", d, MaxSleep))
		}
		if job.Args.IgnoreCancel {
			time.Sleep(d)
			return nil
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("sleep interrupted after less than %s: %w", d, context.Cause(ctx))
		}
	}, nil)
}
