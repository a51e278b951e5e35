package cli_test

import (
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

func TestQueuesPauseResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "noop", "--queue", "mail")
	b.ok(t, "queues", "pause", "mail")
	var qs []queue.QueueInfo
	b.okJSON(t, &qs, "queues", "list")
	if len(qs) != 1 || qs[0].Name != "mail" || !qs[0].Paused || qs[0].Counts[queue.StateAvailable] != 1 {
		t.Fatalf("after pause: %+v", qs)
	}
	// A paused queue gives nothing to a claimer.
	got, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "mail", WorkerID: "w", Limit: 1, Lease: time.Minute})
	if err != nil || len(got) != 0 {
		t.Fatalf("claim from paused queue: %d jobs, err %v", len(got), err)
	}
	if out := b.ok(t, "queues", "list"); !strings.Contains(out, "mail") || !strings.Contains(out, "yes") {
		t.Errorf("table:\n%s", out)
	}
	b.ok(t, "queues", "resume", "mail")
	b.okJSON(t, &qs, "queues", "list")
	if qs[0].Paused {
		t.Fatalf("after resume: %+v", qs)
	}
	// A finished job counts from the job counters. No worker rolls them up here: once the
	// last roll-up (by the listings above) is older than the command allows, the command
	// rolls them up itself. The roll-up passes a job a moment after it finished, by the
	// database's clock, which the test waits for.
	got, err = store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "mail", WorkerID: "w", Limit: 1, Lease: time.Minute})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim after resume: %d jobs, err %v", len(got), err)
	}
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(got[0])); err != nil {
		t.Fatal(err)
	}
	// Each try makes the last roll-up a minute older, so that the command rolls up
	// itself. A roll-up passes the job once its horizon has: a moment after the job
	// finished, by the database's clock, and after any statement that was running then
	// anywhere in the database has ended.
	var after []queue.QueueInfo
	fenceqtest.WaitFor(t, "the completed job counted in the queue list", 90*time.Second, func() bool {
		if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_job_counts_cursor SET rolled_at = rolled_at - interval '1 minute'`); err != nil {
			t.Fatal(err)
		}
		b.okJSON(t, &after, "queues", "list")
		return len(after) == 1 && after[0].Counts[queue.StateCompleted] == 1
	})
	if !maps.Equal(after[0].Counts, map[queue.State]int64{queue.StateCompleted: 1}) {
		t.Fatalf("after the job completed: %+v", after)
	}
	if out := b.ok(t, "queues", "list"); !strings.Contains(out, "COMPLETED (24H)") {
		t.Errorf("the table does not say the finished counts cover 24 hours:\n%s", out)
	}
	oneErrorLine(t, b.run(t, "queues", "pause"), "usage: fenceq queues pause QUEUE")
	oneErrorLine(t, b.run(t, "queues", "pause", strings.Repeat("q", 100)), "queue")
}

func TestWorkersAndStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if out := b.ok(t, "workers"); !strings.Contains(out, "no live workers") {
		t.Errorf("workers on empty schema: %q", out)
	}
	if err := store.RegisterWorker(b.ctx, b.db.Pool, "w-1", "host-a", 4242, []string{"default", "mail"}, []string{"echo"}); err != nil {
		t.Fatal(err)
	}
	j := b.enqueue(t, "noop")
	b.enqueue(t, "noop", "--queue", "mail")
	if _, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "default", WorkerID: "w-1", Limit: 1, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	var ws []queue.WorkerInfo
	b.okJSON(t, &ws, "workers")
	if len(ws) != 1 || ws[0].ID != "w-1" || ws[0].PID != 4242 || ws[0].RunningJobs != 1 || ws[0].HeartbeatAge > time.Minute {
		t.Fatalf("workers: %+v", ws)
	}
	if out := b.ok(t, "workers"); !strings.Contains(out, "default,mail") || !strings.Contains(out, "ago") {
		t.Errorf("workers table:\n%s", out)
	}

	if err := store.RecordLeaseEvents(b.ctx, b.db.Pool, queue.EventStaleWriteRejected, "w-1", "test",
		[]queue.Lease{{JobID: j.ID, Gen: 1}}); err != nil {
		t.Fatal(err)
	}
	var st struct {
		Queues      []queue.QueueInfo              `json:"queues"`
		LeaseEvents map[queue.LeaseEventKind]int64 `json:"lease_events"`
		Workers     int                            `json:"workers"`
		Outbox      outbox.Backlog                 `json:"outbox"`
	}
	b.okJSON(t, &st, "stats")
	if st.Workers != 1 || st.LeaseEvents[queue.EventStaleWriteRejected] != 1 || st.LeaseEvents[queue.EventRevoked] != 0 {
		t.Fatalf("stats: %+v", st)
	}
	counts := map[string]map[queue.State]int64{}
	for _, q := range st.Queues {
		counts[q.Name] = q.Counts
	}
	if counts["default"][queue.StateRunning] != 1 || counts["mail"][queue.StateAvailable] != 1 {
		t.Fatalf("stats counts: %v", counts)
	}
	out := b.ok(t, "stats")
	for _, want := range []string{"QUEUE", "total", "stale_write_rejected  1", "live workers", "outbox pending"} {
		if !strings.Contains(out, want) {
			t.Errorf("stats output lacks %q:\n%s", want, out)
		}
	}
	// A window that looks back nowhere would count nothing: a usage error, as in health.
	r := b.run(t, "stats", "--window", "0s")
	oneErrorLine(t, r, "invalid --window 0s: must be positive")
	if r.code != 2 {
		t.Errorf("stats --window 0s: exit %d, want 2", r.code)
	}
}

func TestOutboxListRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := outbox.Insert(b.ctx, tx, outbox.Message{Topic: "email", DedupeKey: "order-email:9",
		Payload: []byte(`{"to": "ada@example.com", "subject": "hi", "text": "x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	var rows []outbox.Row
	b.okJSON(t, &rows, "outbox", "list", "--state", "pending")
	if len(rows) != 1 || rows[0].DedupeKey != "order-email:9" {
		t.Fatalf("outbox list: %+v", rows)
	}
	id := strconv.FormatInt(res.ID, 10)
	oneErrorLine(t, b.run(t, "outbox", "retry", id), "cannot retry outbox row")
	// Its delivery job discarded, the row is orphaned: retry gives it a new delivery job.
	if _, err := store.CancelJob(b.ctx, b.db.Pool, res.DeliveryJobID, "test"); err != nil {
		t.Fatal(err)
	}
	var after outbox.Row
	b.okJSON(t, &after, "outbox", "retry", id)
	if after.State != outbox.StatePending || after.DeliveryJobID == nil || *after.DeliveryJobID == res.DeliveryJobID ||
		after.DedupeKey != "order-email:9" {
		t.Fatalf("after retry: %+v", after)
	}
	oneErrorLine(t, b.run(t, "outbox", "retry", "999999"), "outbox row 999999 not found")
	oneErrorLine(t, b.run(t, "outbox", "list", "--state", "lost"), `invalid --state "lost"`)
	oneErrorLine(t, b.run(t, "outbox", "list", "--limit", "0"), "invalid --limit 0: want 1–100000")
	if out := b.ok(t, "outbox", "list"); !strings.Contains(out, "DEDUPE_KEY") || !strings.Contains(out, "order-email:9") {
		t.Errorf("outbox table:\n%s", out)
	}
}
