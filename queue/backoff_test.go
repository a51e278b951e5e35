package queue_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// The zero Backoff is the default, jitter included; a Backoff with fields set takes its
// Jitter as given, 0 being none.
func TestBackoffJitterZeroIsNone(t *testing.T) {
	t.Parallel()
	want := func(attempt int, base, maxD time.Duration) time.Duration {
		return min(base<<(attempt-1), maxD)
	}
	// No jitter: every delay is exactly Base·2^(attempt-1), capped at Max.
	exact := queue.Backoff{Base: time.Second, Max: time.Minute}
	for attempt := 1; attempt <= 10; attempt++ {
		for range 20 {
			if d := exact.Delay(attempt); d != want(attempt, time.Second, time.Minute) {
				t.Fatalf("%+v attempt %d: delay %s, want exactly %s", exact, attempt, d, want(attempt, time.Second, time.Minute))
			}
		}
	}
	// A Backoff with only Jitter 0 and Max set still takes the default Base.
	if d := (queue.Backoff{Max: time.Hour}).Delay(3); d != 4*time.Second {
		t.Errorf("Backoff{Max: 1h}.Delay(3) = %s, want 4s (default Base, no jitter)", d)
	}
	// The zero Backoff is DefaultBackoff(): 20% jitter, so the delays of one attempt
	// spread over [0.8·d, d].
	for _, b := range []queue.Backoff{{}, queue.DefaultBackoff()} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := b.Delay(4)
			if d < 8*time.Second*8/10 || d > 8*time.Second {
				t.Fatalf("%+v attempt 4: delay %s outside [6.4s, 8s]", b, d)
			}
			seen[d] = true
		}
		if len(seen) < 2 {
			t.Errorf("%+v: 200 delays of attempt 4 all equal %v: no jitter, want the default 20%%", b, seen)
		}
	}
	// An explicit Jitter is kept.
	half := queue.Backoff{Base: time.Second, Max: time.Hour, Jitter: 0.5}
	for range 200 {
		if d := half.Delay(2); d < time.Second || d > 2*time.Second {
			t.Fatalf("%+v attempt 2: delay %s outside [1s, 2s]", half, d)
		}
	}
}

func TestBackoffValidate(t *testing.T) {
	t.Parallel()
	for _, b := range []queue.Backoff{{}, queue.DefaultBackoff(), {Base: time.Second}, {Jitter: 1}, {Base: time.Second, Jitter: 0}} {
		if err := b.Validate(); err != nil {
			t.Errorf("%+v: %v, want valid", b, err)
		}
	}
	for field, b := range map[string]queue.Backoff{
		"Backoff.Base":   {Base: -time.Second},
		"Backoff.Max":    {Max: -time.Second},
		"Backoff.Jitter": {Jitter: 1.5},
	} {
		if err := b.Validate(); err == nil || !strings.HasPrefix(err.Error(), field+":") {
			t.Errorf("%+v: err = %v, want it to name %s", b, err, field)
		}
	}
	for _, j := range []float64{-0.1, math.NaN(), math.Inf(1)} {
		if err := (queue.Backoff{Base: time.Second, Jitter: j}).Validate(); err == nil || !strings.Contains(err.Error(), "Backoff.Jitter") {
			t.Errorf("Jitter %v: err = %v, want Backoff.Jitter named", j, err)
		}
	}
}
