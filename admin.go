package fenceq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// The operator API: what the fenceq CLI and the dashboard (package fenceqweb) do, as
// functions an application can call for its own tools. Each takes a queue.DBTX: pass a
// pool, or a pgx.Tx to make the action part of your transaction. Errors match
// queue.ErrNotFound (no such job, queue or schedule), queue.ErrWrongState (the action does
// not apply to the job's state) and queue.ErrInvalid (bad input, naming the field).

// GetJob returns one job.
func GetJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return store.GetJob(ctx, db, id)
}

// ListJobs returns one page of jobs matching p's filter, newest first, over the hot set
// and history alike. Page on with p.BeforeID = page.Next while Next is not 0.
func ListJobs(ctx context.Context, db queue.DBTX, p queue.ListParams) (*queue.JobPage, error) {
	return store.ListJobsPage(ctx, db, p)
}

// CountMatching counts the jobs f matches whose id is at most upToID (0: any), up to
// max (0: no bound; a count of max means at least max), and returns the highest id
// among them (0 when none). Pass that id as BulkOptions.UpToID to act on what was
// counted and on no job enqueued since.
func CountMatching(ctx context.Context, db queue.DBTX, f queue.JobFilter, upToID int64, max int) (n int, top int64, err error) {
	if upToID < 0 {
		return 0, 0, &queue.ValidationError{Field: "up_to_id", Reason: fmt.Sprintf("%d is negative", upToID)}
	}
	before := int64(0)
	if upToID > 0 {
		before = upToID + 1
	}
	return store.CountMatching(ctx, db, f, before, max)
}

// ListLeaseEvents returns the newest lease events (revocations, rejected stale writes,
// lost heartbeats, holders found alive), newest first: those of one job, or of every job
// when jobID is 0. limit bounds them; 0 or less means 100.
func ListLeaseEvents(ctx context.Context, db queue.DBTX, jobID int64, limit int) ([]queue.LeaseEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	return store.ListLeaseEvents(ctx, db, jobID, limit)
}

// RetryJob makes a scheduled, retryable or finished job available now. A job whose
// attempts are used up gets one more.
func RetryJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return auditedJob(ctx, db, queue.AuditRetry, id, "", func(db queue.DBTX) (*queue.JobRow, error) {
		return store.RetryJob(ctx, db, id)
	})
}

// CancelJob cancels a job that has not finished, recording reason (empty: "cancelled by
// operator") as its last error. A running job's lease is revoked in the same statement:
// its holder can write nothing from then on, and its context is cancelled at its next
// heartbeat.
func CancelJob(ctx context.Context, db queue.DBTX, id int64, reason string) (*queue.JobRow, error) {
	return auditedJob(ctx, db, queue.AuditCancel, id, reason, func(db queue.DBTX) (*queue.JobRow, error) {
		return store.CancelJob(ctx, db, id, reason)
	})
}

// RequeueJob forces a job of any state back to available now. A running job's lease is
// revoked in the same statement.
func RequeueJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return auditedJob(ctx, db, queue.AuditRequeue, id, "", func(db queue.DBTX) (*queue.JobRow, error) {
		return store.RequeueJob(ctx, db, id)
	})
}

// DeleteJob deletes a job that is not running and returns the deleted row. A running
// job is refused (queue.ErrWrongState): cancel or requeue it first, which revokes its
// lease, so that no fenced write of its holder races the delete. A finished job that
// still holds its unique key releases it; its outbox rows stay (their job_id names a
// job that no longer exists, as after retention).
func DeleteJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return auditedJob(ctx, db, queue.AuditDelete, id, "", func(db queue.DBTX) (*queue.JobRow, error) {
		return store.DeleteJob(ctx, db, id)
	})
}

