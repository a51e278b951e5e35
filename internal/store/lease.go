package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ClaimParams describes one claim.
type ClaimParams struct {
	Queue    string
	WorkerID string
	// Limit is the most jobs to claim; size it to the worker's free slots.
	Limit int
	// Lease is how long the lease lasts without a heartbeat.
	Lease time.Duration
	// After, when set, claims only jobs after this position in claim order (priority,
	// run_at, id). See ClaimCursor.
	After *ClaimCursor
	// Kinds, when set, claims only jobs of these kinds: the kinds the claimer has
	// handlers for. Jobs of other kinds are stepped over and stay available, their
	// attempts untouched, for a claimer that knows them. Nil claims every kind.
	//
	// A claim steps over such jobs one by one, so a queue whose head holds many of them
	// makes every claim from the start of the order walk them: a claimer that finds its
	// claims short should look for them with OtherKindAhead and claim after the last one
	// (a floor), from the start only now and then, as with ClaimCursor.
	Kinds []string
}

// ClaimCursor is a position in claim order: priority, then run_at, then id.
//
// Every claimed job leaves a dead entry among the available ones in the claim index,
// ahead of the jobs still waiting, until VACUUM removes it (and none can be removed
// while an old transaction holds the horizon). A claim from the start of the order
// walks all of them; a claim after the position where the previous claim ended starts
// past them. Jobs that become available behind a cursor (released, reaped or retried
// jobs with an old run_at, a job of a more urgent priority) are only seen by a claim
// without a cursor: a claimer using cursors must also claim without one regularly.
type ClaimCursor struct {
	Priority int16
	RunAt    time.Time
	ID       int64
}

// Less reports whether c comes before d in claim order.
func (c ClaimCursor) Less(d ClaimCursor) bool {
	if c.Priority != d.Priority {
		return c.Priority < d.Priority
	}
	if !c.RunAt.Equal(d.RunAt) {
		return c.RunAt.Before(d.RunAt)
	}
	return c.ID < d.ID
}

// CursorAfter returns the position of the last of jobs in claim order, or nil for none:
// the cursor for the next claim.
func CursorAfter(jobs []*queue.JobRow) *ClaimCursor {
	if len(jobs) == 0 {
		return nil
	}
	last := ClaimCursor{Priority: jobs[0].Priority, RunAt: jobs[0].RunAt, ID: jobs[0].ID}
	for _, j := range jobs[1:] {
		if c := (ClaimCursor{Priority: j.Priority, RunAt: j.RunAt, ID: j.ID}); last.Less(c) {
			last = c
		}
	}
	return &last
}

// Claim leases up to Limit available jobs of one queue to a worker. Each claimed job's
// lease_gen and attempt grow by one; the returned rows carry the new lease. Jobs locked
// by other claimers are skipped (FOR UPDATE SKIP LOCKED), so concurrent claimers never
// receive the same job. A paused queue yields nothing.
func Claim(ctx context.Context, db queue.DBTX, p ClaimParams) ([]*queue.JobRow, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	if p.Lease <= 0 {
		return nil, invalid("lease", "%s must be positive", p.Lease)
	}
	args := []any{customPlan, p.Queue, p.Limit, p.WorkerID, micros(p.Lease)}
	if a := p.After; a != nil {
		args = append(args, a.Priority, a.RunAt, a.ID)
	}
	var sql string
	switch {
	case p.Kinds == nil && p.After == nil:
		sql = sqlClaim
	case p.Kinds == nil:
		sql = sqlClaimAfter
	case p.After == nil:
		sql, args = sqlClaimKinds, append(args, p.Kinds)
	default:
		sql, args = sqlClaimKindsAfter, append(args, p.Kinds)
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("claim jobs in queue %q: %w", p.Queue, err)
	}
	jobs, err := collectClaimed(rows, p.Queue, p.WorkerID, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("claim jobs in queue %q: %w", p.Queue, err)
	}
	return jobs, nil
}

