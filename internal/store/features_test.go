package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

func TestUniqueKeyReturnsExistingJobWhileUnfinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := store.InsertParams{Kind: "u", UniqueKey: "invoice:7:2026-10"}
	first, err := store.Insert(b.ctx, b.db.Pool, p)
	if err != nil || first.Existing {
		t.Fatalf("first: %+v %v", first, err)
	}
	second, err := store.Insert(b.ctx, b.db.Pool, p)
	if err != nil || !second.Existing || second.Job.ID != first.Job.ID {
		t.Fatalf("second: %+v %v; want the existing job %d", second, err, first.Job.ID)
	}
	// Batches skip duplicates too, within the batch and against the table.
	n, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{p, p, {Kind: "u", UniqueKey: "other"}, {Kind: "u", UniqueKey: "other"}})
	if err != nil || n != 1 {
		t.Fatalf("batch inserted %d (%v), want 1", n, err)
	}
	// Once finished, the key is free again.
	l := b.claim(t, "w", 10, time.Minute)
	for _, j := range l {
		if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(j)); err != nil {
			t.Fatal(err)
		}
	}
	third, err := store.Insert(b.ctx, b.db.Pool, p)
	if err != nil || third.Existing || third.Job.ID == first.Job.ID {
		t.Fatalf("after completion: %+v %v; want a new job", third, err)
	}
}

func TestPriorityThenRunAtOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	low := b.insert(t, store.InsertParams{Priority: new(5)})
	high := b.insert(t, store.InsertParams{Priority: new(0)})
	mid := b.insert(t, store.InsertParams{Priority: new(2)})
	var order []int64
	for i := 0; i < 3; i++ {
		order = append(order, b.claim(t, "w", 1, time.Minute)[0].ID)
	}
	want := []int64{high.ID, mid.ID, low.ID}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("claim order %v, want %v", order, want)
		}
	}
}

