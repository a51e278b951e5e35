package store_test

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// counterKey is one group of the counters: queue, kind and final state.
type counterKey struct{ queue, kind, state string }

// counted sums the counters per group: jobs and failed attempts.
func (b *testBundle) counted(t *testing.T) (jobs, failed map[counterKey]int64) {
	t.Helper()
	jobs, failed = map[counterKey]int64{}, map[counterKey]int64{}
	rows, err := b.db.Pool.Query(b.ctx, `SELECT queue, kind, state, sum(jobs)::bigint, sum(failed)::bigint
		FROM fenceq_job_counts GROUP BY 1, 2, 3`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k counterKey
		var j, f int64
		if err := rows.Scan(&k.queue, &k.kind, &k.state, &j, &f); err != nil {
			t.Fatal(err)
		}
		if j != 0 {
			jobs[k] = j
		}
		if f != 0 {
			failed[k] = f
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return jobs, failed
}

// direct counts the finished jobs as they are now, in both tables, per group, and their
// failed attempts (every error but a cancelled job's last one).
func (b *testBundle) direct(t *testing.T) (jobs, failed map[counterKey]int64) {
	t.Helper()
	jobs, failed = map[counterKey]int64{}, map[counterKey]int64{}
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT queue, kind, state, count(*),
		       sum(jsonb_array_length(errors) - CASE WHEN state = 'cancelled' AND errors <> '[]' THEN 1 ELSE 0 END)::bigint
		FROM fenceq_jobs WHERE state IN ('completed', 'discarded', 'cancelled') GROUP BY 1, 2, 3`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k counterKey
		var j, f int64
		if err := rows.Scan(&k.queue, &k.kind, &k.state, &j, &f); err != nil {
			t.Fatal(err)
		}
		jobs[k] = j
		if f != 0 {
			failed[k] = f
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return jobs, failed
}

// rollUpToNow rolls the counters up until their cursor passes the database's now() as
// of the call: every job finished before the call is then counted.
func (b *testBundle) rollUpToNow(t *testing.T) {
	t.Helper()
	now, err := store.DBNow(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := store.RollupCounts(b.ctx, b.db.Pool); err != nil {
			t.Fatal(err)
		}
		st, err := store.ReadCountersState(b.ctx, b.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		to := st.RolledTo
		if !to.Before(now) {
			return
		}
		if b.ctx.Err() != nil {
			t.Fatalf("the counters' cursor stays at %s, before %s", to, now)
		}
	}
}

func sameCounts(t *testing.T, what string, got, want map[counterKey]int64) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Errorf("%s: counters %v, want %v", what, got, want)
	}
}

// The counters count every finish exactly once while completions, failures,
// cancellations and roll-ups run concurrently; a job retried and finished again counts
// again; pruning finished jobs leaves the counters as they are.
func TestRollupCountsExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const perQueue = 120
	for _, q := range []string{"default", "billing"} {
		for i := range perQueue {
			p := store.InsertParams{Queue: q, Kind: fmt.Sprintf("kind-%d", i%3), MaxAttempts: 2}
			if i%10 == 0 {
				// Holds its key once finished: it is finished in place, in the hot set.
				p.UniqueKey = fmt.Sprintf("%s-%d", q, i)
				p.Unique = queue.UniqueOpts{ByState: queue.JobStates()[:]}
			}
			b.insert(t, p)
		}
	}
	// Workers claim in batches and finish each job by its id: completed, failed once and
	// retried at once, discarded, or cancelled. Meanwhile roll-ups run without pause.
	finishAll := func(t *testing.T, q string) error {
		for {
			js, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: q, WorkerID: "w-" + q, Limit: 7, Lease: time.Minute})
			if err != nil {
				return err
			}
			if len(js) == 0 {
				// Failed jobs wait, retryable, for the scheduler. The other queue's loop
				// may have promoted this queue's jobs already, so the loop ends only when
				// none of this queue's jobs is left unfinished.
				if _, err := store.PromoteDue(b.ctx, b.db.Pool, 1000); err != nil {
					return err
				}
				var left int
				if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE queue = $1 AND finished_at IS NULL`, q).Scan(&left); err != nil {
					return err
				}
				if left == 0 {
					return nil
				}
				continue
			}
			var batch []queue.Lease
			for _, j := range js {
				l := store.LeaseOf(j)
				switch {
				case j.ID%5 == 1 && j.Attempt == 1:
					_, err = store.Fail(b.ctx, b.db.Pool, l, store.FailParams{Err: "try again"})
				case j.ID%7 == 2:
					_, err = store.Fail(b.ctx, b.db.Pool, l, store.FailParams{Err: "bad input", Discard: true})
				case j.ID%11 == 3:
					_, err = store.CancelJob(b.ctx, b.db.Pool, j.ID, "not needed")
				default:
					batch = append(batch, l)
				}
				if err != nil {
					return err
				}
			}
			if rejected, err := store.CompleteMany(b.ctx, b.db.Pool, "w-"+q, batch); err != nil || len(rejected) != 0 {
				return fmt.Errorf("complete %d jobs: %d rejected, %w", len(batch), len(rejected), err)
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	stop := make(chan struct{})
	var rollups sync.WaitGroup
	for range 2 {
		rollups.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := store.RollupCounts(b.ctx, b.db.Pool); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for _, q := range []string{"default", "billing"} {
		wg.Go(func() {
			if err := finishAll(t, q); err != nil {
				errs <- fmt.Errorf("queue %s: %w", q, err)
			}
		})
	}
	wg.Wait()
	close(stop)
	rollups.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	b.rollUpToNow(t)
	wantJobs, wantFailed := b.direct(t)
	var total int64
	for _, n := range wantJobs {
		total += n
	}
	if total != 2*perQueue {
		t.Fatalf("%d jobs finished, want %d: %v", total, 2*perQueue, wantJobs)
	}
	for _, st := range []string{"completed", "discarded", "cancelled"} {
		if wantJobs[counterKey{"default", "kind-0", st}] == 0 && wantJobs[counterKey{"default", "kind-1", st}] == 0 {
			t.Fatalf("no %s job in the default queue: %v", st, wantJobs)
		}
	}
	gotJobs, gotFailed := b.counted(t)
	sameCounts(t, "after concurrent finishes", gotJobs, wantJobs)
	sameCounts(t, "failed attempts after concurrent finishes", gotFailed, wantFailed)

	// Retry completed jobs, those in history and those holding their key in the hot set,
	// and complete them again: each finish counts.
	var retried []int64
	rows, err := b.db.Pool.Query(b.ctx, `
		(SELECT id FROM fenceq_jobs_hot WHERE state = 'completed' AND queue = 'default' ORDER BY id LIMIT 3)
		UNION ALL
		(SELECT id FROM fenceq_jobs_history WHERE state = 'completed' AND queue = 'default' ORDER BY id LIMIT 3)`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		retried = append(retried, id)
	}
	rows.Close()
	if len(retried) != 6 || b.tableOf(t, retried[0]) != "hot" || b.tableOf(t, retried[5]) != "history" {
		t.Fatalf("retried %v: want key holders and history rows", retried)
	}
	// A job carries its errors through a retry: they count again when it finishes again.
	again, errorsAgain := map[counterKey]int64{}, map[counterKey]int64{}
	for _, id := range retried {
		j, err := store.RetryJob(b.ctx, b.db.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		k := counterKey{j.Queue, j.Kind, "completed"}
		again[k]++
		errorsAgain[k] += int64(len(j.Errors))
	}
	// Roll up while they wait: nothing changes.
	b.rollUpToNow(t)
	gotJobs, _ = b.counted(t)
	sameCounts(t, "after the retries", gotJobs, wantJobs)
	if err := finishAll(t, "default"); err != nil {
		t.Fatal(err)
	}
	b.rollUpToNow(t)
	for k, n := range again {
		wantJobs[k] += n
	}
	for k, n := range errorsAgain {
		if n != 0 {
			wantFailed[k] += n
		}
	}
	gotJobs, gotFailed = b.counted(t)
	sameCounts(t, "after the retried jobs completed again", gotJobs, wantJobs)
	sameCounts(t, "failed attempts after the retried jobs completed again", gotFailed, wantFailed)

	// Retention deletes the jobs; the counters stay.
	for {
		n, err := store.PruneFinished(b.ctx, b.db.Pool, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if left, _ := b.direct(t); len(left) != 0 {
		t.Fatalf("finished jobs left after pruning: %v", left)
	}
	b.rollUpToNow(t)
	gotJobs, gotFailed = b.counted(t)
	sameCounts(t, "after pruning", gotJobs, wantJobs)
	sameCounts(t, "failed attempts after pruning", gotFailed, wantFailed)
}

// A job finished in a transaction that is still open is not passed over: the roll-up's
// horizon stays before that transaction's start, and the job is counted once it commits.
func TestRollupWaitsForAnOpenFinish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Kind: "slow"})
	js := b.claim(t, "w", 1, time.Minute)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	var started time.Time
	if err := tx.QueryRow(b.ctx, `SELECT now()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(b.ctx, tx, store.LeaseOf(js[0])); err != nil {
		t.Fatal(err)
	}
	// The finish is stamped with the transaction's start, now in the past.
	b.insert(t, store.InsertParams{Kind: "later"})
	r, err := store.RollupCounts(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if r.Skipped || r.To.After(started) {
		t.Fatalf("roll-up %+v passed the open transaction's start %s", r, started)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.rollUpToNow(t)
	got, _ := b.counted(t)
	sameCounts(t, "after the commit", got, map[counterKey]int64{{"default", "slow", "completed"}: 1})
}

// A roll-up while another holds the cursor skips; the counts' readers refuse windows
// the counters do not keep.
func TestRollupSkipsWhileAnotherRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM fenceq_job_counts_cursor FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	r, err := store.RollupCounts(b.ctx, b.db.Pool)
	if err != nil || !r.Skipped {
		t.Fatalf("roll-up beside a locked cursor: %+v, %v; want skipped", r, err)
	}
	if _, err := store.RollupCounts(b.ctx, tx); err == nil {
		t.Fatal("a roll-up in a transaction was accepted")
	}
	_ = tx.Rollback(b.ctx)
	for _, w := range []time.Duration{0, -time.Minute, store.CounterRetention + time.Minute} {
		if _, err := store.CountErrorsByKind(b.ctx, b.db.Pool, w); !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("CountErrorsByKind(%s): %v, want ErrInvalid", w, err)
		}
	}
	if _, err := store.CountQueues(b.ctx, b.db.Pool, queue.CountParams{Window: 25 * time.Hour}); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("CountQueues beyond the counters' retention: %v", err)
	}
}

// Errors per kind: discarded jobs and the failed attempts of finished jobs of the
// window, most first.
func TestCountErrorsByKind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"flaky", "flaky", "broken", "fine"} {
		b.insert(t, store.InsertParams{Kind: k, MaxAttempts: 3})
	}
	for {
		js := b.claim(t, "w", 10, time.Minute)
		if len(js) == 0 {
			n, err := store.PromoteDue(b.ctx, b.db.Pool, 100)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			continue
		}
		for _, j := range js {
			l := store.LeaseOf(j)
			var err error
			switch {
			case j.Kind == "broken":
				_, err = store.Fail(b.ctx, b.db.Pool, l, store.FailParams{Err: "no", Discard: true})
			case j.Kind == "flaky" && j.Attempt < 3:
				_, err = store.Fail(b.ctx, b.db.Pool, l, store.FailParams{Err: "later"})
			default:
				err = store.Complete(b.ctx, b.db.Pool, l)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	b.rollUpToNow(t)
	got, err := store.CountErrorsByKind(b.ctx, b.db.Pool, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := []queue.KindErrors{{Kind: "flaky", Failed: 4}, {Kind: "broken", Discarded: 1, Failed: 1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("errors by kind: %+v, want %+v", got, want)
	}
}

// ListQueues counts unfinished jobs in the hot set and finished ones from the counters:
// its statement does not read history, a finished job counts once rolled up, and
// deleting it from history leaves the count as it was.
func TestListQueuesReadsNoHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		b.insert(t, store.InsertParams{Queue: "mail", Kind: fmt.Sprintf("kind-%d", i%2)})
	}
	b.insert(t, store.InsertParams{Queue: "reports"})
	got, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "mail", WorkerID: "w", Limit: 3, Lease: time.Minute})
	if err != nil || len(got) != 3 {
		t.Fatalf("claim 3 from mail: %d jobs, %v", len(got), err)
	}
	// Two complete, one keeps running.
	for _, j := range got[:2] {
		if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(j)); err != nil {
			t.Fatal(err)
		}
	}
	b.rollUpToNow(t)

	want := map[string]map[queue.State]int64{
		"mail":    {queue.StateAvailable: 2, queue.StateRunning: 1, queue.StateCompleted: 2},
		"reports": {queue.StateAvailable: 1},
	}
	check := func(when string) {
		t.Helper()
		qs, err := store.ListQueues(b.ctx, b.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]map[queue.State]int64{}
		for _, q := range qs {
			have[q.Name] = q.Counts
		}
		if len(have) != len(want) {
			t.Fatalf("%s: queues %v, want %v", when, have, want)
		}
		for name, counts := range want {
			if !maps.Equal(have[name], counts) {
				t.Errorf("%s: queue %s counts %v, want %v", when, name, have[name], counts)
			}
		}
	}
	check("after the roll-up")
	n, err := b.db.Pool.Exec(b.ctx, `DELETE FROM fenceq_jobs_history WHERE queue = 'mail'`)
	if err != nil || n.RowsAffected() != 2 {
		t.Fatalf("delete the finished jobs from history: %d rows, %v", n.RowsAffected(), err)
	}
	check("after their rows left history")

	var plan string
	if err := b.db.Pool.QueryRow(b.ctx, "EXPLAIN (FORMAT JSON) "+store.SQLListQueues,
		int64(store.CounterRetention/time.Microsecond)).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan, "fenceq_job_counts") || strings.Contains(plan, "fenceq_jobs_history") {
		t.Fatalf("the statement reads history:\n%s", plan)
	}
}

// RollupCountsIfStale rolls up when no roll-up ever ran or the last one is older than
// the age given, by the database's clock, and leaves the counters alone otherwise.
func TestRollupCountsIfStale(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ran := func(when string, want bool) {
		t.Helper()
		got, err := store.RollupCountsIfStale(b.ctx, b.db.Pool, time.Hour)
		if err != nil || got != want {
			t.Fatalf("%s: ran %t, %v; want %t", when, got, err, want)
		}
	}
	ran("before any roll-up", true)
	ran("right after one", false)
	// The cursor goes back with the roll-up's time: a roll-up always passes a cursor
	// further back than its horizon can lag (rollupMaxLag), so it moves rolled_at
	// whatever else the database is running.
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_job_counts_cursor
		SET rolled_at = now() - interval '2 hours', rolled_to = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	before, err := store.ReadCountersState(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	ran("two hours after the last", true)
	after, err := store.ReadCountersState(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if !after.RolledAt.After(before.RolledAt) {
		t.Fatalf("rolled_at %s after the roll-up, %s before; want it moved", after.RolledAt, before.RolledAt)
	}
}
