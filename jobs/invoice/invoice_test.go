package invoice_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/queue"
)

// Test 1: the incident, replayed. Worker A's invoice handler blocks past its lease
// inside the tax call (its process is frozen: no heartbeat reaches the database); the
// reaper revokes A's lease; worker B re-runs the invoice and commits; A resumes and its
// commit is rejected by the database with ErrLeaseLost. One invoice, one outbox row,
// one delivered email.
func TestPausedHolderReplayOfTheIncident(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids, err := invoice.SeedCustomers(b.ctx, b.db.Pool, 1, period)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := invoice.RunBilling(b.ctx, b.db.Pool, period); err != nil || n != 1 {
		t.Fatalf("billing run: %d %v", n, err)
	}
	lease := time.Second

	entered := make(chan struct{})
	resume := make(chan struct{})
	var resumeOnce sync.Once
	t.Cleanup(func() { resumeOnce.Do(func() { close(resume) }) })
	taxA := newTax(t, invoice.SimulatedTaxConfig{MinLatency: 10 * time.Millisecond, MaxLatency: 20 * time.Millisecond,
		Hook: func(context.Context, invoice.TaxCall) error {
			close(entered)
			<-resume // frozen: ignores its context, as a stopped process would
			return nil
		}})
	poolA, cutA := b.db.PartitionedPool(t, 4)
	b.startWorker(t, workerOpts{id: "worker-A", pool: poolA, tax: taxA, lease: lease})

	select {
	case <-entered:
	case <-time.After(patience):
		t.Fatal("worker A never called the tax service")
	}
	cutA.Store(true) // A is paused: nothing it does reaches the database
	var jobID, genA int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT id, lease_gen FROM fenceq_jobs WHERE kind = 'invoice' AND leased_by = 'worker-A' AND state = 'running'`).
		Scan(&jobID, &genA); err != nil {
		t.Fatalf("A's lease: %v", err)
	}

	// B takes over once A's lease expires, and commits the invoice.
	b.startWorker(t, workerOpts{id: "worker-B", tax: newTax(t, invoice.SimulatedTaxConfig{}), lease: lease})
	fenceqtest.WaitFor(t, "B's invoice", patience, func() bool {
		return b.count(t, `SELECT count(*) FROM invoices WHERE customer_id = $1`, ids[0]) == 1
	})
	var writer string
	var genB, invJob int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT leased_by, lease_gen, job_id FROM invoices WHERE customer_id = $1`, ids[0]).
		Scan(&writer, &genB, &invJob); err != nil {
		t.Fatal(err)
	}
	if writer != "worker-B" || genB <= genA || invJob != jobID {
		t.Fatalf("invoice written by %s at generation %d of job %d; want worker-B above A's generation %d of job %d",
			writer, genB, invJob, genA, jobID)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND lease_gen = $2 AND kind = 'revoked'`, jobID, genA); n != 1 {
		t.Fatalf("%d revoked events for A's lease, want 1", n)
	}

	// A resumes: the tax call returns, A computes the invoice and tries to commit it.
	// The attempt awaited is the paused one (generation genA): on a busy machine an
	// earlier attempt of A may have ended already, its local lease deadline passed
	// before it reached the tax call.
	cutA.Store(false)
	resumeOnce.Do(func() { close(resume) })
	fenceqtest.WaitFor(t, "A's paused attempt to end", patience, func() bool {
		for _, o := range b.outcomes.list() {
			if o.Worker == "worker-A" && o.Lease.Gen == genA {
				return true
			}
		}
		return false
	})
	lost := b.outcomes.leaseLost()
	if len(lost) != 1 || lost[0].Worker != "worker-A" || lost[0].Lease.Gen != genA {
		t.Fatalf("attempts rejected with ErrLeaseLost: %+v; want exactly A's at generation %d (all attempts: %+v)",
			lost, genA, b.outcomes.list())
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_lease_events
		WHERE job_id = $1 AND lease_gen = $2 AND worker_id = 'worker-A' AND kind = 'stale_write_rejected'`, jobID, genA); n < 1 {
		t.Fatal("no stale_write_rejected event for A's generation")
	}
	if got := b.metrics.stale.Load(); got != 1 {
		t.Fatalf("stale writes counted: %d, want 1", got)
	}

	fenceqtest.WaitFor(t, "the invoice email", patience, func() bool {
		return b.count(t, `SELECT count(*) FROM fenceq_outbox WHERE state = 'delivered'`) == 1
	})
	b.checkInvariants(t, 1)
	if n := len(b.smtp.Received()); n != 1 {
		t.Fatalf("server accepted %d messages, want exactly 1", n)
	}
	if got := b.metrics.created.Load(); got != 1 {
		t.Fatalf("invoices created: %d, want 1", got)
	}
}

