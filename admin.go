package fenceq

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// ListJobs returns one page of jobs matching p, newest first. Page on with
// p.BeforeID = page.Next while Next is not 0.
func ListJobs(ctx context.Context, db queue.DBTX, p queue.ListParams) (*queue.JobPage, error) {
	return store.ListJobsPage(ctx, db, p)
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
	return store.RetryJob(ctx, db, id)
}

// CancelJob cancels a job that has not finished, recording reason (empty: "cancelled by
// operator") as its last error. A running job's lease is revoked in the same statement:
// its holder can write nothing from then on, and its context is cancelled at its next
// heartbeat.
func CancelJob(ctx context.Context, db queue.DBTX, id int64, reason string) (*queue.JobRow, error) {
	return store.CancelJob(ctx, db, id, reason)
}

// RequeueJob forces a job of any state back to available now. A running job's lease is
// revoked in the same statement.
func RequeueJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return store.RequeueJob(ctx, db, id)
}

// DeleteJob deletes a job that is not running and returns the deleted row. A running
// job is refused (queue.ErrWrongState): cancel or requeue it first, which revokes its
// lease, so that no fenced write of its holder races the delete.
func DeleteJob(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
	return store.DeleteJob(ctx, db, id)
}

// BulkResult reports what a bulk action did to the jobs its filter matched.
type BulkResult struct {
	// Matched is how many jobs matched the filter when they were examined.
	Matched int `json:"matched"`
	// Changed lists the ids of the jobs the action changed (or deleted).
	Changed []int64 `json:"changed"`
	// Skipped is how many matched jobs the action did not apply to: their state had
	// changed by the time the action reached them (queue.ErrWrongState) or they were
	// gone (queue.ErrNotFound).
	Skipped int `json:"skipped"`
}

// RetryJobs retries every job that f matches, page by page (f.Limit jobs a page, newest
// first), each with RetryJob's statement. A job whose state changed before the action
// reached it is skipped and counted; the first other error stops the action and is
// returned with the result so far. A filter that sets none of State, Queue, Kind, Tag,
// Args and UnknownKinds is refused with ErrEmptyFilter.
func RetryJobs(ctx context.Context, db queue.DBTX, f queue.ListParams) (*BulkResult, error) {
	return bulkJobs(ctx, db, f, "retry", func(ctx context.Context, id int64) error {
		_, err := store.RetryJob(ctx, db, id)
		return err
	})
}

// CancelJobs cancels every unfinished job that f matches, as RetryJobs retries: each with
// CancelJob's statement, which revokes a running job's lease.
func CancelJobs(ctx context.Context, db queue.DBTX, f queue.ListParams, reason string) (*BulkResult, error) {
	return bulkJobs(ctx, db, f, "cancel", func(ctx context.Context, id int64) error {
		_, err := store.CancelJob(ctx, db, id, reason)
		return err
	})
}

// RequeueJobs requeues every job that f matches, as RetryJobs retries: each with
// RequeueJob's statement, which revokes a running job's lease.
func RequeueJobs(ctx context.Context, db queue.DBTX, f queue.ListParams) (*BulkResult, error) {
	return bulkJobs(ctx, db, f, "requeue", func(ctx context.Context, id int64) error {
		_, err := store.RequeueJob(ctx, db, id)
		return err
	})
}

// DeleteJobs deletes every job that f matches and that is not running, as RetryJobs
// retries: each with DeleteJob's statement. Running jobs are skipped.
func DeleteJobs(ctx context.Context, db queue.DBTX, f queue.ListParams) (*BulkResult, error) {
	return bulkJobs(ctx, db, f, "delete", func(ctx context.Context, id int64) error {
		_, err := store.DeleteJob(ctx, db, id)
		return err
	})
}

// ErrEmptyFilter is returned by a bulk action whose filter sets nothing: it would act on
// every job. Set ListParams.State, Queue, Kind, Tag, Args or UnknownKinds.
var ErrEmptyFilter = errors.New("bulk action without a filter: it would act on every job")

// bulkJobs applies one action to every job that f matches, page by page (f.Limit jobs a
// page, newest first; f.BeforeID starts below an id), each job with the same statement
// as the single-job call, so each is fenced the same way: a running job's lease is revoked
// by the statement that changes it. A job whose state changed before the action reached
// it is skipped and counted, not an error. The first other error stops the action and is
// returned with what was done until then. An empty filter is refused (ErrEmptyFilter).
// name names the action in errors.
func bulkJobs(ctx context.Context, db queue.DBTX, f queue.ListParams, name string,
	action func(ctx context.Context, id int64) error) (*BulkResult, error) {
	if f.State == "" && f.Queue == "" && f.Kind == "" && f.Tag == "" && f.Args == "" && !f.UnknownKinds {
		return nil, fmt.Errorf("%s jobs: %w", name, ErrEmptyFilter)
	}
	f.ScanLimit = 0
	res := &BulkResult{Changed: []int64{}}
	for {
		page, err := store.ListJobsPage(ctx, db, f)
		if err != nil {
			return res, fmt.Errorf("%s jobs: %w", name, err)
		}
		for _, j := range page.Jobs {
			res.Matched++
			switch err := action(ctx, j.ID); {
			case err == nil:
				res.Changed = append(res.Changed, j.ID)
			case errors.Is(err, queue.ErrWrongState) || errors.Is(err, queue.ErrNotFound):
				res.Skipped++
			default:
				return res, fmt.Errorf("%s jobs: job %d: %w", name, j.ID, err)
			}
		}
		if page.Next == 0 || len(page.Jobs) == 0 {
			return res, nil
		}
		f.BeforeID = page.Next
	}
}

// ListQueues returns every queue that has settings or jobs, with its job counts by state.
func ListQueues(ctx context.Context, db queue.DBTX) ([]queue.QueueInfo, error) {
	return store.ListQueues(ctx, db)
}

// PauseQueue pauses a queue: no worker claims from it until it is resumed; jobs already
// running go on. A queue that has no settings row yet gets one.
func PauseQueue(ctx context.Context, db queue.DBTX, name string) error {
	return store.SetQueuePaused(ctx, db, name, true)
}

// ResumeQueue resumes a paused queue.
func ResumeQueue(ctx context.Context, db queue.DBTX, name string) error {
	return store.SetQueuePaused(ctx, db, name, false)
}

// AddQueue records a queue's settings row, so that it is listed, and can be paused,
// before any job is enqueued in it (queue.ErrExists when it has one). Which queues a
// worker serves is its own configuration (Config.Queues, Worker.AddQueue).
func AddQueue(ctx context.Context, db queue.DBTX, name string) error {
	return store.AddQueue(ctx, db, name)
}

// RemoveQueue deletes a queue's settings row. It is refused (queue.ErrWrongState) while
// unfinished jobs wait in the queue, and fails with queue.ErrNotFound when the queue has
// no settings row.
func RemoveQueue(ctx context.Context, db queue.DBTX, name string) error {
	return store.RemoveQueue(ctx, db, name)
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
	return store.RemovePeriodic(ctx, db, name)
}

// PausePeriodic pauses a schedule: its slots pass without enqueueing until it is resumed.
func PausePeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.PeriodicRow, error) {
	return store.SetPeriodicPaused(ctx, db, name, true)
}

// ResumePeriodic resumes a paused schedule from its next slot.
func ResumePeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.PeriodicRow, error) {
	return store.SetPeriodicPaused(ctx, db, name, false)
}

// TriggerPeriodic enqueues one job of a schedule now, outside its slots, and returns it.
func TriggerPeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.JobRow, error) {
	return store.TriggerPeriodic(ctx, db, name)
}
