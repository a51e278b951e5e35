package fenceq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// ReindexArgs are the args of the debounced jobs in these tests.
type ReindexArgs struct {
	Doc int `json:"doc"`
	Rev int `json:"rev"`
}

func (ReindexArgs) Kind() string { return "reindex" }

const debounceQueue = "reindex"

type debounceBundle struct {
	ctx context.Context
	db  *fenceqtest.DB
}

func setupDebounce(t *testing.T) *debounceBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &debounceBundle{ctx: ctx, db: fenceqtest.New(t, &fenceqtest.Options{MaxConns: 24})}
}

func debounced(key string, window time.Duration) *fenceq.InsertOpts {
	return &fenceq.InsertOpts{Queue: debounceQueue, Debounce: queue.DebounceOpts{Key: key, Window: window}}
}

// enqueue enqueues a debounced reindex of doc at rev and returns the result.
func (b *debounceBundle) enqueue(t *testing.T, db queue.DBTX, rev int, opts *fenceq.InsertOpts) *queue.InsertResult {
	t.Helper()
	res, err := fenceq.Enqueue(b.ctx, db, ReindexArgs{Doc: 1, Rev: rev}, opts)
	if err != nil {
		t.Fatalf("enqueue rev %d: %v", rev, err)
	}
	return res
}