// ClaimManyParams describes one claim over many queues.
type ClaimManyParams struct {
	WorkerID string
	// Lease is how long the leases last without a heartbeat.
	Lease time.Duration
	// Kinds, when set, claims only jobs of these kinds (see ClaimParams.Kinds).
	Kinds []string
	// Queues are the queues to claim from, each once, with a limit and a cursor of its
	// own. Queues with a Limit of 0 or less are left out.
	Queues []QueueClaim
	// Max, when positive, is the most jobs claimed in all. The queues are claimed from
	// in their order until Max jobs are taken; when that many come back, the queues
	// that returned fewer than their Limit may not have been claimed from at all.
	Max int
}

// QueueClaim is one queue of a ClaimMany.
type QueueClaim struct {
	Name string
	// Limit is the most jobs to claim from the queue: its free slots.
	Limit int
	// After, when set, claims only the queue's jobs after this position in claim order
	// (see ClaimCursor).
	After *ClaimCursor
}

// ClaimMany leases available jobs of many queues to a worker, up to each queue's Limit
// and up to Max in all, in one statement whatever the number of queues: each queue's
// jobs are taken in claim order from its cursor on, as Claim takes them, paused queues
// yield nothing, and the rows (each with its Queue) come in no particular order. Its cost grows with the jobs
// claimed and the queues listed, not with a round trip per queue, so a worker serving
// many queues polls them all with one statement.
//
// On a Citus coordinator whose fenceq tables are distributed, each queue is claimed with
// Claim, one routed statement per queue: the many-queue statement has not been shown
// to be routed whole to the schema's node (and committed in one phase) there.
func ClaimMany(ctx context.Context, db queue.DBTX, p ClaimManyParams) ([]*queue.JobRow, error) {
	if p.Lease <= 0 {
		return nil, invalid("lease", "%s must be positive", p.Lease)
	}
	n, total := 0, 0
	seen := make(map[string]struct{}, len(p.Queues))
	for _, q := range p.Queues {
		if _, dup := seen[q.Name]; dup {
			return nil, invalid("queues", "queue %q listed twice", q.Name)
		}
		seen[q.Name] = struct{}{}
		if q.Limit > 0 {
			n++
			total += q.Limit
		}
	}
	if n == 0 {
		return nil, nil
	}
	if p.Max > 0 {
		total = min(total, p.Max)
	}
	names := make([]string, 0, n)
	limits := make([]int32, 0, n)
	prios := make([]*int16, 0, n)
	runAts := make([]*time.Time, 0, n)
	ids := make([]*int64, 0, n)
	for _, q := range p.Queues {
		if q.Limit <= 0 {
			continue
		}
		names = append(names, q.Name)
		limits = append(limits, int32(min(q.Limit, 1<<31-1)))
		if a := q.After; a != nil {
			prios, runAts, ids = append(prios, &a.Priority), append(runAts, &a.RunAt), append(ids, &a.ID)
		} else {
			prios, runAts, ids = append(prios, nil), append(runAts, nil), append(ids, nil)
		}
	}
	var jobs []*queue.JobRow
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		if dist {
			var err error
			jobs, err = claimEach(ctx, db, p, total)
			return err
		}
		sql, args := sqlClaimMany, []any{customPlan, p.WorkerID, micros(p.Lease), total, names, limits, prios, runAts, ids}
		if p.Kinds != nil {
			sql, args = sqlClaimManyKinds, append(args, p.Kinds)
		}
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		jobs, err = collectClaimed(rows, "", p.WorkerID, total)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim jobs in %d queues: %w", n, err)
	}
	return jobs, nil
}

// claimEach is ClaimMany as one Claim per queue, in order, until total jobs are taken.
func claimEach(ctx context.Context, db queue.DBTX, p ClaimManyParams, total int) ([]*queue.JobRow, error) {
	var out []*queue.JobRow
	for _, q := range p.Queues {
		if len(out) >= total {
			break
		}
		jobs, err := Claim(ctx, db, ClaimParams{Queue: q.Name, WorkerID: p.WorkerID, Limit: min(q.Limit, total-len(out)),
			Lease: p.Lease, After: q.After, Kinds: p.Kinds})
		if err != nil {
			return out, err
		}
		out = append(out, jobs...)
	}
	return out, nil
}