// auditedJob runs one operator action on a job and records it in the audit trail, in
// one transaction.
func auditedJob(ctx context.Context, db queue.DBTX, action queue.AuditAction, id int64, detail string,
	fn func(db queue.DBTX) (*queue.JobRow, error)) (*queue.JobRow, error) {
	var j *queue.JobRow
	err := audited(ctx, db, &queue.AuditRecord{Action: action, JobIDs: []int64{id}, Detail: detail}, func(db queue.DBTX) error {
		var err error
		j, err = fn(db)
		return err
	})
	if err != nil {
		return nil, err
	}
	return j, nil
}

// audited runs fn and writes rec (its Actor taken from ctx) in one transaction on db: a
// record exists exactly when the action committed. On a pgx.Tx the transaction is a
// savepoint of it, and both commit with the caller's transaction.
func audited(ctx context.Context, db queue.DBTX, rec *queue.AuditRecord, fn func(db queue.DBTX) error) error {
	rec.Actor = ActorFrom(ctx)
	b, ok := db.(queue.Beginner)
	if !ok {
		return fmt.Errorf("%s: the database handle cannot open a transaction for the action and its audit record", rec.Action)
	}
	return pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return store.WriteAudit(ctx, tx, rec)
	})
}

type actorKey struct{}

// WithActor returns a copy of ctx under which the operator actions (RetryJob, CancelJobs,
// PauseQueue, ...) are recorded in the audit trail as taken by actor. The dashboard sets
// "dashboard:USER", "dashboard:token" or "dashboard:loopback", the CLI "cli:OSUSER".
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorFrom returns the actor WithActor set on ctx, or "api" when none was set.
func ActorFrom(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return "api"
}

// ListAudit returns audit records, newest first: every operator action, or those that
// named p.JobID.
func ListAudit(ctx context.Context, db queue.DBTX, p queue.AuditParams) ([]queue.AuditRecord, error) {
	return store.ListAudit(ctx, db, p)
}

// BulkResult reports what a bulk action did to the jobs its filter matched.
type BulkResult struct {
	// Matched is how many jobs matched the filter when they were examined.
	Matched int `json:"matched"`
	// Changed lists the ids of the jobs the action changed (or deleted).
	Changed []int64 `json:"changed"`
	// Skipped is how many matched jobs the action did not apply to: their state does
	// not allow it (queue.ErrWrongState: a running job is not deleted, a finished one
	// not cancelled), or they changed and no longer matched by the time their batch
	// reached them.
	Skipped int `json:"skipped"`
	// Batches is how many transactions the action committed.
	Batches int `json:"batches"`
}

// BulkOptions tunes a bulk action. The zero value is ready to use.
type BulkOptions struct {
	// BatchSize is how many jobs one transaction acts on, 1–MaxBulkBatchSize. Defaults
	// to DefaultBulkBatchSize.
	BatchSize int
	// UpToID, when positive, leaves out the jobs with a higher id: those enqueued after
	// the count an operator confirmed (see CountMatching).
	UpToID int64
	// Reason is recorded as the last error of each job CancelJobs cancels. Defaults to
	// "cancelled by operator".
	Reason string
	// Detail is recorded in each audit record of the action, e.g. the count confirmed.
	Detail string
}

// Limits of BulkOptions.BatchSize.
const (
	DefaultBulkBatchSize = 500
	MaxBulkBatchSize     = 5000
)

// RetryJobs retries every job that f matches, in batches of opts.BatchSize jobs newest
// first, each batch one transaction: its jobs are locked and checked against f again,
// each is changed by RetryJob's statement, and one audit record names the jobs changed.
// A job the action does not apply to is skipped and counted. The first other error
// stops the action and is returned with what the committed batches did. An empty filter
// is refused with ErrEmptyFilter; opts may be nil.
func RetryJobs(ctx context.Context, db queue.Beginner, f queue.JobFilter, opts *BulkOptions) (*BulkResult, error) {
	return bulkJobs(ctx, db, f, opts, queue.AuditRetry, func(ctx context.Context, db queue.DBTX, id int64) error {
		_, err := store.RetryJob(ctx, db, id)
		return err
	})
}

