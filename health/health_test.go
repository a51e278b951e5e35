package health_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

func alerts(r *health.Report) map[health.Kind]bool {
	out := map[health.Kind]bool{}
	for _, c := range r.Conditions {
		out[c.Kind] = c.Alert
	}
	return out
}

func TestCheckRaisesEachCondition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := fenceqtest.New(t, nil)
	th := health.Thresholds{MaxTransactionAge: time.Hour}
	rep, err := health.Check(ctx, db.Pool, th)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Healthy || rep.Alerts != 0 || len(rep.Conditions) != 5 {
		t.Fatalf("fresh schema: %+v", rep)
	}
	if rep.Thresholds.Window != health.DefaultWindow {
		t.Errorf("defaults not applied: %+v", rep.Thresholds)
	}

	if err := store.RecordStaleWrite(ctx, db.Pool, queue.Lease{JobID: 1, Gen: 1, Holder: "w"}, "complete"); err != nil {
		t.Fatal(err)
	}
	if err := store.RecordLeaseEvents(ctx, db.Pool, queue.EventExpiredHolderAlive, "w", "test", []queue.Lease{{JobID: 1, Gen: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO fenceq_outbox (topic, dedupe_key, available_at)
		VALUES ('email', 'old:1', now() - interval '10 minutes')`); err != nil {
		t.Fatal(err)
	}
	rep, err = health.Check(ctx, db.Pool, th)
	if err != nil {
		t.Fatal(err)
	}
	a := alerts(rep)
	if rep.Healthy || rep.Alerts != 3 || !a[health.StaleWriteRejected] || !a[health.ExpiredHolderAlive] ||
		!a[health.OutboxAge] || a[health.TransactionAge] {
		t.Fatalf("after a stale write, a live expired holder and a 10-minute-old outbox row: %+v", rep.Conditions)
	}
	if rep.Outbox.Pending != 1 || rep.LeaseEvents[queue.EventStaleWriteRejected] != 1 {
		t.Errorf("report details: outbox %+v events %v", rep.Outbox, rep.LeaseEvents)
	}
	// A schedule whose slots no worker has enqueued for two hours lags.
	if _, err := fenceq.AddPeriodic(ctx, db.Pool, queue.PeriodicParams{Name: "stalled", Spec: "@every 1m", Kind: "k",
		Source: queue.SourceCLI}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_periodic SET last_slot = now() - interval '2 hours' WHERE name = 'stalled'`); err != nil {
		t.Fatal(err)
	}
	rep, err = health.Check(ctx, db.Pool, th)
	if err != nil {
		t.Fatal(err)
	}
	if !alerts(rep)[health.PeriodicLag] || rep.MostLagging == nil || rep.MostLagging.Name != "stalled" {
		t.Fatalf("a schedule two hours behind: %+v, lagging %+v", rep.Conditions, rep.MostLagging)
	}
	// A window that looks back nowhere is refused, naming the field.
	if _, err := health.Check(ctx, db.Pool, health.Thresholds{Window: -time.Minute}); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("negative window: %v", err)
	}
}

func TestAge(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond: "850ms", 4200 * time.Millisecond: "4.2s", 192 * time.Second: "3m12s",
		5 * time.Minute: "5m", time.Hour: "1h", 5*time.Hour + 4*time.Minute: "5h4m", -2 * time.Second: "-2s",
	} {
		if got := health.Age(d); got != want {
			t.Errorf("Age(%s) = %q; want %q", d, got, want)
		}
	}
}
