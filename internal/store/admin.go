package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
)

// GetJob returns one job, or ErrNotFound.
func GetJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	j, err := scanJob(db.QueryRow(ctx, sqlGetJob, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("job %d: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %d: %w", id, err)
	}
	return j, nil
}

func validateList(p *queue.ListParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if p.BeforeID < 0 {
		return invalid("before_id", "%d is negative", p.BeforeID)
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	return nil
}

// ListJobs returns the newest jobs matching the filter (older than BeforeID, when set).
func ListJobs(ctx context.Context, db queue.DBTX, p queue.ListParams) ([]*queue.JobRow, error) {
	page, err := ListJobsPage(ctx, db, p)
	if err != nil {
		return nil, err
	}
	return page.Jobs, nil
}

// ListJobsPage returns one page of the newest jobs matching the filter, with the
// position of the next page. Pages are keyset pages on the id (never OFFSET), over the
// hot set and history alike: each condition of the filter has an index on both.
//
// The statement holds only the conditions the filter sets, and is planned for its
// arguments, so that the planner weighs each condition's index against walking the
// primary key in id order.
func ListJobsPage(ctx context.Context, db queue.DBTX, p queue.ListParams) (*queue.JobPage, error) {
	if err := validateList(&p); err != nil {
		return nil, err
	}
	sql, args := listSQL(&p)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	jobs, err := collectJobs(rows)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	page := &queue.JobPage{Jobs: jobs}
	if len(jobs) > p.Limit {
		page.Jobs = jobs[:p.Limit]
		page.Next = page.Jobs[p.Limit-1].ID
	}
	return page, nil
}

// listSQL is the statement of one page of ListJobsPage (one job more than the page, to
// tell whether another follows) and its arguments, the query mode first.
func listSQL(p *queue.ListParams) (string, []any) {
	where, args := filterSQL(&p.JobFilter, p.BeforeID, []any{customPlan})
	args = append(args, p.Limit+1)
	return `SELECT ` + jobColumns + ` FROM fenceq_jobs` + where + fmt.Sprintf(`
ORDER BY id DESC LIMIT $%d`, len(args)-1), args
}

// CountMatching counts the jobs f matches with an id below beforeID (0: any), up to
// max (0: no bound): a count of max means at least max. It returns the highest id
// among them too (0 when none), which a bulk action confirmed on this count takes as
// its bound, so that it acts on no job enqueued since.
func CountMatching(ctx context.Context, db queue.DBTX, f queue.JobFilter, beforeID int64, max int) (n int, top int64, err error) {
	if err := f.Validate(); err != nil {
		return 0, 0, err
	}
	where, args := filterSQL(&f, beforeID, []any{customPlan})
	limit := ""
	if max > 0 {
		args = append(args, max)
		limit = fmt.Sprintf(" LIMIT $%d", len(args)-1)
	}
	sql := `SELECT count(*)::int, COALESCE(max(id), 0) FROM (SELECT id FROM fenceq_jobs` + where + limit + `) m`
	if err := db.QueryRow(ctx, sql, args...).Scan(&n, &top); err != nil {
		return 0, 0, fmt.Errorf("count matching jobs: %w", err)
	}
	return n, top, nil
}

// CountUnknownKinds counts the jobs ListParams.UnknownKinds lists: waiting jobs that no
// worker serving their queue and heartbeating within liveWithin (0: DefaultLiveWithin)
// has a handler for.
func CountUnknownKinds(ctx context.Context, db queue.DBTX, liveWithin time.Duration) (int64, error) {
	if liveWithin <= 0 {
		liveWithin = queue.DefaultLiveWithin
	}
	var n int64
	if err := db.QueryRow(ctx, sqlCountUnknownKinds, micros(liveWithin)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count jobs of unknown kinds: %w", err)
	}
	return n, nil
}

// adminWrite runs an operator statement on one job and explains a miss: ErrNotFound for an
// unknown id, ErrWrongState when the job exists but the action does not apply.
func adminWrite(ctx context.Context, db queue.DBTX, op string, id int64, sql string, args ...any) (*queue.JobRow, error) {
	j, err := scanJob(db.QueryRow(ctx, sql, append([]any{id}, args...)...))
	if errors.Is(err, pgx.ErrNoRows) {
		// The statement may have waited for a finishing write that moved the job from
		// the hot set to history: its snapshot, taken before, sees the job in neither
		// table. A second statement sees where it is now.
		j, err = scanJob(db.QueryRow(ctx, sql, append([]any{id}, args...)...))
	}
	if err == nil {
		return j, nil
	}
	if IsUniqueViolation(err, uniqueIndex) {
		// Back in an unfinished state, the job would hold its unique key again, but
		// another job holds it now.
		cur, gerr := GetJob(ctx, db, id)
		if gerr != nil {
			// In a transaction, the violation aborted it: nothing more can be read.
			return nil, fmt.Errorf("%s job %d: another job now holds its unique key: %w", op, id, queue.ErrWrongState)
		}
		return nil, fmt.Errorf("%s job %d: it is %s and another job now holds its unique key %q: %w",
			op, id, cur.State, derefString(cur.UniqueKey), queue.ErrWrongState)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%s job %d: %w", op, id, err)
	}
	cur, gerr := GetJob(ctx, db, id)
	if gerr != nil {
		return nil, fmt.Errorf("%s: %w", op, gerr)
	}
	return nil, fmt.Errorf("%s job %d: it is %s: %w", op, id, cur.State, queue.ErrWrongState)
}

// RetryJob makes a scheduled, retryable or finished job available now.
func RetryJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	var j *queue.JobRow
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		var err error
		if !dist {
			j, err = adminWrite(ctx, db, "retry", id, sqlRetryJob)
			return err
		}
		if j, err = scanJob(db.QueryRow(ctx, sqlRetryHot, id)); !errors.Is(err, pgx.ErrNoRows) {
			if err != nil {
				return fmt.Errorf("retry job %d: %w", id, err)
			}
			return nil
		}
		j, err = adminWrite(ctx, db, "retry", id, sqlRetryHistory)
		return err
	})
	return j, err
}

