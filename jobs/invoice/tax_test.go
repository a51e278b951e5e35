package invoice_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenceq/fenceq/jobs/invoice"
)

func TestSimulatedTaxDistributionErrorsAndHook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tax, err := invoice.NewSimulatedTax(invoice.SimulatedTaxConfig{TailProbability: 0.3, ErrorRate: 0.2, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	var failures int
	for range 500 {
		q, err := tax.Quote(ctx, invoice.TaxRequest{Country: "DE", SubtotalCents: 100})
		switch {
		case errors.Is(err, invoice.ErrTaxUnavailable):
			failures++
		case err != nil:
			t.Fatal(err)
		case q.RateMicros != 190_000 || q.Jurisdiction != "DE" || q.Reference == "":
			t.Fatalf("quote %+v", q)
		}
	}
	st := tax.Stats()
	if st.Calls != 500 || st.Failures != int64(failures) || failures < 60 || failures > 140 || st.Tails < 100 || st.Tails > 200 {
		t.Fatalf("stats %+v (failures %d): drawn frequencies far from the configured 0.3 tail and 0.2 errors", st, failures)
	}

	// The hook sees each call after its latency and can fail it.
	var seen []int64
	hooked, err := invoice.NewSimulatedTax(invoice.SimulatedTaxConfig{MinLatency: time.Millisecond, MaxLatency: 2 * time.Millisecond,
		DefaultRateMicros: 1234, Hook: func(_ context.Context, c invoice.TaxCall) error {
			seen = append(seen, c.N)
			if c.Latency < time.Millisecond || c.Latency > 2*time.Millisecond {
				t.Errorf("latency %s outside the configured range", c.Latency)
			}
			if c.N == 2 {
				return invoice.ErrTaxUnavailable
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if q, err := hooked.Quote(ctx, invoice.TaxRequest{Country: "ZZ"}); err != nil || q.RateMicros != 1234 {
		t.Fatalf("call 1: %+v %v", q, err)
	}
	if _, err := hooked.Quote(ctx, invoice.TaxRequest{Country: "US"}); !errors.Is(err, invoice.ErrTaxUnavailable) {
		t.Fatalf("call 2: %v", err)
	}
	if len(seen) != 2 || seen[0] != 1 || seen[1] != 2 {
		t.Fatalf("hook saw calls %v", seen)
	}

	// A call in its latency returns when its context ends.
	slow, err := invoice.NewSimulatedTax(invoice.SimulatedTaxConfig{TailProbability: 1, TailMin: time.Hour, TailMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := slow.Quote(cctx, invoice.TaxRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}

	for name, cfg := range map[string]invoice.SimulatedTaxConfig{
		"Range":       {MinLatency: 2, MaxLatency: 1},
		"Tail":        {TailMin: 3, TailMax: 2},
		"Probability": {ErrorRate: 1.5},
		"Rate":        {Rates: map[string]int64{"XX": 2_000_000}},
	} {
		if _, err := invoice.NewSimulatedTax(cfg); err == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
	}
}
