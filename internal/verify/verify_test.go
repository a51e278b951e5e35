package verify_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/internal/verify"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/outbox"
)

type testBundle struct {
	db  *fenceqtest.DB
	ctx context.Context
}

func setup(t *testing.T, opts ...fenceqtest.Options) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	var o fenceqtest.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if !o.NoMigrate {
		o.Migrations = builtin.Migrations()
	}
	return &testBundle{db: fenceqtest.New(t, &o), ctx: ctx}
}

func (b *testBundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

func (b *testBundle) run(t *testing.T, o verify.Options) *verify.Report {
	t.Helper()
	rep, err := verify.Run(b.ctx, b.db.Pool, o)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return rep
}

func check(t *testing.T, rep *verify.Report, name string) verify.Check {
	t.Helper()
	c, ok := rep.Get(name)
	if !ok {
		t.Fatalf("report has no check %s", name)
	}
	return c
}

func TestCleanSchemaPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rep := b.run(t, verify.Options{})
	if !rep.Passed || rep.Violations != 0 {
		t.Fatalf("clean schema: passed=%v violations=%d: %+v", rep.Passed, rep.Violations, rep.Checks)
	}
	for _, c := range rep.Checks {
		if c.Skipped != "" {
			t.Errorf("check %s skipped on a migrated schema: %s", c.Name, c.Skipped)
		}
	}
}

func TestMissingTablesAreSkippedNotCrashed(t *testing.T) {
	t.Parallel()
	b := setup(t, fenceqtest.Options{NoMigrate: true})
	rep := b.run(t, verify.Options{})
	if len(rep.Checks) == 0 {
		t.Fatal("no checks reported")
	}
	for _, c := range rep.Checks {
		if c.Skipped == "" || !strings.Contains(c.Skipped, "does not exist") {
			t.Errorf("check %s: skipped = %q, want a missing-table reason", c.Name, c.Skipped)
		}
	}
}

// TestDetectsDuplicates proves the verifier can fail: with the unique constraints
// dropped, duplicate invoices and orders get in, and verify reports them.
func TestDetectsDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `ALTER TABLE invoices DROP CONSTRAINT invoices_customer_period_key`)
	b.exec(t, `ALTER TABLE orders DROP CONSTRAINT orders_idempotency_key_key`)
	b.exec(t, `INSERT INTO customers (id, name, email) VALUES (7, 'Ada', 'ada@example.com')`)
	for i := 0; i < 3; i++ {
		b.exec(t, `INSERT INTO invoices (customer_id, period, currency, subtotal_cents, tax_rate_micros, tax_cents,
			total_cents, job_id, lease_gen, leased_by) VALUES (7, '2026-01', 'USD', 100, 0, 0, 100, 1, $1, 'w')`, i+1)
	}
	for i := 0; i < 2; i++ {
		b.exec(t, `INSERT INTO orders (idempotency_key, request_hash, customer_email, currency, total_cents)
			VALUES ('key-1', '\x01', 'ada@example.com', 'EUR', 100)`)
	}
	rep := b.run(t, verify.Options{})
	if rep.Passed {
		t.Fatal("verify passed with duplicate invoices and orders")
	}
	inv := check(t, rep, verify.CheckDuplicateInvoices)
	if inv.Violations != 2 || len(inv.Examples) != 1 || !strings.Contains(inv.Examples[0], "customer 7, period 2026-01: 3 invoices") {
		t.Errorf("duplicate invoices: %+v, want 2 surplus invoices of customer 7", inv)
	}
	ord := check(t, rep, verify.CheckDuplicateOrders)
	if ord.Violations != 1 || !strings.Contains(ord.Examples[0], "key-1") {
		t.Errorf("duplicate orders: %+v, want 1 surplus order for key-1", ord)
	}
	// None of these rows has its email in the outbox.
	if n := check(t, rep, verify.CheckInvoiceEmails).Violations; n != 3 {
		t.Errorf("invoices without an outbox row: %d, want 3", n)
	}
	if n := check(t, rep, verify.CheckOrderEmails).Violations; n != 2 {
		t.Errorf("orders without an outbox row: %d, want 2", n)
	}
	if rep.Duplicates() != 3 {
		t.Errorf("Duplicates() = %d, want 3", rep.Duplicates())
	}
}

func TestOutboxRowPerInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `INSERT INTO customers (id, name, email) VALUES (1, 'Ada', 'ada@example.com')`)
	var id int64
	if err := b.db.Pool.QueryRow(b.ctx, `INSERT INTO invoices (customer_id, period, currency, subtotal_cents,
		tax_rate_micros, tax_cents, total_cents, job_id, lease_gen, leased_by)
		VALUES (1, '2026-02', 'USD', 100, 0, 0, 100, 1, 1, 'w') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if n := check(t, b.run(t, verify.Options{}), verify.CheckInvoiceEmails).Violations; n != 1 {
		t.Fatalf("invoice without email: %d violations, want 1", n)
	}
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Insert(b.ctx, tx, outbox.Message{Topic: "email",
		DedupeKey: verify.InvoiceEmailPrefix + strconv.FormatInt(id, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	rep := b.run(t, verify.Options{})
	if !rep.Passed {
		t.Fatalf("invoice with its email: %+v", rep.Checks)
	}
}

func TestExpiredLeaseAndLostJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Kind: "noop"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	rep := b.run(t, verify.Options{ExpectedJobs: []int64{id, id + 1000}, RequireFinal: true})
	exp := check(t, rep, verify.CheckExpectedJobs)
	if exp.Violations != 2 || !strings.Contains(strings.Join(exp.Examples, "|"), "missing") ||
		!strings.Contains(strings.Join(exp.Examples, "|"), "still available") {
		t.Errorf("expected jobs: %+v, want one missing and one still available", exp)
	}
	if rep.Lost() != 2 {
		t.Errorf("Lost() = %d, want 2", rep.Lost())
	}
	if n := check(t, b.run(t, verify.Options{RequireAllFinal: true}), verify.CheckUnfinishedJobs).Violations; n != 1 {
		t.Errorf("unfinished jobs: %d, want 1", n)
	}
	// The only unfinished job is a noop: ignoring that kind leaves nothing to report.
	if n := check(t, b.run(t, verify.Options{RequireAllFinal: true, IgnoreKinds: []string{"noop"}}), verify.CheckUnfinishedJobs).Violations; n != 0 {
		t.Errorf("unfinished jobs with kind noop ignored: %d, want 0", n)
	}

	// A running job whose lease expired a minute ago: the reaper should have taken it.
	b.exec(t, `UPDATE fenceq_jobs SET state = 'running', attempt = 1, lease_gen = 1, leased_by = 'ghost',
		lease_expires_at = now() - interval '1 minute' WHERE id = $1`, id)
	rep = b.run(t, verify.Options{ReaperInterval: 5 * time.Second})
	el := check(t, rep, verify.CheckExpiredLeases)
	if el.Violations != 1 || !strings.Contains(el.Examples[0], "ghost") {
		t.Errorf("expired lease: %+v, want job held by ghost", el)
	}
	// Within the reaper interval it is not a violation yet.
	b.exec(t, `UPDATE fenceq_jobs SET lease_expires_at = now() - interval '2 seconds' WHERE id = $1`, id)
	if n := check(t, b.run(t, verify.Options{ReaperInterval: 5 * time.Second}), verify.CheckExpiredLeases).Violations; n != 0 {
		t.Errorf("lease expired 2s ago with a 5s reaper: %d violations, want 0", n)
	}
}

func TestStrandedOutboxRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := outbox.Insert(b.ctx, tx, outbox.Message{Topic: "email", DedupeKey: "x:1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if rep := b.run(t, verify.Options{}); !rep.Passed {
		t.Fatalf("pending row with a live delivery job: %+v", rep.Checks)
	}
	if _, err := store.CancelJob(b.ctx, b.db.Pool, res.DeliveryJobID, "test"); err != nil {
		t.Fatal(err)
	}
	st := check(t, b.run(t, verify.Options{}), verify.CheckStrandedOutbox)
	if st.Violations != 1 || !strings.Contains(st.Examples[0], "cancelled") {
		t.Fatalf("stranded outbox row: %+v, want 1 with a cancelled delivery job", st)
	}
}