// QueueBefore is one queue of OtherKindsAhead: the position before which to look (nil
// for anywhere in the queue).
type QueueBefore struct {
	Name   string
	Before *ClaimCursor
}

// OtherKindsAhead is OtherKindAhead for many queues in one statement: it returns, in the
// order of queues, the position of the last available job of each queue whose kind is
// not among kinds, before the queue's position, or nil when there is none. On a Citus
// coordinator whose fenceq tables are distributed it asks OtherKindAhead once per queue
// (see ClaimMany).
func OtherKindsAhead(ctx context.Context, db queue.DBTX, kinds []string, queues []QueueBefore) ([]*ClaimCursor, error) {
	out := make([]*ClaimCursor, len(queues))
	if len(queues) == 0 {
		return out, nil
	}
	names := make([]string, len(queues))
	prios := make([]*int16, len(queues))
	runAts := make([]*time.Time, len(queues))
	ids := make([]*int64, len(queues))
	for i, q := range queues {
		names[i] = q.Name
		if b := q.Before; b != nil {
			prios[i], runAts[i], ids[i] = &b.Priority, &b.RunAt, &b.ID
		}
	}
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		if dist {
			for i, q := range queues {
				c, err := OtherKindAhead(ctx, db, q.Name, kinds, q.Before)
				if err != nil {
					return err
				}
				out[i] = c
			}
			return nil
		}
		rows, err := db.Query(ctx, sqlOtherKindsAhead, customPlan, kinds, names, prios, runAts, ids)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var ord int64
			var c ClaimCursor
			if err := rows.Scan(&ord, &c.Priority, &c.RunAt, &c.ID); err != nil {
				return err
			}
			if ord < 1 || ord > int64(len(out)) {
				return fmt.Errorf("position %d of a queue out of range", ord)
			}
			out[ord-1] = &c
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("look for other kinds ahead in %d queues: %w", len(queues), err)
	}
	return out, nil
}

// OtherKindAhead returns the position of the last available job of queue whose kind is
// not among kinds, before the position before in claim order (anywhere when before is
// nil), or nil when there is none. A claimer with ClaimParams.Kinds whose claim from the
// start came back short calls it with the first job it claimed: a position it returns is
// a floor, after which the claimer's next claims can start without walking the jobs of
// other kinds at the head of the queue again.
func OtherKindAhead(ctx context.Context, db queue.DBTX, queue string, kinds []string, before *ClaimCursor) (*ClaimCursor, error) {
	var p *int16
	var at *time.Time
	var id *int64
	if before != nil {
		p, at, id = &before.Priority, &before.RunAt, &before.ID
	}
	var c ClaimCursor
	err := db.QueryRow(ctx, sqlOtherKindAhead, customPlan, queue, kinds, p, at, id).Scan(&c.Priority, &c.RunAt, &c.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look for other kinds ahead in queue %q: %w", queue, err)
	}
	return &c, nil
}

// CursorBefore returns the position of the first of jobs in claim order, or nil for
// none.
func CursorBefore(jobs []*queue.JobRow) *ClaimCursor {
	if len(jobs) == 0 {
		return nil
	}
	first := ClaimCursor{Priority: jobs[0].Priority, RunAt: jobs[0].RunAt, ID: jobs[0].ID}
	for _, j := range jobs[1:] {
		if c := (ClaimCursor{Priority: j.Priority, RunAt: j.RunAt, ID: j.ID}); c.Less(first) {
			first = c
		}
	}
	return &first
}

// leaseArrays splits leases into the id and generation arrays the batched statements
// take ($1::bigint[], $2::bigint[]).
func leaseArrays(leases []queue.Lease) (ids, gens []int64) {
	ids = make([]int64, len(leases))
	gens = make([]int64, len(leases))
	for i, l := range leases {
		ids[i], gens[i] = l.JobID, l.Gen
	}
	return ids, gens
}