// CancelJobs cancels every unfinished job that f matches, as RetryJobs retries: each with
// CancelJob's statement, which revokes a running job's lease. Finished jobs are skipped.
func CancelJobs(ctx context.Context, db queue.Beginner, f queue.JobFilter, opts *BulkOptions) (*BulkResult, error) {
	reason := ""
	if opts != nil {
		reason = opts.Reason
	}
	return bulkJobs(ctx, db, f, opts, queue.AuditCancel, func(ctx context.Context, db queue.DBTX, id int64) error {
		_, err := store.CancelJob(ctx, db, id, reason)
		return err
	})
}

// RequeueJobs requeues every job that f matches, as RetryJobs retries: each with
// RequeueJob's statement, which revokes a running job's lease.
func RequeueJobs(ctx context.Context, db queue.Beginner, f queue.JobFilter, opts *BulkOptions) (*BulkResult, error) {
	return bulkJobs(ctx, db, f, opts, queue.AuditRequeue, func(ctx context.Context, db queue.DBTX, id int64) error {
		_, err := store.RequeueJob(ctx, db, id)
		return err
	})
}

// DeleteJobs deletes every job that f matches and that is not running, as RetryJobs
// retries: each with DeleteJob's statement. Running jobs are skipped: cancel or requeue
// them first.
func DeleteJobs(ctx context.Context, db queue.Beginner, f queue.JobFilter, opts *BulkOptions) (*BulkResult, error) {
	return bulkJobs(ctx, db, f, opts, queue.AuditDelete, func(ctx context.Context, db queue.DBTX, id int64) error {
		_, err := store.DeleteJob(ctx, db, id)
		return err
	})
}

// ErrEmptyFilter is returned by a bulk action whose filter sets nothing: it would act on
// every job. Set at least one field of queue.JobFilter.
var ErrEmptyFilter = errors.New("bulk action without a filter: it would act on every job")

// maxBatchAttempts bounds how often a batch that lost a deadlock is run again.
const maxBatchAttempts = 3

// bulkJobs applies one action to every job that f matches, batch by batch (see
// RetryJobs). Each job is changed with the same statement as the single-job call, in a
// savepoint, so each is fenced the same way (a running job's lease is revoked by the
// statement that changes it) and one job the action does not apply to leaves the rest of
// its batch alone.
func bulkJobs(ctx context.Context, db queue.Beginner, f queue.JobFilter, opts *BulkOptions, action queue.AuditAction,
	fn func(ctx context.Context, db queue.DBTX, id int64) error) (*BulkResult, error) {
	var o BulkOptions
	if opts != nil {
		o = *opts
	}
	if f.Empty() {
		return nil, fmt.Errorf("%s jobs: %w", action, ErrEmptyFilter)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("%s jobs: %w", action, err)
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBulkBatchSize
	}
	if o.BatchSize < 1 || o.BatchSize > MaxBulkBatchSize {
		return nil, fmt.Errorf("%s jobs: %w", action,
			&queue.ValidationError{Field: "batch_size", Reason: fmt.Sprintf("%d is outside 1–%d", o.BatchSize, MaxBulkBatchSize)})
	}
	if o.UpToID < 0 {
		return nil, fmt.Errorf("%s jobs: %w", action,
			&queue.ValidationError{Field: "up_to_id", Reason: fmt.Sprintf("%d is negative", o.UpToID)})
	}
	detail := o.Detail
	if action == queue.AuditCancel && o.Reason != "" {
		detail = strings.TrimSpace("reason: " + o.Reason + "; " + detail)
	}
	actor := ActorFrom(ctx)
	res := &BulkResult{Changed: []int64{}}
	before := int64(0)
	if o.UpToID > 0 {
		before = o.UpToID + 1
	}
	for {
		page, err := store.ListJobsPage(ctx, db, queue.ListParams{JobFilter: f, BeforeID: before, Limit: o.BatchSize})
		if err != nil {
			return res, fmt.Errorf("%s jobs: %w", action, err)
		}
		if len(page.Jobs) == 0 {
			break
		}
		ids := make([]int64, len(page.Jobs))
		for i, j := range page.Jobs {
			ids[i] = j.ID
		}
		var changed []int64
		for attempt := 1; ; attempt++ {
			changed, err = bulkBatch(ctx, db, f, ids, fn, &queue.AuditRecord{Actor: actor, Action: action, Filter: &f,
				Matched: len(ids), Detail: detail})
			if err == nil || !store.IsDeadlock(err) || attempt == maxBatchAttempts {
				break
			}
		}
		if err != nil {
			return res, fmt.Errorf("%s jobs: %w", action, err)
		}
		res.Matched += len(ids)
		res.Skipped += len(ids) - len(changed)
		res.Changed = append(res.Changed, changed...)
		if len(changed) > 0 {
			res.Batches++
		}
		if page.Next == 0 {
			break
		}
		before = page.Next
	}
	if len(res.Changed) == 0 {
		// Nothing changed: the record says the action was taken and what it found.
		rec := &queue.AuditRecord{Actor: actor, Action: action, Filter: &f, Matched: res.Matched, Detail: detail}
		if err := store.WriteAudit(ctx, db, rec); err != nil {
			return res, fmt.Errorf("%s jobs: %w", action, err)
		}
	}
	return res, nil
}

