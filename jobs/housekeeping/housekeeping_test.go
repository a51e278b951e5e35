package housekeeping_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

type testBundle struct {
	db  *fenceqtest.DB
	ctx context.Context
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return &testBundle{db: fenceqtest.New(t, &fenceqtest.Options{MaxConns: 6}), ctx: ctx}
}

// key claims a key; finished keys get their response, in-flight ones are committed as
// an owner working in separate transactions leaves them.
func (b *testBundle) key(t *testing.T, k string, ttl time.Duration, finish bool) {
	t.Helper()
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	h, _ := idempotency.HashRequest(k)
	res, err := idempotency.Claim(b.ctx, tx, idempotency.ClaimParams{Scope: "hk", Key: k, RequestHash: h, TTL: ttl})
	if err != nil || !res.Owned {
		t.Fatalf("claim %q: %v", k, err)
	}
	if finish {
		if _, err := idempotency.Finish(b.ctx, tx, res.Record, idempotency.Response{ResourceID: k}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
}

func (b *testBundle) keys(t *testing.T, where string) int64 {
	t.Helper()
	var n int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_idempotency_keys WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *testBundle) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	fenceqtest.WaitFor(t, what, 20*time.Second, cond)
}

func (b *testBundle) allExpired(t *testing.T) bool {
	return b.keys(t, `expires_at >= now() AND key LIKE 'old-%'`) == 0
}

func TestCleanupIdempotencyKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"old-1", "old-2", "old-3", "old-4", "old-5", "old-6", "old-7"} {
		b.key(t, k, time.Millisecond, true)
	}
	b.key(t, "old-inflight", time.Millisecond, false)
	b.key(t, "fresh", time.Hour, true)
	b.waitFor(t, "keys to expire", func() bool { return b.allExpired(t) })

	// Bounded: 2 batches of 3 delete 6 of the 7.
	n, err := housekeeping.CleanupIdempotencyKeys(b.ctx, b.db.Pool, 3, 2)
	if err != nil || n != 6 {
		t.Fatalf("bounded cleanup deleted %d (%v), want 6", n, err)
	}
	n, err = housekeeping.CleanupIdempotencyKeys(b.ctx, b.db.Pool, 3, 0)
	if err != nil || n != 1 {
		t.Fatalf("second cleanup deleted %d (%v), want 1", n, err)
	}
	if got := b.keys(t, `true`); got != 2 {
		t.Fatalf("%d keys left, want the in-flight one and the fresh one", got)
	}
	if got := b.keys(t, `key = 'old-inflight' AND state = 'in_flight'`); got != 1 {
		t.Fatal("the expired in-flight key was deleted")
	}
}

func TestHousekeepingJobRecurs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hs := fenceq.NewHandlers()
	if err := housekeeping.Register(hs, housekeeping.Config{}); err == nil {
		t.Fatal("Register without a pool succeeded")
	}
	if err := housekeeping.Register(hs, housekeeping.Config{Pool: b.db.Pool, BatchSize: 2, Logger: fenceqtest.QuietLogger()}); err != nil {
		t.Fatal(err)
	}
	if _, err := housekeeping.Periodic(1500 * time.Millisecond); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("an interval of 1.5s: %v, want a validation error", err)
	}
	sched, err := housekeeping.Periodic(time.Second)
	if err != nil {
		t.Fatal(err)
	}

	b.key(t, "old-1", time.Millisecond, true)
	b.key(t, "old-2", time.Millisecond, true)
	b.key(t, "old-3", time.Millisecond, true)
	b.key(t, "old-inflight", time.Millisecond, false)
	b.key(t, "fresh", time.Hour, true)
	b.waitFor(t, "keys to expire", func() bool { return b.allExpired(t) })

	// An outbox row whose delivery job the reaper discarded (every holder crashed).
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := outbox.Insert(b.ctx, tx, outbox.Message{Topic: "email", DedupeKey: "hk-orphan", Payload: []byte(`{"to":"a@example.com"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs_hot SET state = 'discarded', finished_at = now() WHERE id = $1`, orphan.DeliveryJobID); err != nil {
		t.Fatal(err)
	}

	fenceqtest.StartWorker(b.ctx, t, b.db.Pool, fenceq.Config{Handlers: hs, LeaseDuration: 5 * time.Second,
		ReaperInterval: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond, Logger: fenceqtest.QuietLogger(),
		Periodic: []*fenceq.PeriodicJob{sched}, PeriodicInterval: 100 * time.Millisecond})
	b.waitFor(t, "the job to delete the expired finished keys", func() bool {
		return b.keys(t, `state = 'finished' AND key LIKE 'old-%'`) == 0
	})
	b.waitFor(t, "the orphaned outbox row to be marked failed", func() bool {
		var state, reason string
		err := b.db.Pool.QueryRow(b.ctx, `SELECT state, COALESCE(last_error, '') FROM fenceq_outbox WHERE id = $1`, orphan.ID).Scan(&state, &reason)
		return err == nil && state == "failed" && strings.HasPrefix(reason, "orphaned:")
	})
	// A key that expires later is deleted by a later slot's job.
	b.key(t, "old-4", time.Millisecond, true)
	b.waitFor(t, "a later run to delete the new expired key", func() bool {
		return b.keys(t, `key = 'old-4'`) == 0
	})
	if got := b.keys(t, `true`); got != 2 {
		t.Fatalf("%d keys left, want the in-flight and the fresh key", got)
	}
	// Every run is a job of its own that completes, enqueued by the schedule for a slot.
	// A handler's completion is written in a batch after it returns, so the last run
	// may still be finishing: wait for two completed runs before reading them all.
	b.waitFor(t, "two housekeeping runs to complete", func() bool {
		var n int64
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE kind = $1 AND state = $2`,
			housekeeping.IdempotencyKind, string(queue.StateCompleted)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n >= 2
	})
	rows, err := b.db.Pool.Query(b.ctx, `SELECT id, state, metadata->'periodic'->>'name', metadata->'periodic'->>'slot'
		FROM fenceq_jobs WHERE kind = $1 ORDER BY id`, housekeeping.IdempotencyKind)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var jobs, completed, onStart int
	slots := map[string]bool{}
	for rows.Next() {
		var id int64
		var state string
		var name, slot *string
		if err := rows.Scan(&id, &state, &name, &slot); err != nil {
			t.Fatal(err)
		}
		if name == nil || *name != housekeeping.PeriodicName {
			t.Fatalf("job %d: periodic name %v; want %s", id, name, housekeeping.PeriodicName)
		}
		switch {
		case slot == nil:
			onStart++ // the run at the start (no worker had run a pass before)
		case slots[*slot]:
			t.Fatalf("job %d: slot %s enqueued twice", id, *slot)
		default:
			slots[*slot] = true
		}
		jobs++
		if state == string(queue.StateCompleted) {
			completed++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if jobs < 2 || completed < 2 || onStart != 1 {
		t.Fatalf("%d housekeeping jobs, %d completed, %d at the start; want at least two runs, each completed, one at the start",
			jobs, completed, onStart)
	}
	if err := housekeeping.Register(hs, housekeeping.Config{Pool: b.db.Pool}); err == nil || errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("registering the kind twice: %v, want a duplicate-kind error", err)
	}
}