// HeartbeatResult says what became of each lease sent to Heartbeat.
type HeartbeatResult struct {
	// Renewed leases now expire one lease duration after the database's now().
	Renewed []queue.Lease
	// Busy leases are still held but were not renewed because their row was locked by
	// another transaction at that moment (typically the holder's own fenced commit).
	Busy []queue.Lease
	// Finished leases ended by a write of the holder's own (a completion, failure,
	// snooze, cancel or release that landed): nothing to renew, nothing lost.
	Finished []queue.Lease
	// Lost leases are no longer held: stop the job now, it can write nothing.
	Lost []queue.Lease
	// WorkerRegistered is false when the worker's fenceq_workers row is missing.
	WorkerRegistered bool
}

// Heartbeat renews, in one statement, every lease a worker holds and heartbeats the
// worker's row. Each renewal is fenced by the lease generation.
func Heartbeat(ctx context.Context, db queue.DBTX, workerID string, leases []queue.Lease, lease time.Duration) (HeartbeatResult, error) {
	ids, gens := leaseArrays(leases)
	var heldIDs, heldGens, renewedIDs, renewedGens []int64
	var heldRunning []bool
	var workerRows int64
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		sql := sqlHeartbeat
		if dist {
			sql = sqlHeartbeatRouted
		}
		return db.QueryRow(ctx, sql, customPlan, ids, gens, micros(lease), workerID).
			Scan(&heldIDs, &heldGens, &heldRunning, &renewedIDs, &renewedGens, &workerRows)
	})
	if err != nil {
		return HeartbeatResult{}, fmt.Errorf("heartbeat %d leases of worker %s: %w", len(leases), workerID, err)
	}
	res := HeartbeatResult{WorkerRegistered: workerRows > 0}
	type key struct{ id, gen int64 }
	const (
		finished = iota // the generation matches, the job is no longer running
		busy            // running under the lease, not renewed (row locked)
		renewed
	)
	held := make(map[key]int, len(heldIDs))
	for i, id := range heldIDs {
		if heldRunning[i] {
			held[key{id, heldGens[i]}] = busy
		} else {
			held[key{id, heldGens[i]}] = finished
		}
	}
	for i, id := range renewedIDs {
		held[key{id, renewedGens[i]}] = renewed
	}
	for _, l := range leases {
		how, ok := held[key{l.JobID, l.Gen}]
		switch {
		case !ok:
			res.Lost = append(res.Lost, l)
		case how == renewed:
			res.Renewed = append(res.Renewed, l)
		case how == busy:
			res.Busy = append(res.Busy, l)
		default:
			res.Finished = append(res.Finished, l)
		}
	}
	return res, nil
}

func fencedWrite(ctx context.Context, db queue.DBTX, op string, l queue.Lease, sql fencedSQL, args ...any) (queue.State, error) {
	all := append([]any{l.JobID, l.Gen, l.Holder, op}, args...)
	var state string
	lost := false
	var recordErr error
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		q := sql.one
		if dist {
			q = sql.routed
		}
		err := db.QueryRow(ctx, q, all...).Scan(&state)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		lost = true
		if dist {
			recordErr = RecordStaleWrite(ctx, db, l, op)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("%s job %d: %w", op, l.JobID, err)
	}
	if lost {
		lostErr := fmt.Errorf("%s job %d at lease generation %d: %w", op, l.JobID, l.Gen, queue.ErrLeaseLost)
		if recordErr != nil {
			return "", errors.Join(lostErr, recordErr)
		}
		return "", lostErr
	}
	return queue.State(state), nil
}

// Complete marks the job completed if the lease is still held, else returns ErrLeaseLost
// and records a stale_write_rejected lease event.
func Complete(ctx context.Context, db queue.DBTX, l queue.Lease) error {
	return CompleteWithOutput(ctx, db, l, nil)
}

