package invoice_test

import (
	"sync"
	"testing"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/queue"
)

func TestSeedCustomers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids, err := invoice.SeedCustomers(b.ctx, b.db.Pool, 20, period)
	if err != nil || len(ids) != 20 {
		t.Fatalf("seed: %d ids, %v", len(ids), err)
	}
	if n := b.count(t, `SELECT count(DISTINCT customer_id) FROM usage_records WHERE period = $1 AND customer_id = ANY($2)`, period, ids); n != 20 {
		t.Fatalf("%d customers have usage, want 20", n)
	}
	if n := b.count(t, `SELECT count(*) FROM customers WHERE email = 'customer-' || id || '@example.com'`); n != 20 {
		t.Fatalf("%d customers have their derived address", n)
	}
	if _, err := invoice.SeedCustomers(b.ctx, b.db.Pool, 0, period); err == nil {
		t.Fatal("seeding 0 customers accepted")
	}
}

// Test 4: a billing run, run twice and concurrently from two processes, enqueues one
// job per customer and period; after the jobs completed, running it again enqueues
// nothing; a customer whose job was cancelled without an invoice is enqueued again.
func TestBillingRunIsIdempotentAcrossRunsAndProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const customers = 120
	if _, err := invoice.SeedCustomers(b.ctx, b.db.Pool, customers, period); err != nil {
		t.Fatal(err)
	}
	// Two "processes", each with its own pool, each running the billing twice, all at once.
	pools := []queue.Beginner{b.db.NewPool(t, 2), b.db.NewPool(t, 2)}
	var mu sync.Mutex
	var total int64
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := invoice.RunBilling(b.ctx, pools[i%2], period)
			if err != nil {
				t.Errorf("billing run %d: %v", i, err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total != customers {
		t.Fatalf("four concurrent runs enqueued %d jobs, want %d", total, customers)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice'`); n != customers {
		t.Fatalf("%d invoice jobs, want %d", n, customers)
	}
	if n := b.count(t, `SELECT count(*) FROM (SELECT unique_key FROM fenceq_jobs GROUP BY unique_key HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d unique keys have more than one job", n)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice' AND queue = $1
		AND unique_key = 'invoice:' || (args->>'customer_id') || ':' || (args->>'period')`, invoice.Queue); n != customers {
		t.Fatalf("%d jobs carry the right queue and unique key", n)
	}

	// An operator cancels one job before it runs: no invoice, so the next run enqueues it again.
	var cancelled int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT id FROM fenceq_jobs WHERE kind = 'invoice' ORDER BY id LIMIT 1`).Scan(&cancelled); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CancelJob(b.ctx, b.db.Pool, cancelled, "test"); err != nil {
		t.Fatal(err)
	}
	if n, err := invoice.RunBilling(b.ctx, b.db.Pool, period); err != nil || n != 1 {
		t.Fatalf("run after a cancellation enqueued %d (%v), want 1", n, err)
	}

	b.startWorker(t, workerOpts{id: "worker-A", tax: newTax(t, invoice.SimulatedTaxConfig{}), slots: 8})
	fenceqtest.WaitFor(t, "every invoice", patience, func() bool {
		return b.count(t, `SELECT count(*) FROM invoices WHERE period = $1`, period) == customers
	})
	fenceqtest.WaitFor(t, "every invoice job to complete", patience, func() bool {
		return b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice' AND state = 'completed'`) == customers
	})
	for range 2 {
		if n, err := invoice.RunBilling(b.ctx, b.db.Pool, period); err != nil || n != 0 {
			t.Fatalf("run after completion enqueued %d (%v), want 0", n, err)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice'`); n != customers+1 {
		t.Fatalf("%d invoice jobs, want %d (one per customer plus the cancelled one)", n, customers+1)
	}
	// Another period is a separate run.
	if n, err := invoice.RunBilling(b.ctx, b.db.Pool, "2025-02"); err != nil || n != customers {
		t.Fatalf("run for the next period enqueued %d (%v), want %d", n, err, customers)
	}
}

func TestRegisterAndEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hs := fenceq.NewHandlers()
	tax := newTax(t, invoice.SimulatedTaxConfig{})
	for name, cfg := range map[string]invoice.Config{
		"NoPool":  {Tax: tax},
		"NoTax":   {Pool: b.db.Pool},
		"BadFrom": {Pool: b.db.Pool, Tax: tax, From: "not an address"},
	} {
		if err := invoice.Register(hs, cfg); err == nil {
			t.Errorf("%s: config accepted", name)
		}
	}
	if err := invoice.Register(hs, invoice.Config{Pool: b.db.Pool, Tax: tax, From: "Billing <billing@example.com>"}); err != nil {
		t.Fatal(err)
	}
	// Enqueueing the same customer and period twice, through either door, gives one job.
	first, err := invoice.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: 7, Period: period})
	if err != nil || first.Existing {
		t.Fatalf("first enqueue: %+v %v", first, err)
	}
	second, err := fenceq.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: 7, Period: period}, nil)
	if err != nil || !second.Existing || second.Job.ID != first.Job.ID || second.Job.Queue != invoice.Queue {
		t.Fatalf("second enqueue: %+v %v", second, err)
	}
	if key := first.Job.UniqueKey; key == nil || *key != invoice.UniqueKey(7, period) || *key != "invoice:7:2025-01" {
		t.Fatalf("unique key %v", key)
	}
}
