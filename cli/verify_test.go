package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/verify"
)

func TestVerifyPassAndFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	out := b.ok(t, "verify")
	if !strings.Contains(out, "all invariants hold") || strings.Contains(out, "FAIL") {
		t.Fatalf("verify on a clean schema:\n%s", out)
	}
	// Break the last line of defence and write duplicate invoices: verify must fail.
	for _, sql := range []string{
		`ALTER TABLE invoices DROP CONSTRAINT invoices_customer_period_key`,
		`INSERT INTO customers (id, name, email) VALUES (3, 'Bo', 'bo@example.com')`,
		`INSERT INTO invoices (customer_id, period, currency, subtotal_cents, tax_rate_micros, tax_cents, total_cents,
			job_id, lease_gen, leased_by) SELECT 3, '2026-03', 'USD', 5, 0, 0, 5, 1, g, 'w' FROM generate_series(1, 2) g`,
	} {
		if _, err := b.db.Pool.Exec(b.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	r := b.run(t, "verify")
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL") || !strings.Contains(r.stdout, "customer 3, period 2026-03: 2 invoices") {
		t.Fatalf("verify with duplicates: exit %d\n%s", r.code, r.stdout)
	}
	oneErrorLine(t, r, "verify:")
	var rep verify.Report
	r = b.run(t, "verify", "--json")
	if r.code != 1 {
		t.Fatalf("verify --json: exit %d", r.code)
	}
	if err := jsonDecode(r.stdout, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Passed || rep.Count(verify.CheckDuplicateInvoices) != 1 {
		t.Fatalf("report: %+v", rep)
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Other sessions on the shared test database may hold transactions; the xact bound is
	// generous here and tight below, where this test holds one itself.
	out := b.ok(t, "health", "--max-xact-age", "1h")
	if strings.Contains(out, "ALERT") || strings.Count(out, "OK") != 5 {
		t.Fatalf("healthy schema:\n%s", out)
	}

	t.Run("StaleWrite", func(t *testing.T) {
		j := b.enqueue(t, "noop")
		if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
			VALUES ($1, 1, 'w', 'stale_write_rejected', 'test')`, j.ID); err != nil {
			t.Fatal(err)
		}
		r := b.run(t, "health", "--max-xact-age", "1h")
		if r.code != 1 || !hasLine(r.stdout, "ALERT", "stale writes rejected") {
			t.Fatalf("health with a stale write: exit %d\n%s", r.code, r.stdout)
		}
		oneErrorLine(t, r, "1 alert condition(s) hold")
		if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_lease_events SET at = now() - interval '10 minutes'`); err != nil {
			t.Fatal(err)
		}
		b.ok(t, "health", "--max-xact-age", "1h", "--window", "5m")
	})

	t.Run("OpenTransaction", func(t *testing.T) {
		conn := b.db.NewPool(t, 1)
		tx, err := conn.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(b.ctx) }()
		if _, err := tx.Exec(b.ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1200 * time.Millisecond)
		var rep struct {
			Conditions []struct {
				Name  string `json:"name"`
				Alert bool   `json:"alert"`
			} `json:"conditions"`
			Healthy bool `json:"healthy"`
		}
		r := b.run(t, "health", "--max-xact-age", "1s", "--json")
		if r.code != 1 {
			t.Fatalf("health with a transaction open 1.2s, bound 1s: exit %d\n%s", r.code, r.stdout)
		}
		if err := jsonDecode(r.stdout, &rep); err != nil {
			t.Fatal(err)
		}
		alerts := map[string]bool{}
		for _, c := range rep.Conditions {
			alerts[c.Name] = c.Alert
		}
		if rep.Healthy || !alerts["oldest open transaction"] {
			t.Fatalf("health report: %+v", rep)
		}
	})

	t.Run("OutboxAge", func(t *testing.T) {
		if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO fenceq_outbox (topic, dedupe_key, available_at)
			VALUES ('email', 'old:1', now() - interval '10 minutes')`); err != nil {
			t.Fatal(err)
		}
		r := b.run(t, "health", "--max-xact-age", "1h", "--max-outbox-age", "5m")
		if r.code != 1 || !hasLine(r.stdout, "ALERT", "oldest pending outbox row") {
			t.Fatalf("health with a 10-minute-old outbox row: exit %d\n%s", r.code, r.stdout)
		}
	})
}

// hasLine reports whether one line of out contains every part.
func hasLine(out string, parts ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}