// bulkBatch acts on one batch in one transaction and returns the ids it changed.
func bulkBatch(ctx context.Context, db queue.Beginner, f queue.JobFilter, ids []int64,
	fn func(ctx context.Context, db queue.DBTX, id int64) error, rec *queue.AuditRecord) ([]int64, error) {
	var changed []int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		changed = nil
		locked, err := store.LockMatching(ctx, tx, f, ids)
		if err != nil {
			return err
		}
		for _, id := range locked {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := fn(ctx, sp, id); err != nil {
				if rerr := sp.Rollback(ctx); rerr != nil {
					return fmt.Errorf("job %d: %w (and rolling back its savepoint failed: %v)", id, err, rerr)
				}
				if errors.Is(err, queue.ErrWrongState) || errors.Is(err, queue.ErrNotFound) {
					continue
				}
				return fmt.Errorf("job %d: %w", id, err)
			}
			if err := sp.Commit(ctx); err != nil {
				return fmt.Errorf("job %d: %w", id, err)
			}
			changed = append(changed, id)
		}
		if len(changed) == 0 {
			return nil
		}
		rec.JobIDs = changed
		return store.WriteAudit(ctx, tx, rec)
	})
	if err != nil {
		return nil, err
	}
	return changed, nil
}

// ListQueues returns every queue that has settings, unfinished jobs or jobs that
// finished within the last day, with its job counts by state: the unfinished jobs, and
// the jobs that finished within the last day (the job counters' retention, in whole
// minutes, as fresh as the last RollupJobCounts). It reads no history, so its cost does
// not grow with the jobs retained; a job deleted or pruned still counts where it
// finished. For another window, see CountJobs.
func ListQueues(ctx context.Context, db queue.DBTX) ([]queue.QueueInfo, error) {
	return store.ListQueues(ctx, db)
}

// PauseQueue pauses a queue: no worker claims from it until it is resumed; jobs already
// running go on. A queue that has no settings row yet gets one.
func PauseQueue(ctx context.Context, db queue.DBTX, name string) error {
	return auditedName(ctx, db, queue.AuditPauseQueue, name, func(db queue.DBTX) error {
		return store.SetQueuePaused(ctx, db, name, true)
	})
}

// SetQueueLimit sets a queue's limit: at most max of its jobs running at once across
// every worker process, whatever they were enqueued with (0 removes the limit). It
// applies from the next claim: workers leave the queue out of their ordinary claims at
// once, and claim from it under its lock from their next maintenance pass
// (ReaperInterval) on; jobs already running above a lowered limit finish. The action is
// audited, its detail the new limit.
func SetQueueLimit(ctx context.Context, db queue.DBTX, name string, max int) error {
	rec := &queue.AuditRecord{Action: queue.AuditSetQueueLimit, Names: []string{name}, Detail: fmt.Sprintf("max_running=%d", max)}
	return audited(ctx, db, rec, func(db queue.DBTX) error {
		return store.SetQueueLimit(ctx, db, name, max)
	})
}