// waiting returns the jobs of kind reindex under key that have not started.
func (b *debounceBundle) waiting(t *testing.T, key string) []*queue.JobRow {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT id FROM fenceq_jobs
		WHERE kind = 'reindex' AND debounce_key = $1 AND lease_gen = 0 AND state IN ('available', 'scheduled')
		ORDER BY id`, key)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var out []*queue.JobRow
	for _, id := range ids {
		j, err := fenceq.GetJob(b.ctx, b.db.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	return out
}

func revOf(t *testing.T, j *queue.JobRow) int {
	t.Helper()
	var a ReindexArgs
	if err := json.Unmarshal(j.EncodedArgs, &a); err != nil {
		t.Fatalf("job %d args %s: %v", j.ID, j.EncodedArgs, err)
	}
	return a.Rev
}

// makeDue makes a waiting job claimable now, as the scheduler does once its run_at has
// passed, without waiting for the window.
func (b *debounceBundle) makeDue(t *testing.T, id int64) {
	t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs_hot SET state = 'available', run_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

func (b *debounceBundle) claim(t *testing.T, db queue.DBTX) []*queue.JobRow {
	t.Helper()
	js, err := store.Claim(b.ctx, db, store.ClaimParams{Queue: debounceQueue, WorkerID: "w1", Limit: 10, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// An enqueue with a debounce key inserts a job scheduled at the end of its window; a
// second one while it waits replaces its args, metadata, tags and priority and pushes its
// run_at to the end of the new window, keeping its id. Another key, or another kind with
// the same key, is a job of its own.
func TestDebounceReplacesWaitingJob(t *testing.T) {
	t.Parallel()
	b := setupDebounce(t)
	first := b.enqueue(t, b.db.Pool, 1, debounced("doc-1", time.Hour))
	if first.Debounced || first.Existing || first.Job.State != queue.StateScheduled {
		t.Fatalf("first enqueue: %+v, job %+v; want a new scheduled job", first, first.Job)
	}
	if d := first.Job.RunAt.Sub(first.Job.CreatedAt); d != time.Hour {
		t.Fatalf("first job runs %s after its creation; want the window, 1h", d)
	}
	opts := debounced("doc-1", 2*time.Hour)
	opts.Metadata = map[string]any{"by": "second"}
	opts.Tags = []string{"latest"}
	opts.Priority = new(5)
	second := b.enqueue(t, b.db.Pool, 2, opts)
	if !second.Debounced || second.Existing || second.Job.ID != first.Job.ID {
		t.Fatalf("second enqueue: debounced %t existing %t job %d; want job %d replaced", second.Debounced,
			second.Existing, second.Job.ID, first.Job.ID)
	}
	j := second.Job
	if revOf(t, j) != 2 || j.State != queue.StateScheduled || j.Priority != 5 || len(j.Tags) != 1 || j.Tags[0] != "latest" {
		t.Fatalf("replaced job %+v (args %s); want rev 2, scheduled, priority 5, tag latest", j, j.EncodedArgs)
	}
	var meta map[string]any
	if err := json.Unmarshal(j.Metadata, &meta); err != nil || meta["by"] != "second" {
		t.Fatalf("replaced job's metadata %s (%v); want the second enqueue's", j.Metadata, err)
	}
	if !j.RunAt.After(first.Job.RunAt) || !j.CreatedAt.Equal(first.Job.CreatedAt) {
		t.Fatalf("replaced job runs at %s (was %s), created %s (was %s); want run_at pushed to the new window's end and created_at kept",
			j.RunAt, first.Job.RunAt, j.CreatedAt, first.Job.CreatedAt)
	}
	if d := j.RunAt.Sub(j.CreatedAt); d < 2*time.Hour {
		t.Fatalf("replaced job runs %s after the first enqueue; want at least the second window, 2h", d)
	}

	other := b.enqueue(t, b.db.Pool, 3, debounced("doc-2", time.Hour))
	if other.Debounced || other.Job.ID == first.Job.ID {
		t.Fatalf("another key: %+v; want a job of its own", other)
	}
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, TickArgs{N: 1}, &fenceq.InsertOpts{Queue: debounceQueue,
		Debounce: queue.DebounceOpts{Key: "doc-1", Window: time.Hour}})
	if err != nil || res.Debounced || res.Job.ID == first.Job.ID {
		t.Fatalf("another kind with the same key: %+v, %v; want a job of its own", res, err)
	}
	if ws := b.waiting(t, "doc-1"); len(ws) != 1 || revOf(t, ws[0]) != 2 {
		t.Fatalf("waiting reindex jobs under doc-1: %d; want exactly the one, at rev 2", len(ws))
	}
}

// With a maximum wait, a replacement moves run_at to the end of the new window but never
// past the waiting job's created_at plus the maximum wait; once that time has come, the
// replacement takes the args and the job is available at once, whether it was scheduled
// or already available.
func TestDebounceMaxWaitCapsTheWait(t *testing.T) {
	t.Parallel()
	b := setupDebounce(t)
	capped := func(key string) *fenceq.InsertOpts {
		o := debounced(key, time.Hour)
		o.Debounce.MaxWait = 2 * time.Hour
		return o
	}
	first := b.enqueue(t, b.db.Pool, 1, capped("doc-1"))
	if d := first.Job.RunAt.Sub(first.Job.CreatedAt); first.Debounced || d != time.Hour {
		t.Fatalf("first enqueue %+v runs %s after its creation; want a new job, the window, 1h", first, d)
	}
	// The burst began 90 minutes ago: the next window would end 2h30m after it.
	backdate := func(id int64, ago string) {
		t.Helper()
		if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs_hot SET created_at = now() - $2::interval WHERE id = $1`, id, ago); err != nil {
			t.Fatal(err)
		}
	}
	backdate(first.Job.ID, "90 minutes")
	second := b.enqueue(t, b.db.Pool, 2, capped("doc-1"))
	j := second.Job
	if !second.Debounced || j.ID != first.Job.ID || revOf(t, j) != 2 || j.State != queue.StateScheduled {
		t.Fatalf("second enqueue %+v (args %s); want job %d replaced, rev 2, scheduled", second, j.EncodedArgs, first.Job.ID)
	}
	if d := j.RunAt.Sub(j.CreatedAt); d != 2*time.Hour {
		t.Fatalf("replaced job runs %s after the burst began; want the maximum wait, 2h", d)
	}
	// Past the maximum wait, a scheduled job becomes available, and an available one
	// stays available: neither is pushed back.
	backdate(j.ID, "3 hours")
	third := b.enqueue(t, b.db.Pool, 3, capped("doc-1"))
	if j := third.Job; !third.Debounced || revOf(t, j) != 3 || j.State != queue.StateAvailable ||
		j.RunAt.Sub(j.CreatedAt) != 2*time.Hour {
		t.Fatalf("enqueue past the maximum wait: %+v (args %s); want rev 3, available, run_at created_at + 2h", j, j.EncodedArgs)
	}
	b.makeDue(t, j.ID)
	backdate(j.ID, "3 hours")
	fourth := b.enqueue(t, b.db.Pool, 4, capped("doc-1"))
	if j := fourth.Job; !fourth.Debounced || revOf(t, j) != 4 || j.State != queue.StateAvailable {
		t.Fatalf("enqueue onto an available job past the maximum wait: %+v (args %s); want rev 4, still available", j, j.EncodedArgs)
	}
	if got := b.claim(t, b.db.Pool); len(got) != 1 || got[0].ID != j.ID {
		t.Fatalf("claimed %d jobs; want the debounced job %d", len(got), j.ID)
	}

	// Without a maximum wait the same burst is pushed to the end of each window.
	plain := b.enqueue(t, b.db.Pool, 1, debounced("doc-2", time.Hour))
	backdate(plain.Job.ID, "3 hours")
	again := b.enqueue(t, b.db.Pool, 2, debounced("doc-2", time.Hour))
	if d := again.Job.RunAt.Sub(again.Job.CreatedAt); d < 4*time.Hour-time.Minute {
		t.Fatalf("uncapped replacement runs %s after the burst began; want the new window's end, about 4h", d)
	}
}

