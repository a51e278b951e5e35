package fenceqprom_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

func TestMain(m *testing.M) { fenceqtest.Main(m) }

func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

func wantLines(t *testing.T, body string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Errorf("exposition lacks %q", l)
		}
	}
}

func newMetrics(t *testing.T) (*fenceqprom.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := fenceqprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func TestHookCounts(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	ctx := context.Background()
	l := queue.Lease{JobID: 1, Gen: 2, Holder: "w1"}
	job := &queue.JobRow{ID: 1, LeaseGen: 2, Queue: "billing", Kind: "invoice"}
	m.JobStarted(ctx, job)
	m.JobStarted(ctx, job)
	m.JobFinished(ctx, job, fenceq.AttemptResult{Outcome: fenceq.OutcomeCompleted, Duration: 1500 * time.Millisecond})
	m.JobFinished(ctx, job, fenceq.AttemptResult{Outcome: fenceq.OutcomeLeaseLost, Err: queue.ErrLeaseLost, Duration: 3 * time.Second})
	m.LeaseRevoked(ctx, queue.Revocation{Lease: l, Queue: "billing", Kind: "invoice", HolderAlive: true})
	m.LeaseRevoked(ctx, queue.Revocation{Lease: l, Queue: "billing", Kind: "invoice"})
	m.LeaseLost(ctx, job, false)
	m.LeaseLost(ctx, job, true)
	m.StaleWriteRejected(ctx, job, "commit")
	m.HeartbeatFailed(ctx, errors.New("boom"))
	m.PeriodicEnqueued(ctx, "nightly", 2)
	var im interface {
		Replay(string)
		Conflict(string)
		InflightWait(string)
	} = m.Idempotency()
	im.Replay("orders")
	im.Replay("orders")
	im.Conflict("orders")
	im.InflightWait("orders")
	var om outbox.Metrics = m.Outbox()
	om.Delivered("email")
	om.Retried("email")
	om.Failed("email")

	wantLines(t, scrape(t, reg),
		`fenceq_jobs_claimed_total{kind="invoice",queue="billing"} 2`,
		`fenceq_jobs_finished_total{kind="invoice",outcome="completed",queue="billing"} 1`,
		`fenceq_jobs_finished_total{kind="invoice",outcome="lease_lost",queue="billing"} 1`,
		`fenceq_job_duration_seconds_count{kind="invoice",queue="billing"} 2`,
		`fenceq_job_duration_seconds_sum{kind="invoice",queue="billing"} 4.5`,
		`fenceq_lease_revocations_total{kind="invoice",queue="billing"} 2`,
		`fenceq_leases_expired_holder_alive_total{seen_by="reaper"} 1`,
		`fenceq_leases_expired_holder_alive_total{seen_by="holder"} 1`,
		`fenceq_leases_lost_total 2`,
		`fenceq_stale_writes_rejected_total{op="commit"} 1`,
		`fenceq_heartbeat_failures_total 1`,
		`fenceq_idempotency_replays_total{scope="orders"} 2`,
		`fenceq_idempotency_conflicts_total{kind="key_reuse",scope="orders"} 1`,
		`fenceq_idempotency_conflicts_total{kind="in_flight",scope="orders"} 1`,
		`fenceq_outbox_delivered_total{topic="email"} 1`,
		`fenceq_outbox_delivery_retries_total{topic="email"} 1`,
		`fenceq_outbox_failed_total{topic="email"} 1`,
	)
}

// The label values an alert watches exist, at 0, before the first event.
func TestKnownLabelsStartAtZero(t *testing.T) {
	t.Parallel()
	_, reg := newMetrics(t)
	wantLines(t, scrape(t, reg),
		`fenceq_stale_writes_rejected_total{op="commit"} 0`,
		`fenceq_stale_writes_rejected_total{op="complete"} 0`,
		`fenceq_stale_writes_rejected_total{op="settle"} 0`,
		`fenceq_stale_writes_rejected_total{op="release"} 0`,
		`fenceq_stale_writes_rejected_total{op="with lease"} 0`,
		`fenceq_leases_expired_holder_alive_total{seen_by="reaper"} 0`,
		`fenceq_leases_expired_holder_alive_total{seen_by="holder"} 0`,
		`fenceq_leases_lost_total 0`,
		`fenceq_heartbeat_failures_total 0`,
	)
}

// A second New in one registry fails, naming the metric, and leaves the first intact;
// a nil registry is refused.
func TestNewRegistration(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	if _, err := fenceqprom.New(reg); err == nil || !strings.Contains(err.Error(), "fenceq_jobs_claimed_total") {
		t.Fatalf("second New: %v, want an error naming fenceq_jobs_claimed_total", err)
	}
	m.JobStarted(context.Background(), &queue.JobRow{Queue: "q", Kind: "k"})
	wantLines(t, scrape(t, reg), `fenceq_jobs_claimed_total{kind="k",queue="q"} 1`)
	if _, err := fenceqprom.New(nil); err == nil || !strings.Contains(err.Error(), "registerer is nil") {
		t.Fatalf("New(nil): %v", err)
	}
	// A registry holding one of the names already gets none of them.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "fenceq_outbox_failed_total", Help: "taken"}))
	if _, err := fenceqprom.New(other); err == nil {
		t.Fatal("New over a taken name succeeded")
	}
	if body := scrape(t, other); strings.Contains(body, "fenceq_jobs_claimed_total") {
		t.Fatalf("a failed New left metrics registered:\n%s", body)
	}
}

// A worker reports to the metrics what it does: here, one job run by fenceqtest.Work.
func TestObserverWithWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2})
	m, reg := newMetrics(t)
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[noopArgs]) error { return nil }, nil)
	if _, err := fenceqtest.Work(ctx, t, db.Pool, fenceq.Config{Handlers: hs, Hooks: []fenceq.Hook{m}, Logger: fenceqtest.QuietLogger()},
		noopArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	wantLines(t, scrape(t, reg),
		`fenceq_jobs_claimed_total{kind="noop",queue="default"} 1`,
		`fenceq_jobs_finished_total{kind="noop",outcome="completed",queue="default"} 1`,
	)
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

func TestDBCollector(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 3; i++ {
		if _, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "noop", Queue: "mail"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "noop", Queue: "mail", RunIn: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// A finished job is not queue depth.
	done, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "noop", Queue: "done"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.CancelJob(ctx, db.Pool, done.Job.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if err := store.SetQueuePaused(ctx, db.Pool, "idle", true); err != nil {
		t.Fatal(err)
	}
	// A pending outbox row written a minute ago, and one delivered.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Insert(ctx, tx, outbox.Message{Topic: "email", DedupeKey: "k:1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Insert(ctx, tx, outbox.Message{Topic: "email", DedupeKey: "k:2"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_outbox SET available_at = now() - interval '60 seconds'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_outbox SET state = $1 WHERE dedupe_key = 'k:2'`, outbox.StateDelivered); err != nil {
		t.Fatal(err)
	}
	// A transaction left open on another connection, idle, for at least 1s.
	idle := db.NewPool(t, 1)
	itx, err := idle.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = itx.Rollback(ctx) }()
	if _, err := itx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)

	s, err := fenceqprom.TakeSnapshot(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.Depth["mail"][queue.StateAvailable] != 3 || s.Depth["mail"][queue.StateScheduled] != 1 {
		t.Errorf("depth of mail: %v, want 3 available and 1 scheduled", s.Depth["mail"])
	}
	if st, ok := s.Depth["idle"]; !ok || len(st) != len(queue.UnfinishedStates()) || st[queue.StateAvailable] != 0 {
		t.Errorf("paused empty queue idle: %v, want every unfinished state at zero", st)
	}
	if st, ok := s.Depth["done"]; ok {
		t.Errorf("queue done with only a cancelled job has depth %v, want absent", st)
	}
	if s.OutboxPending != 1 || s.OutboxOldestPendingAge < 59*time.Second {
		t.Errorf("outbox: %d pending, oldest %s; want 1 and ≥ 59s", s.OutboxPending, s.OutboxOldestPendingAge)
	}
	if s.OldestTransactionAge < time.Second || s.IdleInTransaction < 1 {
		t.Errorf("oldest transaction %s, idle in transaction %d; want ≥ 1s and ≥ 1", s.OldestTransactionAge, s.IdleInTransaction)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(fenceqprom.NewDBCollector(db.Pool, 5*time.Second, log))
	body := scrape(t, reg)
	wantLines(t, body,
		`fenceq_db_up 1`,
		`fenceq_queue_depth{queue="mail",state="available"} 3`,
		`fenceq_queue_depth{queue="mail",state="scheduled"} 1`,
		`fenceq_queue_depth{queue="idle",state="running"} 0`,
		`fenceq_queue_depth{queue="outbox",state="available"} 2`, // the rows' delivery jobs
		`fenceq_outbox_pending 1`,
	)
	for _, name := range []string{"fenceq_outbox_oldest_pending_age_seconds ", "fenceq_db_oldest_transaction_age_seconds "} {
		i := strings.Index(body, "\n"+name)
		if i < 0 {
			t.Errorf("exposition lacks %s", name)
			continue
		}
		line := strings.SplitN(body[i+1:], "\n", 2)[0]
		if strings.HasSuffix(line, " 0") {
			t.Errorf("%s is 0, want the age of the real row/transaction", line)
		}
	}
}

// A queue that empties keeps its depth series, at 0 for every unfinished state, while a
// worker serves it: a graph shows 0, not a gap.
func TestDBCollectorDepthOfEmptiedQueue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 4})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[noopArgs]) error { return nil }, nil)
	fenceqtest.StartWorker(ctx, t, db.Pool, fenceq.Config{Handlers: hs, Logger: fenceqtest.QuietLogger(),
		Queues: map[string]fenceq.QueueConfig{"served": {}}})
	res, err := fenceq.Enqueue(ctx, db.Pool, noopArgs{}, &fenceq.InsertOpts{Queue: "served"})
	if err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitState(t, db.Pool, res.Job.ID, queue.StateCompleted, 30*time.Second)

	s, err := fenceqprom.TakeSnapshot(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := s.Depth["served"]
	if !ok || len(st) != len(queue.UnfinishedStates()) {
		t.Fatalf("emptied queue served, which a worker serves: depth %v (present %v), want every unfinished state", st, ok)
	}
	var want []string
	for _, state := range queue.UnfinishedStates() {
		if st[state] != 0 {
			t.Errorf("emptied queue served: %s = %d, want 0", state, st[state])
		}
		want = append(want, `fenceq_queue_depth{queue="served",state="`+string(state)+`"} 0`)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(fenceqprom.NewDBCollector(db.Pool, 5*time.Second, fenceqtest.QuietLogger()))
	wantLines(t, scrape(t, reg), want...)
}

func TestDBCollectorWithoutSchema(t *testing.T) {
	t.Parallel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	if _, err := fenceqprom.TakeSnapshot(context.Background(), db.Pool); err == nil ||
		!strings.Contains(err.Error(), "fenceq_jobs does not exist") {
		t.Fatalf("snapshot of an empty schema: %v, want the missing table named", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(fenceqprom.NewDBCollector(db.Pool, time.Second, slog.New(slog.NewTextHandler(io.Discard, nil))))
	wantLines(t, scrape(t, reg), `fenceq_db_up 0`)
}
