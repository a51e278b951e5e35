package queue

import (
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
type Backoff struct {
	// Base is the delay before the first retry. Defaults to 1s.
	Base time.Duration
	// Max caps the delay. Defaults to 1h.
	Max time.Duration
	// Jitter is the fraction of the delay that is randomized, 0–1. Defaults to 0.2: the
	// delay is drawn from [d·0.8, d].
	Jitter float64
}

// DefaultBackoff returns the retry policy used when none is configured: 1s doubling,
// capped at 1h, 20% jitter.
func DefaultBackoff() Backoff { return Backoff{Base: time.Second, Max: time.Hour, Jitter: 0.2} }

// Delay returns the delay before retrying after the given attempt (1 for the first).
func (b Backoff) Delay(attempt int) time.Duration {
	def := DefaultBackoff()
	base, maxD, jitter := b.Base, b.Max, b.Jitter
	if base <= 0 {
		base = def.Base
	}
	if maxD <= 0 {
		maxD = def.Max
	}
	if jitter <= 0 || jitter > 1 {
		jitter = def.Jitter
	}
	if attempt < 1 {
		attempt = 1
	}
	d := float64(base) * math.Pow(2, float64(attempt-1))
	if d > float64(maxD) || math.IsInf(d, 0) {
		d = float64(maxD)
	}
	d -= d * jitter * rand.Float64()
	return time.Duration(d)
}
