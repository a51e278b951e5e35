package order_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/queue"
)

func TestPlaceJob(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	hs := fenceq.NewHandlers()
	if err := order.Register(hs, b.svc); err != nil {
		t.Fatal(err)
	}
	fenceqtest.StartWorker(b.ctx, t, b.pool, fenceq.Config{Handlers: hs, LeaseDuration: 5 * time.Second,
		ReaperInterval: 100 * time.Millisecond, PollInterval: 50 * time.Millisecond, Logger: fenceqtest.QuietLogger()})
	req := order.Request{CustomerEmail: "bob@example.com", Currency: "USD",
		Items: []order.Item{{SKU: "BOOK-1", Quantity: 1, UnitPriceCents: 1250}, {SKU: "PEN-2", Quantity: 3, UnitPriceCents: 199}}}
	enqueue := func(args order.PlaceArgs) int64 {
		t.Helper()
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, args, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Job.ID
	}
	// Two jobs for the same key and request, possibly at once: one order.
	j1 := enqueue(order.PlaceArgs{IdempotencyKey: "job-key", Request: req})
	j2 := enqueue(order.PlaceArgs{IdempotencyKey: "job-key", Request: req})
	fenceqtest.WaitState(t, b.db.Pool, j1, queue.StateCompleted, 20*time.Second)
	fenceqtest.WaitState(t, b.db.Pool, j2, queue.StateCompleted, 20*time.Second)

	var id, jobID, gen, outboxJob int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT o.id, o.job_id, o.lease_gen, x.job_id FROM orders o
		JOIN fenceq_outbox x ON x.dedupe_key = 'order-email:' || o.id WHERE o.idempotency_key = 'job-key'`).
		Scan(&id, &jobID, &gen, &outboxJob); err != nil {
		t.Fatal(err)
	}
	if (jobID != j1 && jobID != j2) || gen != 1 || outboxJob != jobID {
		t.Fatalf("order %d placed by job %d at generation %d (outbox job %d); jobs were %d and %d", id, jobID, gen, outboxJob, j1, j2)
	}
	b.checkOrderRows(t, "job-key", id, 2)

	// The same key over HTTP replays the job's order.
	r := b.post(t, "job-key", `{"customer_email":"bob@example.com","currency":"USD","items":[`+
		`{"sku":"BOOK-1","quantity":1,"unit_price_cents":1250},{"sku":"PEN-2","quantity":3,"unit_price_cents":199}]}`)
	if r.status != http.StatusCreated || r.order.ID != id || r.header.Get(order.HeaderReplayed) != "true" ||
		r.order.JobID == nil || *r.order.JobID != jobID {
		t.Fatalf("HTTP with the job's key: %d %s", r.status, r.body)
	}

	// A different request with the key, and an invalid request: discarded, no retry.
	other := req
	other.Items = []order.Item{{SKU: "BOOK-1", Quantity: 2, UnitPriceCents: 1250}}
	j3 := fenceqtest.WaitState(t, b.db.Pool, enqueue(order.PlaceArgs{IdempotencyKey: "job-key", Request: other}), queue.StateDiscarded, 20*time.Second)
	bad := req
	bad.Items = []order.Item{{SKU: "BOOK-1", Quantity: 0}}
	j4 := fenceqtest.WaitState(t, b.db.Pool, enqueue(order.PlaceArgs{IdempotencyKey: "bad", Request: bad}), queue.StateDiscarded, 20*time.Second)
	if j3.Attempt != 1 || j4.Attempt != 1 {
		t.Fatalf("discarded jobs ran %d and %d attempts, want 1", j3.Attempt, j4.Attempt)
	}
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if m := b.metrics.Values(); m.Created != 1 || m.Conflicts != 1 {
		t.Fatalf("metrics %+v, want 1 created and 1 conflict", m)
	}
}