// CancelJob cancels a job that has not finished. If it is running, its lease is revoked
// (generation bumped, revoked event recorded): the holder's writes are rejected from then
// on, and its context is cancelled at its next heartbeat.
func CancelJob(ctx context.Context, db queue.DBTX, id int64, reason string) (*queue.JobRow, error) {
	if reason == "" {
		reason = "cancelled by operator"
	}
	return adminWrite(ctx, db, "cancel", id, sqlCancelJob, reason)
}

// RequeueJob forces a job of any state back to available now, revoking the lease of a
// running job by bumping its generation.
func RequeueJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return adminWrite(ctx, db, "requeue", id, sqlRequeueJob)
}

// SetQueuePaused pauses or resumes a queue. Workers claim nothing from a paused queue;
// jobs already running continue.
func SetQueuePaused(ctx context.Context, db queue.DBTX, name string, paused bool) error {
	if err := queue.ValidateQueue(name); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sqlSetQueuePaused, name, paused); err != nil {
		return fmt.Errorf("set queue %q paused=%v: %w", name, paused, err)
	}
	return nil
}

// QueueExists reports whether a queue is in use: it has a settings row, a job in the
// hot set, a registered worker that serves it, or a job that finished within
// finishedWithin (0: finished jobs are not looked at).
func QueueExists(ctx context.Context, db queue.DBTX, name string, finishedWithin time.Duration) (bool, error) {
	if err := queue.ValidateQueue(name); err != nil {
		return false, err
	}
	if finishedWithin < 0 {
		return false, invalid("finished_within", "%s is negative", finishedWithin)
	}
	var ok bool
	if err := db.QueryRow(ctx, sqlQueueExists, name, micros(finishedWithin)).Scan(&ok); err != nil {
		return false, fmt.Errorf("look up queue %q: %w", name, err)
	}
	return ok, nil
}

// ListQueues returns every queue that has settings, unfinished jobs or jobs counted as
// finished within CounterRetention, with the unfinished jobs by state (the hot set) and
// the jobs finished within CounterRetention by final state (the job counters, as fresh
// as the last RollupCounts). It reads no history, so its cost does not grow with it.
func ListQueues(ctx context.Context, db queue.DBTX) ([]queue.QueueInfo, error) {
	rows, err := db.Query(ctx, sqlListQueues, micros(CounterRetention))
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	defer rows.Close()
	var out []queue.QueueInfo
	for rows.Next() {
		var q queue.QueueInfo
		var counts map[string]int64
		if err := rows.Scan(&q.Name, &q.Paused, &counts); err != nil {
			return nil, fmt.Errorf("list queues: %w", err)
		}
		q.Counts = make(map[queue.State]int64, len(counts))
		for k, v := range counts {
			q.Counts[queue.State(k)] = v
		}
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	return out, nil
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DeleteJob deletes a job that is not running and returns the row it deleted. A running
// job is refused with ErrWrongState: cancel or requeue it first, which revokes its lease.
func DeleteJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return adminWrite(ctx, db, "delete", id, sqlDeleteJob)
}

// AddQueue records a queue's settings row, so that the queue is listed (and can be
// paused) before any job is enqueued in it. It fails with ErrExists when the row exists.
func AddQueue(ctx context.Context, db queue.DBTX, name string) error {
	if err := queue.ValidateQueue(name); err != nil {
		return err
	}
	var got string
	err := db.QueryRow(ctx, sqlAddQueue, name).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("add queue %q: %w", name, queue.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("add queue %q: %w", name, err)
	}
	return nil
}

// RemoveQueue deletes a queue's settings row (its paused flag with it). It fails with
// ErrWrongState while unfinished jobs wait in the queue, and with ErrNotFound when the
// queue has no settings row.
func RemoveQueue(ctx context.Context, db queue.DBTX, name string) error {
	if err := queue.ValidateQueue(name); err != nil {
		return err
	}
	var existed, deleted bool
	var busy int64
	if err := db.QueryRow(ctx, sqlRemoveQueue, name).Scan(&existed, &busy, &deleted); err != nil {
		return fmt.Errorf("remove queue %q: %w", name, err)
	}
	switch {
	case !existed:
		return fmt.Errorf("remove queue %q: %w", name, queue.ErrNotFound)
	case !deleted:
		return fmt.Errorf("remove queue %q: %d unfinished jobs wait in it: %w", name, busy, queue.ErrWrongState)
	}
	return nil
}

// LockMatching locks, in a transaction, the jobs among ids that f still matches, in
// both tables, and returns their ids, highest first. A bulk action then acts on exactly
// these: a job that changed since it was listed (another state, finished, deleted) and
// no longer matches is left alone, and one that matches cannot change until the action
// commits.
func LockMatching(ctx context.Context, tx queue.DBTX, f queue.JobFilter, ids []int64) ([]int64, error) {
	f.IDs = ids
	var out []int64
	for _, table := range []string{hotTable, historyTable} {
		where, args := filterSQL(&f, 0, []any{customPlan})
		rows, err := tx.Query(ctx, `SELECT id FROM `+table+where+` ORDER BY id DESC FOR UPDATE`, args...)
		if err != nil {
			return nil, fmt.Errorf("lock matching jobs: %w", err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, fmt.Errorf("lock matching jobs: %w", err)
		}
		out = append(out, got...)
	}
	slices.SortFunc(out, func(a, b int64) int { return cmp.Compare(b, a) })
	return out, nil
}