// ResumeQueue resumes a paused queue.
func ResumeQueue(ctx context.Context, db queue.DBTX, name string) error {
	return auditedName(ctx, db, queue.AuditResumeQueue, name, func(db queue.DBTX) error {
		return store.SetQueuePaused(ctx, db, name, false)
	})
}

// QueueExists reports whether a queue is in use: it has a settings row (AddQueue,
// PauseQueue), a job in the hot set (unfinished, or finished and holding its unique
// key), a registered worker that serves it, or a job that finished within
// finishedWithin (0: finished jobs are not looked at, so the answer reads no history).
// PauseQueue accepts a queue before its first job; a caller that must not create a
// queue by pausing it asks this first.
func QueueExists(ctx context.Context, db queue.DBTX, name string, finishedWithin time.Duration) (bool, error) {
	return store.QueueExists(ctx, db, name, finishedWithin)
}

// AddQueue records a queue's settings row, so that it is listed, and can be paused,
// before any job is enqueued in it (queue.ErrExists when it has one). Which queues a
// worker serves is its own configuration (Config.Queues, Worker.AddQueue).
func AddQueue(ctx context.Context, db queue.DBTX, name string) error {
	return auditedName(ctx, db, queue.AuditAddQueue, name, func(db queue.DBTX) error {
		return store.AddQueue(ctx, db, name)
	})
}

// RemoveQueue deletes a queue's settings row. It is refused (queue.ErrWrongState) while
// unfinished jobs wait in the queue, and fails with queue.ErrNotFound when the queue has
// no settings row.
func RemoveQueue(ctx context.Context, db queue.DBTX, name string) error {
	return auditedName(ctx, db, queue.AuditRemoveQueue, name, func(db queue.DBTX) error {
		return store.RemoveQueue(ctx, db, name)
	})
}

// ListWorkers returns the worker processes registered in fenceq_workers, with their
// queues, kinds, heartbeat age and running jobs.
func ListWorkers(ctx context.Context, db queue.DBTX) ([]queue.WorkerInfo, error) {
	return store.ListWorkers(ctx, db)
}

// CountJobs counts jobs by queue and state: unfinished jobs (each group of states
// capped by p.Cap), and jobs that finished within p.Window (at most a day, in whole
// minutes) from the job counters, as fresh as the last RollupJobCounts.
func CountJobs(ctx context.Context, db queue.DBTX, p queue.CountParams) (*queue.QueueCounts, error) {
	return store.CountQueues(ctx, db, p)
}

// JobThroughput returns the jobs that finished within p.Window, by state, and the failed
// attempts, in buckets equal parts of the window (1–1000, each whole minutes), from the
// job counters and, for the failed attempts of unfinished jobs, the hot set.
func JobThroughput(ctx context.Context, db queue.DBTX, p queue.CountParams, buckets int) (*queue.Throughput, error) {
	return store.ReadThroughput(ctx, db, p, buckets)
}

// RollupJobCounts adds the jobs finished since the last roll-up to the job counters that
// CountJobs, JobThroughput and CountErrorsByKind read, and returns what it counted.
// Every worker runs it every Config.CountersInterval; a dashboard or a tool can run it
// too, with a role that may write fenceq's tables. Concurrent roll-ups are safe: one counts, the
// others skip (Rollup.Skipped). A job is counted once per finish, at its finished_at
// minute, by queue, kind and final state, with the failed attempts its errors record.
// db must be a pool or a connection, not a transaction.
func RollupJobCounts(ctx context.Context, db queue.DBTX) (queue.Rollup, error) {
	return store.RollupCounts(ctx, db)
}

// RollupJobCountsIfStale runs RollupJobCounts when no roll-up ran within maxAge, by the
// database's clock, and reports whether it ran one: what a reader of the finished counts
// calls when it cannot count on a running worker to keep them fresh (the dashboard, the
// CLI's queues list and stats). An error means the counts may be behind; they can still
// be read.
func RollupJobCountsIfStale(ctx context.Context, db queue.DBTX, maxAge time.Duration) (bool, error) {
	return store.RollupCountsIfStale(ctx, db, maxAge)
}