// CompleteWithOutput is Complete that also stores the job's output (a JSON value of at
// most MaxOutputBytes; nil for none) in the same fenced statement: written if and only
// if the completion is.
func CompleteWithOutput(ctx context.Context, db queue.DBTX, l queue.Lease, output []byte) error {
	if err := queue.ValidateOutput(output); err != nil {
		return fmt.Errorf("complete job %d: %w", l.JobID, err)
	}
	_, err := fencedWrite(ctx, db, "complete", l, sqlComplete, output)
	return err
}

// CompleteMany completes many jobs in one statement, each fenced by its generation. It
// returns the leases that were lost (their completion was rejected and recorded).
func CompleteMany(ctx context.Context, db queue.DBTX, holder string, leases []queue.Lease) ([]queue.Lease, error) {
	return CompleteManyWithOutputs(ctx, db, holder, leases, nil)
}

// CompleteManyWithOutputs is CompleteMany that also stores each job's output in the same
// statement, fenced like its completion: outputs[i] belongs to leases[i] (nil for none),
// or outputs is nil when no job has one.
func CompleteManyWithOutputs(ctx context.Context, db queue.DBTX, holder string, leases []queue.Lease, outputs [][]byte) ([]queue.Lease, error) {
	return completeMany(ctx, db, holder, leases, outputs, false)
}

// CompleteManyMoving is CompleteManyWithOutputs for jobs that each keep no unique key
// once completed (MovesOutOnCompletion of each one's row, which nothing changes while it
// runs): every completion moves its job to history, and the statement leaves out the
// in-place update of a job that keeps its key, which would cost each job of the batch a
// probe of an index. A job that does keep its key is not completed and comes back as
// lost. On Citus it is CompleteManyWithOutputs.
func CompleteManyMoving(ctx context.Context, db queue.DBTX, holder string, leases []queue.Lease, outputs [][]byte) ([]queue.Lease, error) {
	return completeMany(ctx, db, holder, leases, outputs, true)
}

// completeMany is CompleteManyWithOutputs, in the moving form when moving.
func completeMany(ctx context.Context, db queue.DBTX, holder string, leases []queue.Lease, outputs [][]byte, moving bool) ([]queue.Lease, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	if outputs != nil && len(outputs) != len(leases) {
		return nil, invalid("outputs", "%d outputs for %d leases", len(outputs), len(leases))
	}
	for i, o := range outputs {
		if err := queue.ValidateOutput(o); err != nil {
			return nil, fmt.Errorf("complete job %d: %w", leases[i].JobID, err)
		}
	}
	ids, gens := leaseArrays(leases)
	var lost []queue.Lease
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		if !dist {
			var lostIDs, lostGens []int64
			q := sqlCompleteMany
			if moving {
				q = sqlCompleteManyMoving
			}
			if err := db.QueryRow(ctx, q, customPlan, ids, gens, holder, outputs).Scan(&lostIDs, &lostGens); err != nil {
				return err
			}
			lost = pickLeases(leases, lostIDs, lostGens, true)
			return nil
		}
		var doneIDs, doneGens []int64
		if err := db.QueryRow(ctx, sqlCompleteManyRouted, customPlan, ids, gens, outputs).Scan(&doneIDs, &doneGens); err != nil {
			return err
		}
		lost = pickLeases(leases, doneIDs, doneGens, false)
		evs := make([]eventRow, len(lost))
		for i, l := range lost {
			evs[i] = eventRow{jobID: l.JobID, gen: l.Gen, worker: &holder, kind: queue.EventStaleWriteRejected, detail: "complete"}
		}
		return insertEvents(ctx, db, evs)
	})
	if err != nil {
		return nil, fmt.Errorf("complete %d jobs: %w", len(leases), err)
	}
	return lost, nil
}

