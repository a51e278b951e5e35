package invoice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// TaxRequest asks for the tax on one invoice.
type TaxRequest struct {
	CustomerID    int64
	Country       string
	Period        string
	Currency      string
	SubtotalCents int64
}

// TaxQuote is a tax service's answer.
type TaxQuote struct {
	// RateMicros is the rate in millionths: 72500 = 7.25 %.
	RateMicros int64
	// Jurisdiction names where the rate applies, e.g. "DE".
	Jurisdiction string
	// Reference is the service's id of this calculation; it is stored on the invoice.
	Reference string
}

// TaxService is the external tax API: slow, sometimes very slow, sometimes failing.
// The invoice handler calls it before its transaction, never inside it; an error is
// retried with backoff.
type TaxService interface {
	Quote(ctx context.Context, req TaxRequest) (TaxQuote, error)
}

// ErrTaxUnavailable is the simulated tax service's transient failure.
var ErrTaxUnavailable = errors.New("tax service unavailable")

// DefaultTaxRates are the simulated service's rates by country, in millionths.
var DefaultTaxRates = map[string]int64{
	"US": 72_500,  // 7.25 %
	"CA": 50_000,  // 5 %
	"DE": 190_000, // 19 %
	"FR": 200_000, // 20 %
	"GB": 200_000, // 20 %
	"NL": 210_000, // 21 %
	"JP": 100_000, // 10 %
	"CH": 81_000,  // 8.1 %
}

// TaxCall describes one call of the simulated service, for its Hook.
type TaxCall struct {
	// N numbers the calls from 1.
	N       int64
	Request TaxRequest
	// Latency is the simulated latency this call waited.
	Latency time.Duration
}

// SimulatedTaxConfig shapes the simulated tax service: a body of latencies drawn
// uniformly from [MinLatency, MaxLatency], a tail — with probability TailProbability a
// latency from [TailMin, TailMax], which may be set longer than the lease — and an error
// rate. The zero config answers at once and never fails.
type SimulatedTaxConfig struct {
	MinLatency, MaxLatency time.Duration
	// TailProbability is the chance, 0–1, that a call takes a tail latency instead.
	TailProbability  float64
	TailMin, TailMax time.Duration
	// ErrorRate is the chance, 0–1, that a call fails with ErrTaxUnavailable after its
	// latency.
	ErrorRate float64
	// Seed makes the draws reproducible; 0 picks a random seed.
	Seed uint64
	// Rates by country in millionths; defaults to DefaultTaxRates.
	Rates map[string]int64
	// DefaultRateMicros applies to countries missing from Rates. Defaults to 0.
	DefaultRateMicros int64
	// Hook, when set, runs after the latency and before the answer, in the caller's
	// goroutine. It may block (a holder that pauses inside the tax call; it should
	// ignore ctx to model a frozen process) or return an error (the call fails with it).
	Hook func(ctx context.Context, call TaxCall) error
}

// SimulatedTax is an in-process TaxService with the configured latency distribution and
// error rate. It is safe for concurrent use.
type SimulatedTax struct {
	cfg   SimulatedTaxConfig
	mu    sync.Mutex
	rng   *rand.Rand
	calls atomic.Int64
	tails atomic.Int64
	fails atomic.Int64
}

var _ TaxService = (*SimulatedTax)(nil)

// NewSimulatedTax validates the config and returns the service.
func NewSimulatedTax(cfg SimulatedTaxConfig) (*SimulatedTax, error) {
	if cfg.MinLatency < 0 || cfg.MaxLatency < cfg.MinLatency {
		return nil, fmt.Errorf("simulated tax: latency range [%s, %s] is invalid", cfg.MinLatency, cfg.MaxLatency)
	}
	if cfg.TailMin < 0 || cfg.TailMax < cfg.TailMin {
		return nil, fmt.Errorf("simulated tax: tail range [%s, %s] is invalid", cfg.TailMin, cfg.TailMax)
	}
	for name, p := range map[string]float64{"TailProbability": cfg.TailProbability, "ErrorRate": cfg.ErrorRate} {
		if p < 0 || p > 1 {
			return nil, fmt.Errorf("simulated tax: %s %v must be between 0 and 1", name, p)
		}
	}
	if cfg.Rates == nil {
		cfg.Rates = DefaultTaxRates
	}
	for c, r := range cfg.Rates {
		if r < 0 || r > MaxTaxRateMicros {
			return nil, fmt.Errorf("simulated tax: rate of %s %d is outside 0–%d", c, r, MaxTaxRateMicros)
		}
	}
	if cfg.DefaultRateMicros < 0 || cfg.DefaultRateMicros > MaxTaxRateMicros {
		return nil, fmt.Errorf("simulated tax: DefaultRateMicros %d is outside 0–%d", cfg.DefaultRateMicros, MaxTaxRateMicros)
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &SimulatedTax{cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, nil
}

// Quote waits the drawn latency (returning early when ctx ends), runs the hook, and
// answers with the country's rate or fails.
func (s *SimulatedTax) Quote(ctx context.Context, req TaxRequest) (TaxQuote, error) {
	n := s.calls.Add(1)
	latency, tail, fail := s.draw()
	if tail {
		s.tails.Add(1)
	}
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return TaxQuote{}, fmt.Errorf("tax quote call %d: %w", n, context.Cause(ctx))
		}
	}
	if s.cfg.Hook != nil {
		if err := s.cfg.Hook(ctx, TaxCall{N: n, Request: req, Latency: latency}); err != nil {
			s.fails.Add(1)
			return TaxQuote{}, fmt.Errorf("tax quote call %d: %w", n, err)
		}
	}
	if fail {
		s.fails.Add(1)
		return TaxQuote{}, fmt.Errorf("tax quote call %d: %w", n, ErrTaxUnavailable)
	}
	rate, ok := s.cfg.Rates[req.Country]
	if !ok {
		rate = s.cfg.DefaultRateMicros
	}
	return TaxQuote{RateMicros: rate, Jurisdiction: req.Country, Reference: fmt.Sprintf("simtax-%d", n)}, nil
}

func (s *SimulatedTax) draw() (latency time.Duration, tail, fail bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tail = s.cfg.TailProbability > 0 && s.rng.Float64() < s.cfg.TailProbability
	lo, hi := s.cfg.MinLatency, s.cfg.MaxLatency
	if tail {
		lo, hi = s.cfg.TailMin, s.cfg.TailMax
	}
	latency = lo
	if hi > lo {
		latency += time.Duration(s.rng.Int64N(int64(hi - lo + 1)))
	}
	fail = s.cfg.ErrorRate > 0 && s.rng.Float64() < s.cfg.ErrorRate
	return latency, tail, fail
}

// TaxStats counts the simulated service's calls.
type TaxStats struct {
	Calls, Tails, Failures int64
}

// Stats returns how many calls were made, took a tail latency, and failed.
func (s *SimulatedTax) Stats() TaxStats {
	return TaxStats{Calls: s.calls.Load(), Tails: s.tails.Load(), Failures: s.fails.Load()}
}
