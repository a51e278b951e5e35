package invoice_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/email/emailtest"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

const period = "2025-01"

// patience bounds each wait for the workers' progress. It is long, so that only a run
// that is stuck fails, never one that a loaded machine slows down: the leases of these
// tests are short, and an attempt cut by its lease is retried.
const patience = 3 * time.Minute

type testBundle struct {
	db      *fenceqtest.DB
	ctx     context.Context
	smtp    *emailtest.Server
	mailer  *email.SMTPMailer
	metrics *invoiceMetrics
	// outcomes records what every invoice handler attempt returned, by worker.
	outcomes *outcomes
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	// The test's own context: its workers and queries last as long as the test does,
	// however slowly a loaded machine runs it.
	b := &testBundle{db: fenceqtest.New(t, &fenceqtest.Options{MaxConns: 4, Migrations: []migrations.Set{migrations.Core(), invoice.Migrations()}}), ctx: t.Context(), metrics: &invoiceMetrics{}, outcomes: &outcomes{}}
	b.smtp = emailtest.Start(t)
	m, err := email.NewSMTPMailer(email.SMTPConfig{Addr: b.smtp.Addr, From: "Billing <billing@example.com>",
		StartTLS: email.StartTLSOff, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b.mailer = m
	return b
}

type invoiceMetrics struct {
	created, existing, unique, stale, taxFailed atomic.Int64
}

func (m *invoiceMetrics) InvoiceCreated() { m.created.Add(1) }
func (m *invoiceMetrics) DuplicatePrevented(how string) {
	switch how {
	case invoice.DuplicateExistingInvoice:
		m.existing.Add(1)
	case invoice.DuplicateUniqueConstraint:
		m.unique.Add(1)
	default:
		panic("unknown duplicate kind " + how)
	}
}
func (m *invoiceMetrics) StaleWriteRejected() { m.stale.Add(1) }
func (m *invoiceMetrics) TaxFailed()          { m.taxFailed.Add(1) }

type outcome struct {
	Worker string
	Lease  queue.Lease
	Args   invoice.Args
	Err    error
}

type outcomes struct {
	mu  sync.Mutex
	all []outcome
}

func (o *outcomes) add(x outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all = append(o.all, x)
}

func (o *outcomes) list() []outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]outcome(nil), o.all...)
}

// leaseLost returns the attempts whose commit the database rejected as stale.
func (o *outcomes) leaseLost() []outcome {
	var out []outcome
	for _, x := range o.list() {
		if errors.Is(x.Err, queue.ErrLeaseLost) {
			out = append(out, x)
		}
	}
	return out
}

type workerOpts struct {
	id    string
	pool  *pgxpool.Pool
	tax   invoice.TaxService
	lease time.Duration
	// slots for the billing queue; defaults to 4.
	slots int
}

// startWorker runs a worker serving the billing queue (invoice handler, wrapped to
// record outcomes) and the outbox queue (the email relay), like `fenceq worker` does.
func (b *testBundle) startWorker(t *testing.T, o workerOpts) *fenceq.Worker {
	t.Helper()
	if o.pool == nil {
		o.pool = b.db.NewPool(t, 4)
	}
	if o.lease == 0 {
		o.lease = 2 * time.Second
	}
	if o.slots == 0 {
		o.slots = 4
	}
	backoff := &queue.Backoff{Base: 50 * time.Millisecond, Max: 300 * time.Millisecond}
	hs := fenceq.NewHandlers()
	h, err := invoice.Handler(invoice.Config{Pool: o.pool, Tax: o.tax, Logger: fenceqtest.QuietLogger(), Metrics: b.metrics})
	if err != nil {
		t.Fatalf("invoice handler: %v", err)
	}
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[invoice.Args]) error {
		err := h(ctx, job)
		b.outcomes.add(outcome{Worker: o.id, Lease: job.Lease(), Args: job.Args, Err: err})
		return err
	}, &fenceq.HandlerOpts{Backoff: backoff})
	if _, err := email.RegisterRelay(hs, outbox.RelayConfig{Pool: o.pool, Logger: fenceqtest.QuietLogger(), Backoff: backoff},
		email.DelivererConfig{Mailer: b.mailer}); err != nil {
		t.Fatalf("relay: %v", err)
	}
	return fenceqtest.StartWorker(b.ctx, t, o.pool, fenceq.Config{
		Handlers: hs, ID: o.id, LeaseDuration: o.lease, ReaperInterval: o.lease / 4,
		PollInterval: 50 * time.Millisecond, Logger: fenceqtest.QuietLogger(), Backoff: *backoff,
		Queues: map[string]fenceq.QueueConfig{invoice.Queue: {MaxWorkers: o.slots}, outbox.Queue: {MaxWorkers: 2}},
	})
}