// A job that has started is never replaced: the next enqueue with its key inserts a new
// job, and replaces that one after. A retry of the started job (retryable, then available
// again) and a release of it do not collide with the new one, since it has left the
// index for good.
func TestDebounceAfterStartEnqueuesNew(t *testing.T) {
	t.Parallel()
	b := setupDebounce(t)
	first := b.enqueue(t, b.db.Pool, 1, debounced("doc-1", time.Hour))
	b.makeDue(t, first.Job.ID)
	claimed := b.claim(t, b.db.Pool)
	if len(claimed) != 1 || claimed[0].ID != first.Job.ID {
		t.Fatalf("claimed %d jobs; want job %d", len(claimed), first.Job.ID)
	}
	second := b.enqueue(t, b.db.Pool, 2, debounced("doc-1", time.Hour))
	if second.Debounced || second.Job.ID == first.Job.ID || second.Job.State != queue.StateScheduled {
		t.Fatalf("enqueue while the first runs: %+v; want a new scheduled job", second)
	}
	running, err := fenceq.GetJob(b.ctx, b.db.Pool, first.Job.ID)
	if err != nil || running.State != queue.StateRunning || revOf(t, running) != 1 {
		t.Fatalf("running job %+v, %v; want it running at rev 1, untouched", running, err)
	}
	third := b.enqueue(t, b.db.Pool, 3, debounced("doc-1", time.Hour))
	if !third.Debounced || third.Job.ID != second.Job.ID || revOf(t, third.Job) != 3 {
		t.Fatalf("third enqueue: %+v; want job %d replaced with rev 3", third, second.Job.ID)
	}
	// The started job gives its lease back and becomes available again, same generation:
	// it must not take the key from the waiting job.
	lease := queue.Lease{JobID: first.Job.ID, Gen: claimed[0].LeaseGen, Holder: "w1"}
	if err := store.Release(b.ctx, b.db.Pool, lease); err != nil {
		t.Fatalf("release the started job: %v", err)
	}
	released, err := fenceq.GetJob(b.ctx, b.db.Pool, first.Job.ID)
	if err != nil || released.State != queue.StateAvailable {
		t.Fatalf("released job %+v, %v; want available", released, err)
	}
	fourth := b.enqueue(t, b.db.Pool, 4, debounced("doc-1", time.Hour))
	if !fourth.Debounced || fourth.Job.ID != second.Job.ID {
		t.Fatalf("enqueue after the release: %+v; want job %d replaced, not the released one", fourth, second.Job.ID)
	}
	if ws := b.waiting(t, "doc-1"); len(ws) != 1 || ws[0].ID != second.Job.ID || revOf(t, ws[0]) != 4 {
		t.Fatalf("waiting jobs under doc-1: %d; want job %d at rev 4 only", len(ws), second.Job.ID)
	}
}