// JobCountersState returns how far the job counters have been rolled up: how fresh the
// finished counts of CountJobs, JobThroughput and CountErrorsByKind are.
func JobCountersState(ctx context.Context, db queue.DBTX) (queue.CountersState, error) {
	return store.ReadCountersState(ctx, db)
}

// CountErrorsByKind counts, per kind, the jobs discarded and the failed attempts
// recorded by finished jobs over the last window (at most a day), from the job counters;
// the kinds with the most first, kinds without either left out.
func CountErrorsByKind(ctx context.Context, db queue.DBTX, window time.Duration) ([]queue.KindErrors, error) {
	return store.CountErrorsByKind(ctx, db, window)
}

// CountLeaseEvents counts the lease events of the last window, by kind. Every kind is
// present in the map, with 0 when none happened.
func CountLeaseEvents(ctx context.Context, db queue.DBTX, window time.Duration) (map[queue.LeaseEventKind]int64, error) {
	return store.CountLeaseEvents(ctx, db, window)
}

// CountUnknownKinds counts the jobs waiting to run that no worker which heartbeated
// within liveWithin can run: none serving the job's queue has a handler for its kind.
func CountUnknownKinds(ctx context.Context, db queue.DBTX, liveWithin time.Duration) (int64, error) {
	return store.CountUnknownKinds(ctx, db, liveWithin)
}

// ReadActivity returns the database-wide figures a health check and a metrics scrape
// read: the unfinished jobs by state, the oldest available job's age, and the live
// workers.
func ReadActivity(ctx context.Context, db queue.DBTX) (queue.Activity, error) {
	return store.ReadActivity(ctx, db)
}

// RemovePeriodic deletes a schedule and returns its last row. A schedule defined in a
// worker's code (Config.PeriodicJobs) comes back at that worker's next start.
func RemovePeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.PeriodicRow, error) {
	var row *queue.PeriodicRow
	err := auditedName(ctx, db, queue.AuditRemovePeriodic, name, func(db queue.DBTX) error {
		var err error
		row, err = store.RemovePeriodic(ctx, db, name)
		return err
	})
	return row, err
}

// PausePeriodic pauses a schedule: its slots pass without enqueueing until it is resumed.
func PausePeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.PeriodicRow, error) {
	var row *queue.PeriodicRow
	err := auditedName(ctx, db, queue.AuditPausePeriodic, name, func(db queue.DBTX) error {
		var err error
		row, err = store.SetPeriodicPaused(ctx, db, name, true)
		return err
	})
	return row, err
}

// ResumePeriodic resumes a paused schedule from its next slot.
func ResumePeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.PeriodicRow, error) {
	var row *queue.PeriodicRow
	err := auditedName(ctx, db, queue.AuditResumePeriodic, name, func(db queue.DBTX) error {
		var err error
		row, err = store.SetPeriodicPaused(ctx, db, name, false)
		return err
	})
	return row, err
}

// TriggerPeriodic enqueues one job of a schedule now, outside its slots, and returns it.
func TriggerPeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.JobRow, error) {
	var j *queue.JobRow
	rec := &queue.AuditRecord{Action: queue.AuditTriggerPeriodic, Names: []string{name}}
	err := audited(ctx, db, rec, func(db queue.DBTX) error {
		var err error
		if j, err = store.TriggerPeriodic(ctx, db, name); err == nil {
			rec.JobIDs = []int64{j.ID} // the job it enqueued
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return j, nil
}

// auditedName runs an operator action on a queue or schedule and records it in the
// audit trail, in one transaction.
func auditedName(ctx context.Context, db queue.DBTX, action queue.AuditAction, name string, fn func(db queue.DBTX) error) error {
	return audited(ctx, db, &queue.AuditRecord{Action: action, Names: []string{name}}, fn)
}