// pauser freezes one worker the way a stop-the-world pause does: its database access is
// cut and every tax call of its handlers blocks until the pause ends.
type pauser struct {
	b      *testBundle
	t      *testing.T
	worker string
	cut    *atomic.Bool
	active *atomic.Int64 // pauses in progress across all workers
	lease  time.Duration

	mu     sync.Mutex
	paused chan struct{} // closed when the current pause ends; nil when running
	rng    *rand.Rand
	count  int
}

// hook is the worker's tax hook: the first call of the whole test (forced) and then a
// few random calls pause the worker inside the tax call, after the API answered.
func (p *pauser) hook(forced *atomic.Bool) func(context.Context, invoice.TaxCall) error {
	return func(_ context.Context, c invoice.TaxCall) error {
		p.mu.Lock()
		if ch := p.paused; ch != nil {
			p.mu.Unlock()
			<-ch // the whole process is frozen, this handler too
			return nil
		}
		start := forced.CompareAndSwap(false, true) || (p.rng.Float64() < 0.04 && p.active.Load() < 3)
		if !start {
			p.mu.Unlock()
			return nil
		}
		ch := make(chan struct{})
		p.paused = ch
		p.count++
		p.active.Add(1)
		p.cut.Store(true)
		p.mu.Unlock()

		// Frozen at least 1.5 leases, and until the lease of this job was revoked (the
		// reaper of a live worker does it), so that the commit after the pause is stale.
		key := invoice.UniqueKey(c.Request.CustomerID, c.Request.Period)
		minEnd := time.Now().Add(p.lease * 3 / 2)
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			var held bool
			err := p.b.db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM fenceq_jobs
				WHERE unique_key = $1 AND state = 'running' AND leased_by = $2)`, key, p.worker).Scan(&held)
			if err != nil {
				p.t.Errorf("pauser: %v", err)
				break
			}
			if !held && time.Now().After(minEnd) {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
		p.mu.Lock()
		p.cut.Store(false)
		p.paused = nil
		p.active.Add(-1)
		close(ch)
		p.mu.Unlock()
		return nil
	}
}

// Test 2: 8 workers, 200 customers, a tax API with a latency tail longer than the lease
// and occasional errors, and workers that freeze past their lease at random. Every
// customer ends with one invoice (exact totals) and one delivered email, and the
// database rejected stale writes along the way.
func TestEightWorkersTwoHundredCustomersWithPausesAndSlowTax(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const customers = 200
	const workers = 8
	lease := time.Second
	if _, err := invoice.SeedCustomers(b.ctx, b.db.Pool, customers, period); err != nil {
		t.Fatal(err)
	}
	var forced atomic.Bool
	var active atomic.Int64
	var taxes []*invoice.SimulatedTax
	var pausers []*pauser
	for i := range workers {
		id := fmt.Sprintf("worker-%d", i+1)
		pool, cut := b.db.PartitionedPool(t, 4)
		p := &pauser{b: b, t: t, worker: id, cut: cut, active: &active, lease: lease, rng: rand.New(rand.NewPCG(uint64(i), 42))}
		tax := newTax(t, invoice.SimulatedTaxConfig{
			MinLatency: 20 * time.Millisecond, MaxLatency: 150 * time.Millisecond,
			TailProbability: 0.06, TailMin: 2 * lease, TailMax: 5 * lease,
			ErrorRate: 0.03, Seed: uint64(100 + i), Hook: p.hook(&forced),
		})
		taxes = append(taxes, tax)
		pausers = append(pausers, p)
		b.startWorker(t, workerOpts{id: id, pool: pool, tax: tax, lease: lease})
	}
	if n, err := invoice.RunBilling(b.ctx, b.db.Pool, period); err != nil || n != customers {
		t.Fatalf("billing run: %d %v", n, err)
	}

	// Wait for as long as jobs keep finishing: a busy machine slows the run down, and only
	// patience without any job finishing or email delivered fails it.
	// An email whose delivery job used up every attempt (each cut by its 1 s lease on a
	// loaded machine) is retried as an operator would; any other undelivered email fails
	// the test.
	var progress, retried int64
	since := time.Now()
	for {
		unfinished := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE state NOT IN ('completed', 'discarded', 'cancelled')`)
		delivered := b.count(t, `SELECT count(*) FROM fenceq_outbox WHERE state = 'delivered'`)
		if unfinished == 0 && delivered == customers {
			break
		}
		if unfinished == 0 {
			retried += b.retryExhaustedEmails(t)
			continue
		}
		if p := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE state IN ('completed', 'discarded', 'cancelled')`) + delivered; p > progress {
			progress, since = p, time.Now()
		} else if time.Since(since) > patience {
			t.Fatalf("no job finished and no email was delivered for %s: %d jobs unfinished, %d of %d emails delivered; undelivered:\n%s",
				patience, unfinished, delivered, customers, b.undelivered(t))
		}
		time.Sleep(fenceqtest.PollEvery)
	}

	// Proof that the faults happened before claiming that nothing went wrong.
	var tails, pauses int64
	for i := range workers {
		tails += taxes[i].Stats().Tails
		pausers[i].mu.Lock()
		pauses += int64(pausers[i].count)
		pausers[i].mu.Unlock()
	}
	lost := b.outcomes.leaseLost()
	staleEvents := b.count(t, `SELECT count(*) FROM fenceq_lease_events WHERE kind = 'stale_write_rejected'`)
	revoked := b.count(t, `SELECT count(*) FROM fenceq_lease_events WHERE kind = 'revoked'`)
	t.Logf("tax tails %d, pauses %d, revoked leases %d, stale writes rejected %d (handler saw ErrLeaseLost %d), tax failures %d, duplicate emails deduped %d, emails retried after their attempts ran out %d",
		tails, pauses, revoked, staleEvents, len(lost), b.metrics.taxFailed.Load(), len(b.smtp.Received())-len(b.smtp.Deduped()), retried)
	if tails == 0 || pauses == 0 || revoked == 0 || staleEvents == 0 || len(lost) == 0 {
		t.Fatalf("the faults did not all happen: tails %d, pauses %d, revoked %d, stale events %d, stale commits %d",
			tails, pauses, revoked, staleEvents, len(lost))
	}
	if b.metrics.stale.Load() != int64(len(lost)) {
		t.Fatalf("stale metric %d, handler outcomes %d", b.metrics.stale.Load(), len(lost))
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice' AND state <> 'completed'`); n != 0 {
		t.Fatalf("%d invoice jobs did not complete", n)
	}
	b.checkInvariants(t, customers)
	// No stale holder's commit landed: each rejected attempt's generation is below the
	// one that wrote the invoice.
	for _, o := range lost {
		var gen int64
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT lease_gen FROM invoices WHERE job_id = $1`, o.Lease.JobID).Scan(&gen); err != nil {
			t.Fatal(err)
		}
		if gen <= o.Lease.Gen {
			t.Fatalf("job %d: invoice at generation %d, stale attempt at %d", o.Lease.JobID, gen, o.Lease.Gen)
		}
	}
}

// UNIQUE (customer_id, period) is the last line of defence: two jobs for one customer
// and period (enqueued around the billing run's unique key) both reach their commit;
// the second finds the invoice, writes no second email row, and completes.
func TestUniqueConstraintIsTheLastLineOfDefence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids, err := invoice.SeedCustomers(b.ctx, b.db.Pool, 1, period)
	if err != nil {
		t.Fatal(err)
	}
	var jobs []int64
	for range 2 {
		res, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Queue: invoice.Queue, Kind: invoice.Kind,
			Args: fmt.Appendf(nil, `{"customer_id": %d, "period": %q}`, ids[0], period)})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, res.Job.ID)
	}
	// Both attempts wait in the tax call until both are there: both passed the
	// existing-invoice check, so only the constraint can stop the second.
	var arrived sync.WaitGroup
	arrived.Add(2)
	tax := newTax(t, invoice.SimulatedTaxConfig{Hook: func(context.Context, invoice.TaxCall) error {
		arrived.Done()
		arrived.Wait()
		return nil
	}})
	b.startWorker(t, workerOpts{id: "worker-A", tax: tax})
	fenceqtest.WaitFor(t, "both jobs to complete", patience, func() bool {
		return b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE id = ANY($1) AND state = 'completed'`, jobs) == 2
	})
	if n := b.count(t, `SELECT count(*) FROM invoices`); n != 1 {
		t.Fatalf("%d invoices, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_outbox`); n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
	// The handler counts its outcome after its commit returns, so after the job's state
	// is visible: wait for both counts before reading them.
	fenceqtest.WaitFor(t, "both attempts to count their outcome", patience, func() bool {
		return b.metrics.created.Load()+b.metrics.unique.Load()+b.metrics.existing.Load() == 2
	})
	if b.metrics.unique.Load() != 1 || b.metrics.created.Load() != 1 {
		t.Fatalf("created %d, prevented by the constraint %d, existing %d; want 1, 1 and 0",
			b.metrics.created.Load(), b.metrics.unique.Load(), b.metrics.existing.Load())
	}
	fenceqtest.WaitFor(t, "the email", patience, func() bool { return len(b.smtp.Deduped()) == 1 })
}

// Test 5: bad input and failing dependencies.
func TestBadInputAndFailingDependencies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids, err := invoice.SeedCustomers(b.ctx, b.db.Pool, 3, period)
	if err != nil {
		t.Fatal(err)
	}
	flaky, bounced, healthy := ids[0], ids[1], ids[2]
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE customers SET email = 'nobody@example.com' WHERE id = $1`, bounced); err != nil {
		t.Fatal(err)
	}
	b.smtp.RejectRecipient("nobody@example.com", 550, "no such user", -1)

	var flakyCalls atomic.Int64
	tax := newTax(t, invoice.SimulatedTaxConfig{Hook: func(_ context.Context, c invoice.TaxCall) error {
		if c.Request.CustomerID == flaky && flakyCalls.Add(1) <= 2 {
			return invoice.ErrTaxUnavailable
		}
		return nil
	}})
	b.startWorker(t, workerOpts{id: "worker-A", tax: tax})

	t.Run("MalformedPeriod", func(t *testing.T) {
		for _, bad := range []string{"2025-1", "2025-13", "01-2025", ""} {
			if _, err := invoice.RunBilling(b.ctx, b.db.Pool, bad); !errors.Is(err, queue.ErrInvalid) || !strings.Contains(err.Error(), "period") {
				t.Errorf("billing run for %q: %v", bad, err)
			}
			if _, err := invoice.SeedCustomers(b.ctx, b.db.Pool, 1, bad); !errors.Is(err, queue.ErrInvalid) {
				t.Errorf("seed for %q: %v", bad, err)
			}
			if _, err := invoice.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: healthy, Period: bad}); !errors.Is(err, queue.ErrInvalid) {
				t.Errorf("enqueue with period %q: %v", bad, err)
			}
		}
		// A job that got in anyway (written by hand) is discarded, not retried.
		res, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Queue: invoice.Queue, Kind: invoice.Kind,
			Args: []byte(`{"customer_id": 1, "period": "2025-1"}`)})
		if err != nil {
			t.Fatal(err)
		}
		j := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateDiscarded, patience)
		if other := notCutByLease(j); int(j.Attempt) != len(j.Errors) || len(other) != 1 ||
			other[0].Attempt != int(j.Attempt) || !strings.Contains(other[0].Error, "period") {
			t.Fatalf("job with a malformed period: %+v; want it discarded by the first attempt that validated its args", j)
		}
	})

	t.Run("UnknownCustomer", func(t *testing.T) {
		if _, err := invoice.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: 0, Period: period}); !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("enqueue for customer 0: %v", err)
		}
		res, err := invoice.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: 987654, Period: period})
		if err != nil {
			t.Fatal(err)
		}
		j := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateDiscarded, patience)
		// Discarded by the first attempt that reached the lookup's answer: an attempt
		// before it can only have been cut by its lease (a heartbeat not confirmed in
		// time on a loaded machine), never retried after the answer.
		if other := notCutByLease(j); int(j.Attempt) != len(j.Errors) || len(other) != 1 ||
			other[0].Attempt != int(j.Attempt) || !strings.Contains(other[0].Error, "customer 987654: unknown customer") {
			t.Fatalf("job for an unknown customer: %+v; want it discarded by the first attempt that got the lookup's answer", j)
		}
		if n := b.count(t, `SELECT count(*) FROM invoices WHERE customer_id = 987654`); n != 0 {
			t.Fatal("invoice written for an unknown customer")
		}
	})

	t.Run("TaxErrorsAreRetried", func(t *testing.T) {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: flaky, Period: period}, nil)
		if err != nil {
			t.Fatal(err)
		}
		j := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, patience)
		other := notCutByLease(j)
		if int(j.Attempt) != len(j.Errors)+1 || len(other) != 2 ||
			!strings.Contains(other[0].Error, "tax service unavailable") || !strings.Contains(other[1].Error, "tax service unavailable") {
			t.Fatalf("job after two tax failures: attempt %d, errors %+v; want two tax failures, each retried", j.Attempt, j.Errors)
		}
		if n := b.count(t, `SELECT count(*) FROM invoices WHERE customer_id = $1`, flaky); n != 1 {
			t.Fatalf("%d invoices", n)
		}
	})

	t.Run("RecipientPermanentlyRejected", func(t *testing.T) {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: bounced, Period: period}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, patience)
		var state, lastErr string
		fenceqtest.WaitFor(t, "the bounced email to fail", patience, func() bool {
			err := b.db.Pool.QueryRow(b.ctx, `SELECT o.state, COALESCE(o.last_error, '') FROM fenceq_outbox o
				JOIN invoices i ON o.dedupe_key = 'invoice-email:' || i.id WHERE i.customer_id = $1`, bounced).Scan(&state, &lastErr)
			return err == nil && state == "failed"
		})
		if !strings.Contains(lastErr, "550") || !strings.Contains(lastErr, "nobody@example.com") {
			t.Fatalf("failed row's reason: %q", lastErr)
		}
	})

	t.Run("RetriedCompletedJobWritesNothing", func(t *testing.T) {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, invoice.Args{CustomerID: healthy, Period: period}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, patience)
		before := b.metrics.existing.Load()
		if _, err := store.RetryJob(b.ctx, b.db.Pool, res.Job.ID); err != nil {
			t.Fatal(err)
		}
		fenceqtest.WaitFor(t, "the retried job to complete again", patience, func() bool { return b.metrics.existing.Load() == before+1 })
		fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, patience)
		if n := b.count(t, `SELECT count(*) FROM fenceq_outbox o JOIN invoices i ON o.dedupe_key = 'invoice-email:' || i.id
			WHERE i.customer_id = $1`, healthy); n != 1 {
			t.Fatalf("%d email rows after the retry, want 1", n)
		}
	})
}
