package fenceq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type outArgs struct {
	Mode string `json:"mode"`
}

func (outArgs) Kind() string { return "out" }

// RecordOutput's value is written with the job's completion: the batched completion
// after the handler returns nil, and Job.Commit's transaction (recorded inside it). It
// is not written when the attempt fails; a too large value is a validation error that
// keeps the previous one; nothing can be recorded after Commit.
func TestRecordOutputWrittenWithCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	afterCommit := make(chan error, 1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[outArgs]) error {
		switch job.Args.Mode {
		case "batched":
			if err := fenceq.RecordOutput(ctx, map[string]any{"first": true}); err != nil {
				return err
			}
			return fenceq.RecordOutput(ctx, map[string]any{"invoice_id": 42}) // replaces the first
		case "commit":
			err := job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen, value) VALUES ($1, $2, 'x')`, job.ID, job.LeaseGen)
				if err != nil {
					return err
				}
				return fenceq.RecordOutput(ctx, []int{1, 2, 3})
			})
			afterCommit <- fenceq.RecordOutput(ctx, "too late")
			return err
		case "too-large":
			if err := fenceq.RecordOutput(ctx, "kept"); err != nil {
				return err
			}
			err := fenceq.RecordOutput(ctx, strings.Repeat("x", queue.MaxOutputBytes))
			var ve *queue.ValidationError
			if !errors.Is(err, queue.ErrInvalid) || !errors.As(err, &ve) || ve.Field != "output" {
				return fenceq.JobDiscard(errors.New("too large output accepted or wrong error: " + errString(err)))
			}
			// A string holding NUL encodes, but jsonb cannot store it: refused here, not
			// at the completion, and the output recorded before stays.
			err = fenceq.RecordOutput(ctx, "a\x00b")
			if !errors.Is(err, queue.ErrInvalid) || !errors.As(err, &ve) || ve.Field != "output" {
				return fenceq.JobDiscard(errors.New("output with a NUL accepted or wrong error: " + errString(err)))
			}
			return nil
		case "fails":
			if err := fenceq.RecordOutput(ctx, "never stored"); err != nil {
				return err
			}
			return fenceq.JobDiscard(errors.New("failed after recording output"))
		case "null":
			if err := fenceq.RecordOutput(ctx, 1); err != nil {
				return err
			}
			return fenceq.RecordOutput(ctx, nil)
		}
		return errors.New("unknown mode")
	}, nil)
	b.startWorker(t, b.fastConfig(5*time.Second))
	want := map[string]string{"batched": `{"invoice_id": 42}`, "commit": `[1, 2, 3]`, "too-large": `"kept"`, "fails": "", "null": ""}
	ids := map[string]int64{}
	for mode := range want {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, outArgs{Mode: mode}, &fenceq.InsertOpts{MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids[mode] = res.Job.ID
	}
	for mode, out := range want {
		state := queue.StateCompleted
		if mode == "fails" {
			state = queue.StateDiscarded
		}
		j := fenceqtest.WaitState(t, b.db.Pool, ids[mode], state, 10*time.Second)
		if string(j.Output) != out || (out == "" && j.Output != nil) {
			t.Errorf("%s: output %q, want %q", mode, j.Output, out)
		}
	}
	if err := recv(t, afterCommit, 10*time.Second, "RecordOutput after Commit"); err == nil || !strings.Contains(err.Error(), "already completed") {
		t.Errorf("RecordOutput after Commit: %v, want it refused", err)
	}
	if err := fenceq.RecordOutput(b.ctx, 1); err == nil || !strings.Contains(err.Error(), "not the context of a running job") {
		t.Errorf("RecordOutput outside a handler: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// A handler whose lease is revoked before it returns writes no output: neither its
// batched completion nor its Job.Commit is applied, and the database records each
// rejected write. The heartbeat is too slow to see the revocation first, so the writes
// really reach the fence.
func TestRecordOutputNotWrittenWhenLeaseLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan int64, 2)
	release := make(chan struct{})
	returned := make(chan error, 2)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[outArgs]) error {
		if err := fenceq.RecordOutput(ctx, map[string]string{"by": job.Args.Mode}); err != nil {
			return err
		}
		started <- job.ID
		<-release
		var err error
		if job.Args.Mode == "commit" {
			err = job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error { return nil })
		}
		returned <- err
		return err
	}, nil)
	cfg := b.fastConfig(2 * time.Minute) // heartbeat every 40s: the test is over before one
	cfg.ReaperInterval = time.Minute
	b.startWorker(t, cfg)
	ids := map[int64]string{}
	for _, mode := range []string{"batched", "commit"} {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, outArgs{Mode: mode}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[res.Job.ID] = mode
	}
	for range ids {
		recv(t, started, 10*time.Second, "a handler")
	}
	// Revoke both leases while the handlers hold them, and keep the jobs from being
	// claimed again.
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, queue.DefaultQueue, true); err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		j, err := store.RequeueJob(b.ctx, b.db.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != queue.StateAvailable || j.LeaseGen != 2 {
			t.Fatalf("job %d after requeue: %s at gen %d, want available at gen 2", id, j.State, j.LeaseGen)
		}
		if n := b.countEvents(t, queue.EventRevoked, id, 1); n != 1 {
			t.Fatalf("job %d: %d revoked events at gen 1, want 1", id, n)
		}
	}
	close(release)
	for range ids {
		if err := recv(t, returned, 10*time.Second, "a handler's return"); err != nil && !errors.Is(err, queue.ErrLeaseLost) {
			t.Fatalf("handler: %v, want nil or ErrLeaseLost", err)
		}
	}
	for id, mode := range ids {
		// The rejected write is the proof that the holder tried: its completion met the fence.
		deadline := time.Now().Add(10 * time.Second)
		for b.countEvents(t, queue.EventStaleWriteRejected, id, 1) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no stale_write_rejected event at gen 1", mode)
			}
			time.Sleep(20 * time.Millisecond)
		}
		j, err := store.GetJob(b.ctx, b.db.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.Output != nil || j.State != queue.StateAvailable || j.LeaseGen != 2 {
			t.Errorf("%s: output %s, state %s, gen %d; want no output, available at gen 2", mode, j.Output, j.State, j.LeaseGen)
		}
	}
}
