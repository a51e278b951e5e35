package queue

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is exponential retry backoff with jitter, capped.
//
// Its delay says when a failed job becomes due again, not when it runs: the failed
// job waits in the retryable state until a worker's maintenance pass (the scheduler,
// run every ReaperInterval of the worker's Config, 5s by default) finds its run_at
// passed and makes it available. A retry therefore runs between its delay and its
// delay plus one ReaperInterval after the failure (then waits for a free slot like any
// job): the delay is in effect rounded up to the next pass. A delay shorter than the
// interval, such as the default's first 1s, waits up to the interval; a worker that
// needs quicker short retries lowers its ReaperInterval.
//
// The zero Backoff is DefaultBackoff(). A Backoff with any field set is taken as given,
// except that a Base or Max left 0 takes the default's (1s, 1h): a Jitter left 0 then
// means no jitter, every delay exactly Base·2^(attempt-1), capped at Max.
type Backoff struct {
	// Base is the delay before the first retry. 0 takes 1s.
	Base time.Duration
	// Max caps the delay. 0 takes 1h.
	Max time.Duration
	// Jitter is the fraction of the delay that is randomized, 0–1: the delay is drawn
	// from [d·(1-Jitter), d]. 0 is no jitter; the zero Backoff, whose Jitter is 0 too,
	// is DefaultBackoff() and has 0.2.
	Jitter float64
}

// DefaultBackoff returns the retry policy used when none is configured (the zero
// Backoff): 1s doubling, capped at 1h, 20% jitter.
func DefaultBackoff() Backoff { return Backoff{Base: time.Second, Max: time.Hour, Jitter: 0.2} }

// Validate reports a field out of range, by name: a negative Base or Max, or a Jitter
// outside 0–1.
func (b Backoff) Validate() error {
	switch {
	case b.Base < 0:
		return fmt.Errorf("Backoff.Base: %s must not be negative", b.Base)
	case b.Max < 0:
		return fmt.Errorf("Backoff.Max: %s must not be negative", b.Max)
	case !(b.Jitter >= 0 && b.Jitter <= 1):
		return fmt.Errorf("Backoff.Jitter: %v must be between 0 and 1", b.Jitter)
	}
	return nil
}

// Delay returns the delay before retrying after the given attempt (1 for the first).
// A field out of range (see Validate) is clamped: a negative Base or Max takes the
// default's, a Jitter below 0 is none and one above 1 is 1.
func (b Backoff) Delay(attempt int) time.Duration {
	def := DefaultBackoff()
	if b == (Backoff{}) {
		b = def
	}
	base, maxD, jitter := b.Base, b.Max, b.Jitter
	if base <= 0 {
		base = def.Base
	}
	if maxD <= 0 {
		maxD = def.Max
	}
	if !(jitter > 0) { // negative or NaN
		jitter = 0
	}
	if jitter > 1 {
		jitter = 1
	}
	if attempt < 1 {
		attempt = 1
	}
	d := float64(base) * math.Pow(2, float64(attempt-1))
	if d > float64(maxD) || math.IsInf(d, 0) {
		d = float64(maxD)
	}
	if jitter > 0 {
		d -= d * jitter * rand.Float64()
	}
	return time.Duration(d)
}
