package builtin_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
)

func TestKinds(t *testing.T) {
	t.Parallel()
	ks := builtin.Kinds()
	names := builtin.KindNames()
	if len(ks) != len(names) || !slices.IsSorted(names) {
		t.Fatalf("Kinds %+v, KindNames %v: want the same kinds, sorted", ks, names)
	}
	queues := builtin.Queues()
	for i, k := range ks {
		if k.Name != names[i] || k.Description == "" || !slices.Contains(queues, k.Queue) {
			t.Errorf("kind %d: %+v; want name %s, a description and one of the queues %v", i, k, names[i], queues)
		}
		if got, ok := builtin.LookupKind(k.Name); !ok || got.Name != k.Name || got.Queue != k.Queue {
			t.Errorf("LookupKind(%q) = %+v, %v", k.Name, got, ok)
		}
	}
	if _, ok := builtin.LookupKind("nope"); ok {
		t.Error("LookupKind found a kind called nope")
	}
	if got := builtin.RecurringKinds(); !slices.Equal(got, []string{"housekeeping.idempotency"}) {
		t.Errorf("RecurringKinds() = %v", got)
	}
	// Each call returns a fresh slice.
	builtin.Kinds()[0].Queue = "changed"
	if builtin.Kinds()[0].Queue == "changed" {
		t.Error("Kinds returns a shared slice")
	}
}

func TestKindValidateArgs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		kind, args string
		want       string // "" when the args are valid
	}{
		{"noop", `{}`, ""},
		{"noop", `{"anything": 1}`, ""},
		{"sleep", `{"duration": "5s"}`, ""},
		{"sleep", `{"duration": "-5s"}`, "between 0 and"},
		{"invoice", `{"customer_id": 1, "period": "2026-01"}`, ""},
		{"invoice", `{"customer_id": 1, "period": "January"}`, "YYYY-MM"},
		{"invoice", `{"customer_id": 1, "period": "2026-01", "extra": true}`, `unknown field "extra"`},
		{"order.place", `{"idempotency_key": "k1", "request": {"customer_email": "a@example.com", "currency": "EUR",
			"items": [{"sku": "A1", "quantity": 1, "unit_price_cents": 100}]}}`, ""},
		{"order.place", `{"request": {}}`, "idempotency_key is required"},
		{"outbox.deliver", `{"outbox_id": 7}`, ""},
		{"outbox.deliver", `{"outbox_id": 0}`, "positive outbox row id"},
		{"housekeeping.idempotency", `{}`, ""},
		{"housekeeping.idempotency", `{"batch": 5}`, `unknown field "batch"`},
	} {
		k, ok := builtin.LookupKind(c.kind)
		if !ok {
			t.Fatalf("no kind %s", c.kind)
		}
		err := k.ValidateArgs([]byte(c.args))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s %s: %v, want valid", c.kind, c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %s: %v, want an error containing %q", c.kind, c.args, err, c.want)
		}
	}
}

// Register adds a handler for exactly the kinds Kinds describes.
func TestRegister(t *testing.T) {
	t.Parallel()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2, Migrations: builtin.Migrations()})
	mailer, err := email.NewFileMailer(t.TempDir() + "/mail.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mailer.Close() })
	tax, err := invoice.NewSimulatedTax(invoice.SimulatedTaxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	orders, err := order.NewService(order.Config{Pool: db.Pool})
	if err != nil {
		t.Fatal(err)
	}
	deps := builtin.Deps{Pool: db.Pool, Mailer: mailer, Tax: tax, Orders: orders}
	hs := fenceq.NewHandlers()
	if err := builtin.Register(hs, deps); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if got := hs.Kinds(); !slices.Equal(slices.Sorted(slices.Values(got)), builtin.KindNames()) {
		t.Fatalf("registered kinds %v, want %v", got, builtin.KindNames())
	}

	missing := deps
	missing.Tax = nil
	if err := builtin.Register(fenceq.NewHandlers(), missing); err == nil || !strings.Contains(err.Error(), "Tax: required") {
		t.Errorf("Register without Tax: %v", err)
	}
}
