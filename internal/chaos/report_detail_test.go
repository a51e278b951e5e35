package chaos

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/outbox"
)

// TestReportNamesWhatWasLost builds one of each thing a run can lose besides jobs (a
// revoked lease never run again, a customer without an invoice, a key without an order,
// a failed outbox row, an email not received) and checks that the report names each.
func TestReportNamesWhatWasLost(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t, EnvConfig{Workers: 1})
	ctx := t.Context()
	db := env.Pool

	customers, err := invoice.SeedCustomers(ctx, db, 1, "2025-01")
	if err != nil {
		t.Fatal(err)
	}
	job, err := fenceq.Enqueue(ctx, db, diag.NoopArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
		VALUES ($1, 1, 'w-test', 'revoked', 'test')`, job.Job.ID); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	row, err := outbox.Insert(ctx, tx, outbox.Message{Topic: "email", DedupeKey: "lost-row", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE fenceq_outbox SET state = 'failed', last_error = 'refused by the test' WHERE id = $1`, row.ID); err != nil {
		t.Fatal(err)
	}

	r := &Report{LostDetail: map[string]int64{"revoked_never_rerun": 1, "outbox_undelivered": 1},
		Invoices: Counts{Missing: 1}, Orders: Counts{Missing: 1}}
	r.Emails.notReceived = []string{"outbox row with dedupe key gone: delivered, but no mail file holds its email"}
	wl := &Workload{cfg: WorkloadConfig{Period: "2025-01"}, keys: []string{"key-without-order"}}
	if err := r.describeMissing(ctx, db, wl); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"not claimed again",
		"customer " + strconv.FormatInt(customers[0], 10) + ": no invoice for 2025-01",
		"idempotency key key-without-order: no order",
		"outbox row " + strconv.FormatInt(row.ID, 10) + " (lost-row) failed after 0 attempts",
		"refused by the test",
		"dedupe key gone",
	}
	all := strings.Join(r.Missing, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("the report's missing lines do not say %q:\n%s", w, all)
		}
	}
	if len(r.Missing) != 5 {
		t.Errorf("%d missing lines, want 5:\n%s", len(r.Missing), all)
	}
}