func TestScheduledJobsWaitForRunAt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	later := b.insert(t, store.InsertParams{RunIn: time.Hour})
	soon := b.insert(t, store.InsertParams{RunIn: 300 * time.Millisecond})
	at := b.insert(t, store.InsertParams{RunAt: time.Now().Add(-time.Minute)})
	if later.State != queue.StateScheduled || soon.State != queue.StateScheduled || at.State != queue.StateAvailable {
		t.Fatalf("states %s %s %s", later.State, soon.State, at.State)
	}
	if got := b.claim(t, "w", 10, time.Minute); len(got) != 1 || got[0].ID != at.ID {
		t.Fatalf("claimed %v, want only the due job", got)
	}
	time.Sleep(400 * time.Millisecond)
	n, err := store.PromoteDue(b.ctx, b.db.Pool, 100)
	if err != nil || n != 1 {
		t.Fatalf("promoted %d (%v), want 1", n, err)
	}
	if got := b.claim(t, "w", 10, time.Minute); len(got) != 1 || got[0].ID != soon.ID {
		t.Fatalf("claimed %v, want the promoted job", got)
	}
	// Batches with schedules go through staging and get the database's time too.
	if _, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{{Kind: "s", RunIn: time.Hour}, {Kind: "s"}}); err != nil {
		t.Fatal(err)
	}
	var scheduled, available int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state='scheduled'), count(*) FILTER (WHERE state='available') FROM fenceq_jobs WHERE kind='s'`).Scan(&scheduled, &available); err != nil {
		t.Fatal(err)
	}
	if scheduled != 1 || available != 1 {
		t.Fatalf("batch: scheduled %d available %d", scheduled, available)
	}
}

// Test 7: a job enqueued in a transaction is invisible until commit and gone after
// rollback.
func TestTransactionalEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolled, err := store.Insert(b.ctx, tx, store.InsertParams{Kind: "tx"})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.claim(t, "w", 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed an uncommitted job: %+v", got)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.GetJob(b.ctx, b.db.Pool, rolled.Job.ID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("rolled-back job: %v, want ErrNotFound", err)
	}

	tx, err = b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	delayed, err := store.Insert(b.ctx, tx, store.InsertParams{Kind: "tx"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.InsertMany(b.ctx, tx, []store.InsertParams{{Kind: "tx", UniqueKey: "k1"}, {Kind: "tx"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := b.claim(t, "w", 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed before commit: %+v", got)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	got := b.claim(t, "w", 10, time.Minute)
	if len(got) != 3 || got[0].ID != delayed.Job.ID {
		t.Fatalf("after commit claimed %d jobs, want 3 starting with %d", len(got), delayed.Job.ID)
	}
}

func TestFailRetriesWithBackoffThenDiscards(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.insert(t, store.InsertParams{MaxAttempts: 2})
	l := store.LeaseOf(b.claim(t, "w", 1, time.Minute)[0])
	state, err := store.Fail(b.ctx, b.db.Pool, l, store.FailParams{Err: "boom", Backoff: time.Hour})
	if err != nil || state != queue.StateRetryable {
		t.Fatalf("first failure: %s %v", state, err)
	}
	row := b.job(t, j.ID)
	if len(row.Errors) != 1 || row.Errors[0].Error != "boom" || row.Errors[0].Attempt != 1 || !row.RunAt.After(time.Now().Add(50*time.Minute)) {
		t.Fatalf("after failure: errors %+v run_at %v", row.Errors, row.RunAt)
	}
	if n, _ := store.PromoteDue(b.ctx, b.db.Pool, 10); n != 0 {
		t.Fatalf("promoted a job whose backoff has not passed")
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs SET run_at = now() WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	if n, _ := store.PromoteDue(b.ctx, b.db.Pool, 10); n != 1 {
		t.Fatalf("retryable job not promoted once due")
	}
	l = store.LeaseOf(b.claim(t, "w", 1, time.Minute)[0])
	state, err = store.Fail(b.ctx, b.db.Pool, l, store.FailParams{Err: "boom again", Backoff: time.Second})
	if err != nil || state != queue.StateDiscarded {
		t.Fatalf("last failure: %s %v, want discarded", state, err)
	}
	if row := b.job(t, j.ID); row.FinishedAt == nil || len(row.Errors) != 2 {
		t.Fatalf("discarded row: %+v", row)
	}
}

func TestBackoffGrowsWithJitterAndIsCapped(t *testing.T) {
	t.Parallel()
	bo := queue.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.2}
	for attempt := 1; attempt <= 12; attempt++ {
		want := time.Second << (attempt - 1)
		if want > time.Minute {
			want = time.Minute
		}
		for i := 0; i < 50; i++ {
			d := bo.Delay(attempt)
			if d > want || d < want*8/10 {
				t.Fatalf("attempt %d: delay %s outside [%s, %s]", attempt, d, want*8/10, want)
			}
		}
	}
}

func TestSnoozeCancelRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.insert(t, store.InsertParams{MaxAttempts: 1})
	l := store.LeaseOf(b.claim(t, "w", 1, time.Minute)[0])
	if err := store.Snooze(b.ctx, b.db.Pool, l, time.Hour); err != nil {
		t.Fatal(err)
	}
	row := b.job(t, j.ID)
	if row.State != queue.StateScheduled || row.MaxAttempts != 2 {
		t.Fatalf("snoozed: %s max %d; the snooze must not use up the only attempt", row.State, row.MaxAttempts)
	}
	if _, err := store.RetryJob(b.ctx, b.db.Pool, j.ID); err != nil {
		t.Fatal(err)
	}
	l = store.LeaseOf(b.claim(t, "w", 1, time.Minute)[0])
	if err := store.Release(b.ctx, b.db.Pool, l); err != nil {
		t.Fatal(err)
	}
	if row := b.job(t, j.ID); row.State != queue.StateAvailable || row.Attempt != 1 || row.LeasedBy != nil {
		t.Fatalf("released: %+v", row)
	}
	l = store.LeaseOf(b.claim(t, "w", 1, time.Minute)[0])
	if err := store.Cancel(b.ctx, b.db.Pool, l, "customer closed account"); err != nil {
		t.Fatal(err)
	}
	if row := b.job(t, j.ID); row.State != queue.StateCancelled || row.FinishedAt == nil ||
		!strings.Contains(row.Errors[len(row.Errors)-1].Error, "closed account") {
		t.Fatalf("cancelled: %+v", row)
	}
}

func TestPausedQueueYieldsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{})
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, "default", true); err != nil {
		t.Fatal(err)
	}
	if got := b.claim(t, "w", 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed %d from a paused queue", len(got))
	}
	qs, err := store.ListQueues(b.ctx, b.db.Pool)
	if err != nil || len(qs) != 1 || !qs[0].Paused || qs[0].Counts[queue.StateAvailable] != 1 {
		t.Fatalf("queues: %+v %v", qs, err)
	}
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, "default", false); err != nil {
		t.Fatal(err)
	}
	if got := b.claim(t, "w", 10, time.Minute); len(got) != 1 {
		t.Fatalf("claimed %d after resume, want 1", len(got))
	}
}

func TestRetentionPrunesOnlyOldFinishedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := 0; i < 5; i++ {
		b.insert(t, store.InsertParams{})
	}
	jobs := b.claim(t, "w", 3, time.Minute)
	for _, j := range jobs {
		if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(j)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := store.PruneFinished(b.ctx, b.db.Pool, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("pruned %d recent jobs (%v)", n, err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs SET finished_at = now() - interval '2 hours' WHERE finished_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	// Batches: two passes of 2 delete all three.
	n1, err1 := store.PruneFinished(b.ctx, b.db.Pool, time.Hour, 2)
	n2, err2 := store.PruneFinished(b.ctx, b.db.Pool, time.Hour, 2)
	if err1 != nil || err2 != nil || n1 != 2 || n2 != 1 {
		t.Fatalf("pruned %d then %d (%v %v), want 2 then 1", n1, n2, err1, err2)
	}
	// The two jobs never claimed are untouched.
	var waiting int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state = 'available') FROM fenceq_jobs
		HAVING count(*) = 2`).Scan(&waiting); err != nil || waiting != 2 {
		t.Fatalf("remaining jobs: %d available (%v), want exactly the 2 unfinished ones", waiting, err)
	}
}

