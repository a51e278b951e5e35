package builtin_test

import (
	"context"
	_ "embed"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/migrations"
)

//go:embed testdata/single_set_v8.sql
var singleSetV8 string

// A schema that one migration set took to version 8, business tables included, upgrades
// to the split sets with every row kept: the core continues from its version, and the
// business sets adopt the tables they find.
func TestUpgradeFromSingleSetSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fenceqtest.SkipOnCitus(t, "the fixture is a schema an old single migration set made, notify trigger included, "+
		"which a Citus distributed table cannot have: no such schema exists on Citus to upgrade")
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	if _, err := db.Pool.Exec(ctx, singleSetV8); err != nil {
		t.Fatalf("load the fixture: %v", err)
	}
	counts := func() map[string]int64 {
		t.Helper()
		out := map[string]int64{}
		for _, table := range []string{"fenceq_jobs", "fenceq_outbox", "fenceq_idempotency_keys", "fenceq_lease_events",
			"fenceq_workers", "fenceq_queues", "customers", "usage_records", "invoices", "invoice_lines", "orders", "order_items"} {
			var n int64
			if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
				t.Fatalf("count %s: %v", table, err)
			}
			out[table] = n
		}
		return out
	}
	before := counts()
	for table, n := range before {
		if n == 0 {
			t.Fatalf("the fixture has no rows in %s", table)
		}
	}

	if err := migrations.UpAll(ctx, db.Pool, builtin.Migrations()...); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	after := counts()
	for table, n := range before {
		if after[table] != n {
			t.Errorf("%s: %d rows after the upgrade, %d before", table, after[table], n)
		}
	}
	for _, s := range builtin.Migrations() {
		rep, err := s.Status(ctx, db.Pool)
		if err != nil || !rep.Current() {
			t.Fatalf("set %s after the upgrade: %+v %v", s.Name, rep, err)
		}
	}
	var total int64
	if err := db.Pool.QueryRow(ctx, `SELECT total_cents FROM invoices WHERE customer_id = 1 AND period = '2026-10'`).Scan(&total); err != nil || total != 2856 {
		t.Fatalf("invoice after the upgrade: %d %v", total, err)
	}
	// The adopted tables keep their constraints: one invoice per customer and period.
	_, err := db.Pool.Exec(ctx, `INSERT INTO invoices (customer_id, period, currency, subtotal_cents, tax_rate_micros,
		tax_cents, total_cents, job_id, lease_gen, leased_by) VALUES (1, '2026-10', 'EUR', 0, 0, 0, 0, 1, 1, 'x')`)
	if err == nil || !strings.Contains(err.Error(), "invoices_customer_period_key") {
		t.Fatalf("second invoice for a customer and period: %v, want the unique violation", err)
	}
	// The billing tables now belong to the invoice set: its down drops them, and only them.
	if err := invoice.Migrations().Down(ctx, db.Pool, 0); err != nil {
		t.Fatalf("invoice down: %v", err)
	}
	var left bool
	if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('invoices') IS NOT NULL OR to_regclass('customers') IS NOT NULL`).Scan(&left); err != nil || left {
		t.Fatalf("billing tables left after the invoice set's down: %v %v", left, err)
	}
	var jobs int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&jobs); err != nil || jobs != before["fenceq_jobs"] {
		t.Fatalf("jobs after the invoice set's down: %d %v", jobs, err)
	}
}
