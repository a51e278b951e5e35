package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// GetJob returns one job, or ErrNotFound.
func GetJob(ctx context.Context, db DBTX, id int64) (*JobRow, error) {
	j, err := scanJob(db.QueryRow(ctx, sqlGetJob, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("job %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get job %d: %w", id, err)
	}
	return j, nil
}

// ListParams filters ListJobs; empty fields match everything.
type ListParams struct {
	State State
	Queue string
	Kind  string
	// Tag keeps the jobs carrying this tag.
	Tag string
	// UnknownKinds keeps the jobs waiting to run (available, scheduled, retryable) that
	// no live worker can run: none of the workers serving the job's queue that
	// heartbeated within LiveWithin has a handler for its kind.
	UnknownKinds bool
	// LiveWithin is how recent a worker's heartbeat must be for UnknownKinds to count it.
	// Defaults to DefaultLiveWithin.
	LiveWithin time.Duration
	// Limit defaults to 100.
	Limit int
}

// DefaultLiveWithin is the default of ListParams.LiveWithin: a few heartbeat intervals of
// a worker with the default lease.
const DefaultLiveWithin = 2 * time.Minute

// ListJobs returns the newest jobs matching the filter.
func ListJobs(ctx context.Context, db DBTX, p ListParams) ([]*JobRow, error) {
	if p.State != "" && !p.State.Valid() {
		return nil, invalid("state", "%q is not a job state (want one of %v)", p.State, jobStates)
	}
	if p.Tag != "" {
		if err := ValidateName("tag", p.Tag, MaxTagLen); err != nil {
			return nil, err
		}
	}
	if p.LiveWithin < 0 {
		return nil, invalid("live_within", "%s is negative", p.LiveWithin)
	}
	if p.LiveWithin == 0 {
		p.LiveWithin = DefaultLiveWithin
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	sql, args := listJobsSQL(p)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	jobs, err := collectJobs(rows)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}

// CountUnknownKinds counts the jobs ListParams.UnknownKinds lists: waiting jobs that no
// worker serving their queue and heartbeating within liveWithin (0: DefaultLiveWithin)
// has a handler for.
func CountUnknownKinds(ctx context.Context, db DBTX, liveWithin time.Duration) (int64, error) {
	if liveWithin <= 0 {
		liveWithin = DefaultLiveWithin
	}
	var n int64
	if err := db.QueryRow(ctx, sqlCountUnknownKinds, micros(liveWithin)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count jobs of unknown kinds: %w", err)
	}
	return n, nil
}

// adminWrite runs an operator statement on one job and explains a miss: ErrNotFound for an
// unknown id, ErrWrongState when the job exists but the action does not apply.
func adminWrite(ctx context.Context, db DBTX, op string, id int64, sql string, args ...any) (*JobRow, error) {
	j, err := scanJob(db.QueryRow(ctx, sql, append([]any{id}, args...)...))
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
			op, id, cur.State, derefString(cur.UniqueKey), ErrWrongState)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%s job %d: %w", op, id, err)
	}
	cur, gerr := GetJob(ctx, db, id)
	if gerr != nil {
		return nil, fmt.Errorf("%s: %w", op, gerr)
	}
	return nil, fmt.Errorf("%s job %d: it is %s: %w", op, id, cur.State, ErrWrongState)
}

// RetryJob makes a scheduled, retryable or finished job available now.
func RetryJob(ctx context.Context, db DBTX, id int64) (*JobRow, error) {
	return adminWrite(ctx, db, "retry", id, sqlRetryJob)
}

// CancelJob cancels a job that has not finished. If it is running, its lease is revoked
// (generation bumped, revoked event recorded): the holder's writes are rejected from then
// on, and its context is cancelled at its next heartbeat.
func CancelJob(ctx context.Context, db DBTX, id int64, reason string) (*JobRow, error) {
	if reason == "" {
		reason = "cancelled by operator"
	}
	return adminWrite(ctx, db, "cancel", id, sqlCancelJob, reason)
}

// RequeueJob forces a job of any state back to available now, revoking the lease of a
// running job by bumping its generation.
func RequeueJob(ctx context.Context, db DBTX, id int64) (*JobRow, error) {
	return adminWrite(ctx, db, "requeue", id, sqlRequeueJob)
}

// QueueInfo is one queue: its settings and job counts by state.
type QueueInfo struct {
	Name   string          `json:"name"`
	Paused bool            `json:"paused"`
	Counts map[State]int64 `json:"counts"`
}

// SetQueuePaused pauses or resumes a queue. Workers claim nothing from a paused queue;
// jobs already running continue.
func SetQueuePaused(ctx context.Context, db DBTX, name string, paused bool) error {
	if err := ValidateQueue(name); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sqlSetQueuePaused, name, paused); err != nil {
		return fmt.Errorf("set queue %q paused=%v: %w", name, paused, err)
	}
	return nil
}

// ListQueues returns every queue that has settings or jobs.
func ListQueues(ctx context.Context, db DBTX) ([]QueueInfo, error) {
	rows, err := db.Query(ctx, sqlListQueues)
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	defer rows.Close()
	var out []QueueInfo
	for rows.Next() {
		var q QueueInfo
		var counts map[string]int64
		if err := rows.Scan(&q.Name, &q.Paused, &counts); err != nil {
			return nil, fmt.Errorf("list queues: %w", err)
		}
		q.Counts = make(map[State]int64, len(counts))
		for k, v := range counts {
			q.Counts[State(k)] = v
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