// pickLeases returns the leases whose (id, generation) pair is among ids and gens when
// in is true, and those whose pair is not when in is false; nil when there are none.
func pickLeases(leases []queue.Lease, ids, gens []int64, in bool) []queue.Lease {
	if in && len(ids) == 0 {
		return nil
	}
	type key struct{ id, gen int64 }
	listed := make(map[key]bool, len(ids))
	for i, id := range ids {
		listed[key{id, gens[i]}] = true
	}
	var out []queue.Lease
	for _, l := range leases {
		if listed[key{l.JobID, l.Gen}] == in {
			out = append(out, l)
		}
	}
	return out
}

// FailParams describes a failed attempt.
type FailParams struct {
	Err string
	// Trace is a stack trace, for panics.
	Trace string
	// Backoff is the delay before the retry, measured from the database's now().
	Backoff time.Duration
	// SinceAttempted measures Backoff from the attempt's attempted_at (the database's
	// time of the claim) instead, and never earlier than now(): a retry planned for an
	// instant derived from the row's times (see the root package's NextRetry).
	SinceAttempted bool
	// Discard finishes the job as discarded whatever attempts remain.
	Discard bool
}

// Maximum sizes of the error text and trace stored per attempt.
const (
	maxErrorLen = 4 << 10
	maxTraceLen = 16 << 10
)

// Fail records a failed attempt: the job becomes retryable after Backoff, or discarded
// when it has used its attempts or Discard is set. It returns the new state, or
// ErrLeaseLost.
func Fail(ctx context.Context, db queue.DBTX, l queue.Lease, p FailParams) (queue.State, error) {
	return fencedWrite(ctx, db, "fail", l, sqlFail, p.Discard, micros(p.Backoff),
		queue.StorableText(p.Err, maxErrorLen), queue.StorableText(p.Trace, maxTraceLen), p.SinceAttempted)
}

// Snooze puts the job back to run after d without using up an attempt.
func Snooze(ctx context.Context, db queue.DBTX, l queue.Lease, d time.Duration) error {
	if d < 0 {
		d = 0
	}
	_, err := fencedWrite(ctx, db, "snooze", l, sqlSnooze, micros(d))
	return err
}

// Cancel finishes the job as cancelled, recording the reason.
func Cancel(ctx context.Context, db queue.DBTX, l queue.Lease, reason string) error {
	_, err := fencedWrite(ctx, db, "cancel", l, sqlCancel, queue.StorableText(reason, maxErrorLen))
	return err
}

// Release gives a running job back (available, attempt not counted) — what a worker does
// with the jobs it still holds when it shuts down. It is a compare-and-set like every
// other lease write: a lease that was already revoked is not touched.
func Release(ctx context.Context, db queue.DBTX, l queue.Lease) error {
	_, err := fencedWrite(ctx, db, "release", l, sqlRelease)
	return err
}

// lockLease is the fence inside a transaction: it locks the job row if and only if the
// lease is still held, which keeps the reaper and every other writer out until the
// transaction ends. It returns ErrLeaseLost when the lease is gone; roll back then.
func lockLease(ctx context.Context, tx pgx.Tx, l queue.Lease) error {
	var state string
	err := tx.QueryRow(ctx, sqlLockLease, l.JobID, l.Gen).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("lock job %d at lease generation %d: %w", l.JobID, l.Gen, queue.ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("lock job %d: %w", l.JobID, err)
	}
	return nil
}