// The claim and the debounced enqueue race on the same waiting job, in both orders.
// A claim that holds the row when the enqueue arrives makes the enqueue wait for it; once
// the claim commits, the job is running and out of the debounce index, and the enqueue
// inserts a new job (PostgreSQL checks the conflict again after the wait). If the claim
// rolls back instead, the enqueue replaces the job. An enqueue that holds the row makes
// the claim skip it; after the enqueue commits, the job waits for the new window.
func TestDebounceClaimRace(t *testing.T) {
	t.Parallel()
	// The race is ordered by watching pg_stat_activity for the lock wait, which a Citus
	// coordinator does not show (the wait is on the node holding the schema).
	fenceqtest.SkipOnCitus(t, "the test orders the race by a lock wait that only the node holding the schema shows")
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("ClaimCommits=%t", commit), func(t *testing.T) {
			t.Parallel()
			b := setupDebounce(t)
			key := "doc-1"
			first := b.enqueue(t, b.db.Pool, 1, debounced(key, time.Hour))
			b.makeDue(t, first.Job.ID)
			tx, err := b.db.Pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if js := b.claim(t, tx); len(js) != 1 || js[0].ID != first.Job.ID {
				t.Fatalf("claim in tx: %d jobs; want job %d", len(js), first.Job.ID)
			}
			conn, pid := b.conn(t)
			done := make(chan *queue.InsertResult, 1)
			errc := make(chan error, 1)
			go func() {
				res, err := fenceq.Enqueue(b.ctx, conn, ReindexArgs{Doc: 1, Rev: 2}, debounced(key, time.Hour))
				if err != nil {
					errc <- err
					return
				}
				done <- res
			}()
			b.waitLockWait(t, pid)
			if commit {
				err = tx.Commit(b.ctx)
			} else {
				err = tx.Rollback(b.ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			var res *queue.InsertResult
			select {
			case res = <-done:
			case err := <-errc:
				t.Fatalf("debounced enqueue racing the claim: %v", err)
			case <-b.ctx.Done():
				t.Fatal("debounced enqueue never returned")
			}
			if commit {
				if res.Debounced || res.Job.ID == first.Job.ID || revOf(t, res.Job) != 2 {
					t.Fatalf("after the claim committed: %+v; want a new job at rev 2", res)
				}
				j, err := fenceq.GetJob(b.ctx, b.db.Pool, first.Job.ID)
				if err != nil || j.State != queue.StateRunning || revOf(t, j) != 1 {
					t.Fatalf("claimed job %+v, %v; want running with its own args (rev 1)", j, err)
				}
			} else if !res.Debounced || res.Job.ID != first.Job.ID || revOf(t, res.Job) != 2 {
				t.Fatalf("after the claim rolled back: %+v; want job %d replaced with rev 2", res, first.Job.ID)
			}
			if ws := b.waiting(t, key); len(ws) != 1 || revOf(t, ws[0]) != 2 {
				t.Fatalf("waiting jobs: %d; want exactly one, at rev 2", len(ws))
			}
		})
	}
	t.Run("EnqueueHoldsTheRow", func(t *testing.T) {
		t.Parallel()
		b := setupDebounce(t)
		first := b.enqueue(t, b.db.Pool, 1, debounced("doc-1", time.Hour))
		b.makeDue(t, first.Job.ID)
		tx, err := b.db.Pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		res := b.enqueue(t, tx, 2, debounced("doc-1", time.Hour))
		if !res.Debounced || res.Job.ID != first.Job.ID {
			t.Fatalf("enqueue in tx: %+v; want job %d replaced", res, first.Job.ID)
		}
		if js := b.claim(t, b.db.Pool); len(js) != 0 {
			t.Fatalf("a claim while the enqueue holds the row took %d jobs; want none (skipped, locked)", len(js))
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		if js := b.claim(t, b.db.Pool); len(js) != 0 {
			t.Fatalf("a claim after the enqueue committed took %d jobs; want none (the job waits for its window)", len(js))
		}
		if ws := b.waiting(t, "doc-1"); len(ws) != 1 || ws[0].State != queue.StateScheduled || revOf(t, ws[0]) != 2 {
			t.Fatalf("waiting jobs: %d; want job %d scheduled at rev 2", len(ws), first.Job.ID)
		}
	})
}

// conn returns a connection of its own and its backend's pid.
func (b *debounceBundle) conn(t *testing.T) (*pgxpool.Conn, int32) {
	t.Helper()
	conn, err := b.db.Pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	var pid int32
	if err := conn.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return conn, pid
}

// waitLockWait waits until the backend pid waits for a lock.
func (b *debounceBundle) waitLockWait(t *testing.T, pid int32) {
	t.Helper()
	fenceqtest.WaitFor(t, fmt.Sprintf("backend %d to wait for a lock", pid), time.Minute, func() bool {
		var waiting bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE pid = $1 AND wait_event_type = 'Lock')`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
}

// Many goroutines enqueue under one key at once, each its own revision: exactly one job
// waits at the end, and it holds the revision of the enqueue that committed last. Each
// enqueue commits in a transaction of its own that also records its revision in a
// table, in commit order (a sequence drawn after the enqueue, under the row lock the
// enqueue took, which serializes the transactions), so "last" is read from the database.
func TestDebounceConcurrentEnqueuesKeepLastCommitted(t *testing.T) {
	t.Parallel()
	b := setupDebounce(t)
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE commits (seq bigserial PRIMARY KEY, rev int NOT NULL, job_id bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for rev := 1; rev <= n; rev++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, err := b.db.Pool.Begin(b.ctx)
			if err != nil {
				errs <- err
				return
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			res, err := fenceq.Enqueue(b.ctx, tx, ReindexArgs{Doc: 1, Rev: rev}, debounced("doc-1", time.Hour))
			if err != nil {
				errs <- fmt.Errorf("rev %d: %w", rev, err)
				return
			}
			if _, err := tx.Exec(b.ctx, `INSERT INTO commits (rev, job_id) VALUES ($1, $2)`, rev, res.Job.ID); err != nil {
				errs <- err
				return
			}
			errs <- tx.Commit(b.ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ws := b.waiting(t, "doc-1")
	if len(ws) != 1 {
		t.Fatalf("%d jobs wait under the key; want exactly one", len(ws))
	}
	var lastRev int
	var ids int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT (SELECT rev FROM commits ORDER BY seq DESC LIMIT 1),
		(SELECT count(DISTINCT job_id) FROM commits)`).Scan(&lastRev, &ids); err != nil {
		t.Fatal(err)
	}
	if got := revOf(t, ws[0]); got != lastRev || ids != 1 {
		t.Fatalf("the waiting job holds rev %d; the last committed enqueue wrote rev %d (%d distinct job ids); want that one, one job",
			got, lastRev, ids)
	}
	var total int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'reindex'`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if total != 1 {
		t.Fatalf("%d reindex jobs in all; want one", total)
	}
}

// Bad debounce options are refused before anything is written, naming the field.
func TestDebounceRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setupDebounce(t)
	cases := []struct {
		name  string
		opts  fenceq.InsertOpts
		field string
	}{
		{"KeyWithoutWindow", fenceq.InsertOpts{Debounce: queue.DebounceOpts{Key: "k"}}, "debounce.window"},
		{"NegativeWindow", fenceq.InsertOpts{Debounce: queue.DebounceOpts{Key: "k", Window: -time.Second}}, "debounce.window"},
		{"WindowWithoutKey", fenceq.InsertOpts{Debounce: queue.DebounceOpts{Window: time.Second}}, "debounce.key"},
		{"UniqueKey", fenceq.InsertOpts{UniqueKey: "u", Debounce: queue.DebounceOpts{Key: "k", Window: time.Second}}, "debounce"},
		{"UniqueByArgs", fenceq.InsertOpts{Unique: queue.UniqueOpts{ByArgs: true}, Debounce: queue.DebounceOpts{Key: "k", Window: time.Second}}, "debounce"},
		{"RunIn", fenceq.InsertOpts{RunIn: time.Minute, Debounce: queue.DebounceOpts{Key: "k", Window: time.Second}}, "debounce"},
		{"Unprintable", fenceq.InsertOpts{Debounce: queue.DebounceOpts{Key: "a\x00b", Window: time.Second}}, "debounce.key"},
		{"MaxWaitBelowWindow", fenceq.InsertOpts{Debounce: queue.DebounceOpts{Key: "k", Window: time.Hour, MaxWait: time.Minute}}, "debounce.max_wait"},
		{"MaxWaitNegative", fenceq.InsertOpts{Debounce: queue.DebounceOpts{Key: "k", Window: time.Hour, MaxWait: -time.Hour}}, "debounce.max_wait"},
	}
	for _, c := range cases {
		_, err := fenceq.Enqueue(b.ctx, b.db.Pool, ReindexArgs{}, &c.opts)
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("%s: %v; want a validation error naming %s", c.name, err, c.field)
		}
	}
	_, err := fenceq.EnqueueMany(b.ctx, b.db.Pool, []fenceq.EnqueueItem{{Args: ReindexArgs{}},
		{Args: ReindexArgs{}, Opts: debounced("k", time.Second)}})
	var ve *queue.ValidationError
	if !errors.As(err, &ve) || ve.Field != "debounce" {
		t.Errorf("EnqueueMany with a debounced job: %v; want refused naming debounce", err)
	}
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d jobs written (%v); want none", n, err)
	}
}

// An operator's retry of a cancelled job that never started takes it out of its debounce
// key, so that it runs beside the job now waiting under the key instead of colliding.
func TestDebounceRetryOfCancelledJob(t *testing.T) {
	t.Parallel()
	b := setupDebounce(t)
	first := b.enqueue(t, b.db.Pool, 1, debounced("doc-1", time.Hour))
	if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, first.Job.ID, "superseded"); err != nil {
		t.Fatal(err)
	}
	second := b.enqueue(t, b.db.Pool, 2, debounced("doc-1", time.Hour))
	if second.Debounced || second.Job.ID == first.Job.ID {
		t.Fatalf("enqueue after a cancel: %+v; want a new job", second)
	}
	retried, err := fenceq.RetryJob(b.ctx, b.db.Pool, first.Job.ID)
	if err != nil {
		t.Fatalf("retry the cancelled job: %v", err)
	}
	if retried.State != queue.StateAvailable {
		t.Fatalf("retried job %+v; want available", retried)
	}
	if ws := b.waiting(t, "doc-1"); len(ws) != 1 || ws[0].ID != second.Job.ID {
		t.Fatalf("waiting under the key: %d jobs; want job %d only", len(ws), second.Job.ID)
	}
}