func TestValidationErrorsNameTheField(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := []struct {
		name  string
		p     store.InsertParams
		field string
	}{
		{"EmptyKind", store.InsertParams{}, "kind"},
		{"BadKindChars", store.InsertParams{Kind: "bad kind"}, "kind"},
		{"LongKind", store.InsertParams{Kind: strings.Repeat("k", 129)}, "kind"},
		{"BadQueue", store.InsertParams{Kind: "k", Queue: "-lead"}, "queue"},
		{"LongQueue", store.InsertParams{Kind: "k", Queue: strings.Repeat("q", 65)}, "queue"},
		{"Malformed", store.InsertParams{Kind: "k", Args: []byte(`{"a":`)}, "args"},
		{"NotObject", store.InsertParams{Kind: "k", Args: []byte(`[1,2]`)}, "args"},
		{"NulChar", store.InsertParams{Kind: "k", Args: []byte(`{"a":"x\u0000y"}`)}, "args"},
		{"TooLarge", store.InsertParams{Kind: "k", Args: []byte(`{"a":"` + strings.Repeat("x", 1<<20) + `"}`)}, "args"},
		{"SmallLimit", store.InsertParams{Kind: "k", Args: []byte(`{"a":"xxxx"}`), MaxArgsBytes: 5}, "args"},
		{"Priority", store.InsertParams{Kind: "k", Priority: new(101)}, "priority"},
		{"MaxAttempts", store.InsertParams{Kind: "k", MaxAttempts: -1}, "max_attempts"},
		{"UniqueKey", store.InsertParams{Kind: "k", UniqueKey: "a\x01b"}, "unique_key"},
		{"NegativeDelay", store.InsertParams{Kind: "k", RunIn: -time.Second}, "run_in"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := store.Insert(b.ctx, b.db.Pool, c.p)
			var ve *queue.ValidationError
			if !errors.Is(err, queue.ErrInvalid) || !errors.As(err, &ve) || ve.Field != c.field {
				t.Fatalf("err = %v, want a ValidationError on %q", err, c.field)
			}
		})
	}
	// One invalid job fails the whole batch; nothing is written.
	_, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{{Kind: "ok"}, {Kind: "ok", Args: []byte("nope")}})
	if !errors.Is(err, queue.ErrInvalid) || !strings.Contains(err.Error(), "job 2 of 2") {
		t.Fatalf("batch: %v", err)
	}
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after invalid input: %d %v", n, err)
	}
}

func TestOperatorActions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.insert(t, store.InsertParams{})
	l := store.LeaseOf(b.claim(t, "w", 1, time.Minute)[0])

	if _, err := store.RetryJob(b.ctx, b.db.Pool, j.ID); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("retry of a running job: %v, want ErrWrongState", err)
	}
	req, err := store.RequeueJob(b.ctx, b.db.Pool, j.ID)
	if err != nil || req.State != queue.StateAvailable || req.LeaseGen != l.Gen+1 {
		t.Fatalf("requeue: %+v %v; want available with the generation bumped", req, err)
	}
	if err := store.Complete(b.ctx, b.db.Pool, l); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("holder's completion after requeue: %v", err)
	}
	l2 := store.LeaseOf(b.claim(t, "w", 1, time.Minute)[0])
	c, err := store.CancelJob(b.ctx, b.db.Pool, j.ID, "")
	if err != nil || c.State != queue.StateCancelled || c.LeaseGen != l2.Gen+1 {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if err := store.Complete(b.ctx, b.db.Pool, l2); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("holder's completion after cancel: %v", err)
	}
	if _, err := store.CancelJob(b.ctx, b.db.Pool, j.ID, ""); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("second cancel: %v", err)
	}
	if _, err := store.RetryJob(b.ctx, b.db.Pool, 987654); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("retry unknown: %v", err)
	}
	r, err := store.RetryJob(b.ctx, b.db.Pool, j.ID)
	if err != nil || r.State != queue.StateAvailable || r.FinishedAt != nil {
		t.Fatalf("retry cancelled: %+v %v", r, err)
	}
	if n := b.events(t, queue.EventRevoked); n != 2 {
		t.Fatalf("revoked events = %d, want 2 (requeue and cancel of a running job)", n)
	}
	jobs, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{State: queue.StateAvailable}})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("list: %d %v", len(jobs), err)
	}
	if _, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{State: "bogus"}}); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("list with bad state: %v", err)
	}
}