// completeLocked completes a job inside the transaction that locked it with lockLease,
// storing its output (nil for none); moving is LeaseTx.MovesOut.
func completeLocked(ctx context.Context, tx pgx.Tx, l queue.Lease, output []byte, moving bool) error {
	if err := queue.ValidateOutput(output); err != nil {
		return fmt.Errorf("complete job %d: %w", l.JobID, err)
	}
	dist, err := selfNotify(ctx, tx)
	if err != nil {
		return fmt.Errorf("complete job %d: %w", l.JobID, err)
	}
	tag, err := tx.Exec(ctx, completeLockedSQL(false, dist, moving), l.JobID, l.Gen, output)
	if err != nil {
		return fmt.Errorf("complete job %d: %w", l.JobID, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("complete job %d at lease generation %d: %w", l.JobID, l.Gen, queue.ErrLeaseLost)
	}
	return nil
}

// RecordStaleWrite records a stale_write_rejected lease event for a write that was
// rejected inside a transaction which then rolled back (the event cannot live in it).
func RecordStaleWrite(ctx context.Context, db queue.DBTX, l queue.Lease, op string) error {
	if _, err := db.Exec(ctx, sqlRecordStale, l.JobID, l.Gen, l.Holder, op); err != nil {
		return fmt.Errorf("record stale write on job %d: %w", l.JobID, err)
	}
	return nil
}

// TxFunc is the body of a fenced transaction.
type TxFunc func(ctx context.Context, tx pgx.Tx) error

// LeaseTx says what WithLease does besides running its function.
type LeaseTx struct {
	// Complete completes the job in the same transaction, after fn: the job's results
	// and its completion commit together.
	Complete bool
	// Output, with Complete, returns the job's output to store with the completion (a
	// JSON value of at most MaxOutputBytes; nil for none). It is called after fn, so
	// fn may still produce it. Nil stores none.
	Output func() []byte
	// Op names the write in errors and in the stale_write_rejected event. Defaults to
	// "commit" with Complete, "with lease" without.
	Op string
	// MovesOut, with Complete, says that the job keeps no unique key once completed:
	// its row holds none, or StateCompleted is not among its unique states (no statement
	// changes either while it runs). Its completion always moves it to history, and then
	// leaves out the in-place update of a job that keeps its key, whose setup costs
	// every completion. Set it only from the job's row (MovesOutOnCompletion): a job
	// that does keep its key is then not completed, and the commit fails as if its
	// lease were lost, writing nothing.
	MovesOut bool
}

// MovesOutOnCompletion reports whether a completion moves job to history: it holds no
// unique key, or StateCompleted is not among the states in which it holds it
// (LeaseTx.MovesOut).
func MovesOutOnCompletion(job *queue.JobRow) bool {
	return job.UniqueKey == nil || !slices.Contains(job.UniqueStates, queue.StateCompleted)
}

// WithLease runs fn in one transaction fenced by the lease:
//
//	BEGIN; SELECT … WHERE id = $1 AND lease_gen = $2 AND state = 'running' FOR UPDATE;
//	fn(tx); [UPDATE … SET state = 'completed' … WHERE id = $1 AND lease_gen = $2;] COMMIT
//
// The row lock keeps the reaper and every other writer out until COMMIT, so the
// transaction wins or loses as a whole. If the lease is gone, nothing fn would write is
// kept and the error matches ErrLeaseLost (a stale_write_rejected event is recorded).
// If fn fails, the transaction rolls back and fn's error is returned; the job stays
// running under the lease. Keep slow calls out of fn: the row lock is held until COMMIT.
//
// On a *pgxpool.Pool or a *pgx.Conn the statements are pipelined and nothing is sent
// before fn's first statement. When that is an Exec with arguments or a QueryRow, BEGIN
// and the lock travel with it in one round trip; the lock raises when the lease is gone,
// so the server skips the statement, which returns an error matching ErrLeaseLost, and
// WithLease fails with ErrLeaseLost whatever fn returns. Any other first call (Query,
// SendBatch, CopyFrom, Prepare, Begin, an Exec without arguments or with a pgx option)
// sends BEGIN and the lock in a round trip of their own first. The completion (or
// nothing, without Complete) and COMMIT go in one more round trip, so the transaction
// costs one round trip besides fn's own statements; a fn that sends nothing costs one in
// all (BEGIN, the lock, the completion and COMMIT in one pipeline). fn thus runs before
// the lease is checked, but none of its statements runs unless the lock, in the same
// transaction and before it, found the lease held. A completion that matched no row
// fails in the database, so the COMMIT behind it never runs. Any other db runs one
// statement per round trip and checks the lease before fn runs. Either way fn gets a
// pgx.Tx whose Commit is refused (the transaction commits when fn returns) and whose
// Rollback ends the transaction, making WithLease fail; it must not be used after fn
// returns.
func WithLease(ctx context.Context, db queue.Beginner, l queue.Lease, how LeaseTx, fn TxFunc) error {
	op := leaseOp(how)
	conn, release, err := pipelineConn(ctx, db)
	if err != nil {
		return fmt.Errorf("%s of job %d: %w", op, l.JobID, err)
	}
	if conn == nil {
		return withLeaseTx(ctx, db, l, how, op, fn)
	}
	defer release()
	return withLeasePipelined(ctx, conn, l, how, op, fn)
}

// pipelineConn returns the connection a fenced transaction pipelines its statements on:
// one acquired from a pool (release gives it back) or the connection itself; nil for
// any other db, which runs one statement per round trip.
func pipelineConn(ctx context.Context, db queue.Beginner) (conn *pgx.Conn, release func(), err error) {
	switch c := db.(type) {
	case *pgxpool.Pool:
		pc, err := c.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("acquire a connection: %w", err)
		}
		return pc.Conn(), pc.Release, nil
	case *pgx.Conn:
		return c, func() {}, nil
	}
	return nil, nil, nil
}

