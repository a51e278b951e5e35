package store

import (
	"context"
	"errors"
	"fmt"
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
	if p.State != "" && !p.State.Valid() {
		return invalid("state", "%q is not a job state (want one of %v)", p.State, jobStates)
	}
	if p.BeforeID < 0 {
		return invalid("before_id", "%d is negative", p.BeforeID)
	}
	if p.ScanLimit < 0 {
		return invalid("scan_limit", "%d is negative", p.ScanLimit)
	}
	if len(p.Args) > queue.MaxArgsSearchLen {
		return invalid("args", "search text is %d bytes, longer than %d", len(p.Args), queue.MaxArgsSearchLen)
	}
	if p.Args != "" && p.Args != queue.StorableText(p.Args, len(p.Args)) {
		return invalid("args", "search text must be valid UTF-8 without NUL bytes")
	}
	if p.Tag != "" {
		if err := queue.ValidateName("tag", p.Tag, queue.MaxTagLen); err != nil {
			return err
		}
	}
	if p.LiveWithin < 0 {
		return invalid("live_within", "%s is negative", p.LiveWithin)
	}
	if p.LiveWithin == 0 {
		p.LiveWithin = queue.DefaultLiveWithin
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	return nil
}

// filtered reports whether a filter applies that no index serves in id order.
func listFiltered(p *queue.ListParams) bool {
	return p.Queue != "" || p.Kind != "" || p.Args != "" || p.Tag != "" || p.UnknownKinds ||
		(p.State != "" && p.State != queue.StateRunning)
}

// ListJobs returns the newest jobs matching the filter (older than BeforeID, when set).
func ListJobs(ctx context.Context, db queue.DBTX, p queue.ListParams) ([]*queue.JobRow, error) {
	p.ScanLimit = 0
	page, err := ListJobsPage(ctx, db, p)
	if err != nil {
		return nil, err
	}
	return page.Jobs, nil
}

// ListJobsPage returns one page of the newest jobs matching the filter, with the
// position of the next page. Pages are keyset pages on the id (never OFFSET). With
// ScanLimit, a filter examines at most that many jobs (see ListParams.ScanLimit);
// running jobs are always listed from their own index, however many jobs there are.
//
// Each call is planned for its arguments, so that a state filter meets the partial
// index of that state.
func ListJobsPage(ctx context.Context, db queue.DBTX, p queue.ListParams) (*queue.JobPage, error) {
	if err := validateList(&p); err != nil {
		return nil, err
	}
	windowed := p.ScanLimit > 0 && listFiltered(&p)
	args := []any{customPlan, string(p.State), p.Queue, p.Kind, p.Limit + 1, p.BeforeID, p.Args}
	if windowed {
		args = append(args, p.ScanLimit)
	}
	extra, args := listExtra(&p, args)
	sql := listJobsSQL(extra)
	if windowed {
		sql = listJobsWindowSQL(extra)
	}
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
		return page, nil
	}
	if !windowed {
		return page, nil
	}
	// A short page: the window was used up, or no job older than it exists.
	var lowest *int64
	var examined int
	if err := db.QueryRow(ctx, sqlJobsWindowEnd, customPlan, p.BeforeID, p.ScanLimit).Scan(&lowest, &examined); err != nil {
		return nil, fmt.Errorf("list jobs: end of the search window: %w", err)
	}
	if examined == p.ScanLimit && lowest != nil && *lowest > 1 {
		page.Next, page.Searched = *lowest, true
	}
	return page, nil
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
			return nil, fmt.Errorf("%s: %w", op, gerr)
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

// ListQueues returns every queue that has settings or jobs.
func ListQueues(ctx context.Context, db queue.DBTX) ([]queue.QueueInfo, error) {
	rows, err := db.Query(ctx, sqlListQueues)
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
