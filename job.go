package fenceq

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// Writes are the statements of a fenced commit known before it starts, for
// Job.CommitWrites: a job's result rows, computed from its arguments and from what the
// handler did before committing. They are sent in the commit's own pipeline and their
// results are not read, so a statement cannot depend on another's result; a statement
// that fails (a unique violation, a check) aborts the whole commit.
type Writes struct {
	w store.Writes
}

// Exec queues one statement with its arguments.
func (w *Writes) Exec(sql string, args ...any) { w.w.Exec(sql, args...) }

// Len is the number of statements queued.
func (w *Writes) Len() int {
	if w == nil {
		return 0
	}
	return w.w.Len()
}

// JobArgs are the arguments of one kind of job. They are stored as JSON; Kind names the
// handler that runs them. Implement it on a value (not pointer) receiver.
type JobArgs interface {
	Kind() string
}

// JobArgsWithInsertOpts lets a kind of job carry default insert options.
type JobArgsWithInsertOpts interface {
	JobArgs
	InsertOpts() InsertOpts
}

// Job is a job being worked: its row, its decoded args and its lease.
type Job[T JobArgs] struct {
	*queue.JobRow
	// Args are the job's decoded arguments (queue.JobRow.EncodedArgs holds them as stored).
	Args T

	exec *execution
}

// Lease returns the lease this attempt runs under: the job's id, the generation its
// claim produced and this worker's id. Every write made under it is checked against the
// generation by the database.
func (j *Job[T]) Lease() queue.Lease { return j.exec.lease }

// LeaseDeadline returns the job's local lease deadline as of now: the instant at which
// the worker cancels the job's context (cause ErrLeaseDeadline) unless a renewal is
// confirmed before it. Each confirmed renewal moves it later, so it is a bound for work
// started now, not the end of the attempt: a handler that hands the job to another
// process (an HTTP endpoint) tells it this instant, or the context's deadline (the
// kind's timeout) when that is sooner.
func (j *Job[T]) LeaseDeadline() time.Time { return j.exec.leaseDeadline() }

// Commit runs fn in one short transaction fenced by the job's lease and completes the
// job in that same transaction: the job's result rows, its outbox rows and its
// completion commit together or not at all. If the lease was revoked (the worker paused
// past it, an operator requeued the job), nothing is written and Commit returns an error
// matching queue.ErrLeaseLost; return it from the handler. The lease is checked with fn's
// first statement (on a pool, in the same round trip): when it is gone, that statement
// returns an error matching queue.ErrLeaseLost and runs nothing. Make slow calls before
// Commit, never inside fn: the job row stays locked until COMMIT.
//
// After a successful Commit the handler's return value no longer matters: the job is
// completed.
func (j *Job[T]) Commit(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return j.exec.commit(ctx, fn)
}

// CommitWrites is Commit for a job whose result rows are known before the transaction
// starts: w's statements, queued with w.Exec, commit with the job's completion in one
// round trip to the database (BEGIN, the lock on the job row, w's statements, the
// completion and COMMIT, sent as one pipeline). The guarantees are Commit's: the row is
// locked before any of w's statements runs and until COMMIT, a revoked lease writes
// nothing and returns an error matching queue.ErrLeaseLost, and a statement that fails (a
// unique violation) writes nothing and returns its error. Use Commit when a statement
// needs another's result or the transaction needs Go code between statements.
func (j *Job[T]) CommitWrites(ctx context.Context, w *Writes) error {
	return j.exec.commitWith(ctx, func(ctx context.Context, how store.LeaseTx) error {
		var sw *store.Writes
		if w != nil {
			sw = &w.w
		}
		return store.WithLeaseWrites(ctx, j.exec.w.pool, j.exec.lease, how, sw)
	})
}

// WithLease runs fn in a transaction fenced by the job's lease without completing the
// job: for progress or partial results that must not be written by a stale holder. If
// the lease was revoked, nothing is written and the error matches queue.ErrLeaseLost.
func (j *Job[T]) WithLease(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	err := store.WithLease(ctx, j.exec.w.pool, j.exec.lease, store.LeaseTx{}, fn)
	if errors.Is(err, queue.ErrLeaseLost) {
		j.exec.w.hooks.staleWriteRejected(j.exec.hookCtx(), j.exec.row, "with lease")
	}
	return err
}

// InsertOpts are the options of one enqueue. Zero values take the kind's InsertOpts (if
// its args implement JobArgsWithInsertOpts), then the engine defaults.
type InsertOpts struct {
	// Queue defaults to "default".
	Queue string
	// Priority: lower runs first, 0–100. Nil takes the kind's default, else 1. Write
	// new(0) for the most urgent.
	Priority *int
	// RunAt schedules the job at an absolute time.
	RunAt time.Time
	// RunIn schedules the job this long after the database's now().
	RunIn time.Duration
	// MaxAttempts defaults to 25.
	MaxAttempts int
	// UniqueKey: while a job with this key is not finished, enqueueing another returns
	// the existing one (queue.InsertResult.Existing) instead of a second row. With Unique set
	// too, it is one part of the computed key.
	UniqueKey string
	// Unique makes the job unique by more than one key: by its args (ByArgs: all of
	// them, or only the fields of the args struct tagged `unique:"true"`), by period
	// (ByPeriod: one job per period of run_at, by the database's clock), by queue
	// (ByQueue), and in chosen states (ByState: the unfinished states and any final ones,
	// e.g. queue.StateCompleted for "once per period, even after it ran"). A second enqueue
	// while the key is held returns the holder (queue.InsertResult.Existing). The zero value
	// takes the kind's InsertOpts.
	Unique queue.UniqueOpts
	// Tags label the job for operators (`fenceq jobs list --tag T`): at most 20, each
	// 1–64 letters, digits and "_ . : -". They are added to those of the kind's
	// InsertOpts.
	Tags []string
	// Metadata is stored with the job as a JSON object (queue.JobRow.Metadata): what produced
	// it and what travels with it, apart from its args. Keys given here are added to
	// those of the kind's InsertOpts.
	Metadata map[string]any
	// Flow puts the job under a flow limit (a concurrency limit, a rate limit or a
	// sequence, per partition), enforced by the database across every worker: the job
	// stays available but is claimed only while its partition has room. The zero value
	// takes the kind's InsertOpts. See docs/flow.md.
	Flow queue.FlowOpts
	// Debounce, with a key and a window, makes this enqueue replace the job of the same
	// kind and key that has not started yet (its args, queue, priority, max attempts,
	// tags and metadata become this enqueue's, its run_at now() plus the window) instead
	// of adding one; when none waits, the job is inserted to run after the window.
	// queue.InsertResult.Debounced reports a replacement. It cannot be combined with
	// RunAt, RunIn, UniqueKey or Unique, nor used in EnqueueMany. The zero value takes
	// the kind's InsertOpts. See queue.DebounceOpts.
	Debounce queue.DebounceOpts
}