// leaseOp is how.Op with its default.
func leaseOp(how LeaseTx) string {
	switch {
	case how.Op != "":
		return how.Op
	case how.Complete:
		return "commit"
	}
	return "with lease"
}

// codeInvalidTextRepresentation is the error a checked statement that matched no row
// raises (see exactlyOneRow).
const codeInvalidTextRepresentation = "22P02"

// isMissed reports whether err is the error of a checked statement (exactlyOneRow)
// whose text starts with missed: it matched no row.
func isMissed(err error, missed string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == codeInvalidTextRepresentation &&
		strings.Contains(pgErr.Message, missed)
}

// completeLockedErr is the error of a checked completion inside the fenced transaction:
// ErrLeaseLost when it matched no row, err otherwise.
func completeLockedErr(l queue.Lease, err error) error {
	if isMissed(err, completionMissed) {
		return fmt.Errorf("complete job %d at lease generation %d: the locked row no longer matched: %w",
			l.JobID, l.Gen, queue.ErrLeaseLost)
	}
	return fmt.Errorf("complete job %d: %w", l.JobID, err)
}

// withLeaseTx is WithLease on any Beginner, one statement per round trip.
func withLeaseTx(ctx context.Context, db queue.Beginner, l queue.Lease, how LeaseTx, op string, fn TxFunc) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s of job %d: begin: %w", op, l.JobID, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := lockLease(ctx, tx, l); err != nil {
		if errors.Is(err, queue.ErrLeaseLost) {
			_ = tx.Rollback(ctx)
			if rerr := RecordStaleWrite(ctx, db, l, op); rerr != nil {
				return errors.Join(err, rerr)
			}
		}
		return err
	}
	if _, err := runLeaseFn(ctx, tx, l, op, fn); err != nil {
		return err
	}
	if how.Complete {
		var output []byte
		if how.Output != nil {
			output = how.Output()
		}
		if err := completeLocked(ctx, tx, l, output, how.MovesOut); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s of job %d: commit: %w", op, l.JobID, err)
	}
	return nil
}

// Landed reports whether a write of ours under the lease already took effect: the job
// still carries our generation but is no longer running. Only the lease holder moves a
// job out of running without bumping the generation, so this settles a write whose
// outcome was unknown (the reply to COMMIT was lost) without writing again.
func Landed(ctx context.Context, db queue.DBTX, l queue.Lease) (queue.State, bool, error) {
	var gen int64
	var state string
	err := db.QueryRow(ctx, sqlJobLease, l.JobID).Scan(&gen, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, fmt.Errorf("job %d: %w", l.JobID, queue.ErrNotFound)
	}
	if err != nil {
		return "", false, fmt.Errorf("read job %d: %w", l.JobID, err)
	}
	return queue.State(state), gen == l.Gen && queue.State(state) != queue.StateRunning, nil
}