func newTax(t *testing.T, cfg invoice.SimulatedTaxConfig) *invoice.SimulatedTax {
	t.Helper()
	tax, err := invoice.NewSimulatedTax(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tax
}

func (b *testBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// checkInvariants asserts the billing outcome, for every customer with
// usage: exactly one invoice, written by the lease that completed its job, with exact
// totals; exactly one email outbox row, delivered; and exactly one message per invoice
// after the receiver's dedupe by Message-ID.
func (b *testBundle) checkInvariants(t *testing.T, customers int) {
	t.Helper()
	if n := b.count(t, `SELECT count(*) FROM invoices WHERE period = $1`, period); n != int64(customers) {
		t.Fatalf("%d invoices, want %d", n, customers)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'invoice'`); n != int64(customers) {
		t.Fatalf("%d invoice jobs, want one per customer (%d)", n, customers)
	}
	// Each invoice was written by the lease that completed its job.
	if n := b.count(t, `SELECT count(*) FROM invoices i JOIN fenceq_jobs j ON j.id = i.job_id
		WHERE j.state = 'completed' AND j.lease_gen = i.lease_gen AND j.leased_by = i.leased_by
		  AND j.unique_key = 'invoice:' || i.customer_id || ':' || i.period`); n != int64(customers) {
		t.Fatalf("%d of %d invoices carry the job id and lease generation that completed their job", n, customers)
	}
	// Exact totals, recomputed independently with numeric arithmetic.
	if n := b.count(t, `
		WITH u AS (
			SELECT customer_id, period, sum(quantity * unit_price_cents) AS subtotal
			FROM usage_records GROUP BY customer_id, period),
		l AS (SELECT invoice_id, sum(amount_cents) AS lines FROM invoice_lines GROUP BY invoice_id)
		SELECT count(*) FROM invoices i JOIN u ON u.customer_id = i.customer_id AND u.period = i.period
		JOIN l ON l.invoice_id = i.id
		WHERE i.subtotal_cents = u.subtotal AND l.lines = u.subtotal
		  AND i.tax_cents = round(u.subtotal::numeric * i.tax_rate_micros / 1000000)
		  AND i.total_cents = i.subtotal_cents + i.tax_cents`); n != int64(customers) {
		t.Fatalf("%d of %d invoices have exact totals", n, customers)
	}
	for country, rate := range invoice.DefaultTaxRates {
		if n := b.count(t, `SELECT count(*) FROM invoices i JOIN customers c ON c.id = i.customer_id
			WHERE c.country = $1 AND i.tax_rate_micros <> $2`, country, rate); n != 0 {
			t.Fatalf("%d invoices of %s customers have a tax rate other than %d", n, country, rate)
		}
	}
	// One email row per invoice, delivered.
	if n := b.count(t, `SELECT count(*) FROM fenceq_outbox`); n != int64(customers) {
		t.Fatalf("%d outbox rows, want %d", n, customers)
	}
	var ids []int64
	rows, err := b.db.Pool.Query(b.ctx, `SELECT i.id FROM invoices i JOIN fenceq_outbox o
		ON o.dedupe_key = 'invoice-email:' || i.id AND o.topic = 'email' AND o.state = 'delivered'`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) != customers {
		t.Fatalf("%d delivered invoice emails, want %d (%v)", len(ids), customers, err)
	}
	// The receiver, deduplicating by Message-ID, sees exactly one message per invoice.
	deduped := b.smtp.Deduped()
	if len(deduped) != customers {
		t.Fatalf("receiver kept %d messages after dedupe, want %d", len(deduped), customers)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[email.MessageIDFor(invoice.EmailDedupeKey(id), "")] = true
	}
	for _, r := range deduped {
		if !want[r.MessageID] {
			t.Fatalf("received Message-ID %s belongs to no invoice", r.MessageID)
		}
		delete(want, r.MessageID)
	}
	if len(want) != 0 {
		t.Fatalf("%d invoices' emails never arrived", len(want))
	}
}

// notCutByLease returns the job's attempt errors other than those of attempts cut by
// their lease: by the worker's local deadline (a heartbeat not confirmed in time on a
// loaded machine) or revoked by a reaper. Such an attempt is retried, so the tests
// allow it and assert what the other attempts did.
func notCutByLease(j *queue.JobRow) []queue.AttemptError {
	var out []queue.AttemptError
	for _, e := range j.Errors {
		if !strings.Contains(e.Error, fenceq.ErrLeaseDeadline.Error()) && !strings.HasPrefix(e.Error, "lease expired") {
			out = append(out, e)
		}
	}
	return out
}

// undelivered describes the outbox rows not delivered, each with its delivery job, for
// a failure message.
func (b *testBundle) undelivered(t *testing.T) string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT format('row %s (%s) %s, attempt %s, last error %s; delivery job %s: %s, attempt %s of %s, errors %s',
			o.id, o.dedupe_key, o.state, o.attempt, COALESCE(o.last_error, 'none'), COALESCE(o.delivery_job_id::text, 'none'),
			COALESCE(j.state::text, 'not found'), j.attempt, j.max_attempts, COALESCE(j.errors::text, 'none'))
		FROM fenceq_outbox o LEFT JOIN fenceq_jobs j ON j.id = o.delivery_job_id
		WHERE o.state <> 'delivered' ORDER BY o.id`)
	if err != nil {
		return "cannot read them: " + err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "cannot read them: " + err.Error()
	}
	return strings.Join(lines, "\n")
}

// retryExhaustedEmails is called once every job has ended while some emails are not
// delivered. It retries (outbox.Retry, as an operator would) each undelivered row
// whose delivery job was discarded after using every attempt, and returns how many it
// retried. Any other undelivered row fails the test with the rows described: a
// delivery job that ended before its last attempt without delivering is a defect.
func (b *testBundle) retryExhaustedEmails(t *testing.T) int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT o.id FROM fenceq_outbox o JOIN fenceq_jobs j ON j.id = o.delivery_job_id
		WHERE o.state <> 'delivered' AND j.state = 'discarded' AND j.attempt >= j.max_attempts`)
	if err != nil {
		t.Fatalf("undelivered emails: %v", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("undelivered emails: %v", err)
	}
	if len(ids) == 0 {
		t.Fatalf("every job ended, but emails are undelivered without their delivery job using up its attempts:\n%s",
			b.undelivered(t))
	}
	t.Logf("retrying emails whose delivery used up its attempts:\n%s", b.undelivered(t))
	for _, id := range ids {
		if _, err := outbox.Retry(b.ctx, b.db.Pool, id); err != nil {
			t.Fatalf("retry outbox row %d: %v", id, err)
		}
	}
	return int64(len(ids))
}