// A row locked by another transaction is reported busy, not lost and not renewed, and the
// heartbeat does not wait for the lock.
func TestHeartbeatSkipsLockedRowsWithoutWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{})
	b.insert(t, store.InsertParams{})
	jobs := b.claim(t, "w", 2, time.Minute)
	leases := []queue.Lease{store.LeaseOf(jobs[0]), store.LeaseOf(jobs[1])}
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM fenceq_jobs_hot WHERE id = $1 FOR UPDATE`, leases[0].JobID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	res, err := store.Heartbeat(ctx, b.db.Pool, "w", leases, time.Minute)
	if err != nil {
		t.Fatalf("heartbeat waited on the lock or failed: %v", err)
	}
	if len(res.Busy) != 1 || res.Busy[0] != leases[0] || len(res.Renewed) != 1 || res.Renewed[0] != leases[1] || len(res.Lost) != 0 {
		t.Fatalf("heartbeat result %+v", res)
	}
}

// An error text the database cannot store as it is — over the length limit with a
// multi-byte character at the cut, invalid UTF-8, a NUL byte — is still recorded
// (made valid), so the failure and its backoff take effect instead of the job staying
// running until its lease expires.
func TestFailRecordsAnyErrorText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := strings.Repeat("é", 3000) // 6,000 bytes: the 4 KiB cut falls inside characters
	for name, text := range map[string]string{"long multi-byte": long, "invalid UTF-8": "bad \xff\xfe bytes", "NUL": "a\x00b"} {
		j := b.insert(t, store.InsertParams{MaxAttempts: 5})
		var l queue.Lease
		for _, c := range b.claim(t, "w", 10, time.Minute) {
			if c.ID == j.ID {
				l = store.LeaseOf(c)
			}
		}
		state, err := store.Fail(b.ctx, b.db.Pool, l, store.FailParams{Err: text, Backoff: time.Hour})
		if err != nil || state != queue.StateRetryable {
			t.Fatalf("%s: fail: %s %v, want retryable", name, state, err)
		}
		row := b.job(t, j.ID)
		if len(row.Errors) != 1 || !utf8.ValidString(row.Errors[0].Error) || row.Errors[0].Error == "" {
			t.Fatalf("%s: recorded errors %+v", name, row.Errors)
		}
	}
}

// Metadata is stored as given by a single insert and by both COPY paths, defaults to
// an empty object, and must be a JSON object of bounded size.
func TestInsertMetadata(t *testing.T) {
	t.Parallel()
	b := setup(t)
	plain := b.insert(t, store.InsertParams{})
	if string(plain.Metadata) != "{}" {
		t.Fatalf("metadata of a job inserted without any: %s, want {}", plain.Metadata)
	}
	one := b.insert(t, store.InsertParams{Metadata: []byte(`{"periodic": {"name": "nightly"}}`)})
	if string(one.Metadata) != `{"periodic": {"name": "nightly"}}` {
		t.Fatalf("metadata of a single insert: %s", one.Metadata)
	}
	n, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{
		{Kind: "copy", Metadata: []byte(`{"n": 1}`)}, {Kind: "copy"}, {Kind: "copy", UniqueKey: "u", Metadata: []byte(`{"n": 3}`)}})
	if err != nil || n != 3 {
		t.Fatalf("insert many: %d %v", n, err)
	}
	var metas []string
	rows, err := b.db.Pool.Query(b.ctx, `SELECT metadata::text FROM fenceq_jobs WHERE kind = 'copy' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			t.Fatal(err)
		}
		metas = append(metas, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(metas, " ") != `{"n": 1} {} {"n": 3}` {
		t.Fatalf("metadata of a COPY batch: %v", metas)
	}
	for name, bad := range map[string][]byte{"array": []byte(`[1]`), "malformed": []byte(`{"a":`),
		"too large": []byte(`{"a": "` + strings.Repeat("x", queue.MaxMetadataBytes) + `"}`)} {
		_, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Kind: "k", Metadata: bad})
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != "metadata" {
			t.Errorf("%s metadata: %v, want a validation error naming metadata", name, err)
		}
	}
}
