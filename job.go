package fenceq

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/queue"
)

// Re-exported engine types, so applications import one package.
type (
	// JobRow is one row of fenceq_jobs.
	JobRow = queue.JobRow
	// Lease names one holding of a job: (job id, lease generation, holder).
	Lease = queue.Lease
	// Writes are the statements of a fenced commit known before it starts
	// (Job.CommitWrites).
	Writes = queue.Writes
	// State is a job state.
	State = queue.State
	// InsertResult is the outcome of Enqueue.
	InsertResult = queue.InsertResult
	// DBTX is a pool, connection or transaction.
	DBTX = queue.DBTX
	// Beginner is a DBTX that can open a transaction.
	Beginner = queue.Beginner
	// Backoff is an exponential retry policy with jitter.
	Backoff = queue.Backoff
	// Revocation is one lease the reaper revoked.
	Revocation = queue.Revocation
	// AttemptError is one failed attempt, as recorded on the job.
	AttemptError = queue.AttemptError
	// ValidationError names the input that was wrong; it matches ErrInvalid.
	ValidationError = queue.ValidationError
	// UniqueOpts makes a job unique by its args, period, queue and a chosen set of
	// states (InsertOpts.Unique).
	UniqueOpts = queue.UniqueOpts
)

// UnfinishedStates returns the states of a job that will still run or is running: the
// states every UniqueOpts.ByState must include.
func UnfinishedStates() []State { return queue.UnfinishedStates() }

// Job states.
const (
	StateAvailable = queue.StateAvailable
	StateScheduled = queue.StateScheduled
	StateRunning   = queue.StateRunning
	StateRetryable = queue.StateRetryable
	StateCompleted = queue.StateCompleted
	StateDiscarded = queue.StateDiscarded
	StateCancelled = queue.StateCancelled
)

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
	*JobRow
	// Args are the job's decoded arguments (JobRow.EncodedArgs holds them as stored).
	Args T

	exec *execution
}

// Lease returns the lease this attempt runs under: the job's id, the generation its
// claim produced and this worker's id. Every write made under it is checked against the
// generation by the database.
func (j *Job[T]) Lease() Lease { return j.exec.lease }

// Commit runs fn in one short transaction fenced by the job's lease and completes the
// job in that same transaction: the job's result rows, its outbox rows and its
// completion commit together or not at all. If the lease was revoked (the worker paused
// past it, an operator requeued the job), nothing is written and Commit returns an error
// matching ErrLeaseLost; return it from the handler. Make slow calls before Commit, never
// inside fn: the job row stays locked until COMMIT.
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
// nothing and returns an error matching ErrLeaseLost, and a statement that fails (a
// unique violation) writes nothing and returns its error. Use Commit when a statement
// needs another's result or the transaction needs Go code between statements.
func (j *Job[T]) CommitWrites(ctx context.Context, w *Writes) error {
	return j.exec.commitWith(ctx, func(ctx context.Context, how queue.LeaseTx) error {
		return queue.WithLeaseWrites(ctx, j.exec.w.pool, j.exec.lease, how, w)
	})
}

// WithLease runs fn in a transaction fenced by the job's lease without completing the
// job: for progress or partial results that must not be written by a stale holder. If
// the lease was revoked, nothing is written and the error matches ErrLeaseLost.
func (j *Job[T]) WithLease(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	err := queue.WithLease(ctx, j.exec.w.pool, j.exec.lease, queue.LeaseTx{}, fn)
	if errors.Is(err, ErrLeaseLost) {
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
	// the existing one (InsertResult.Existing) instead of a second row. With Unique set
	// too, it is one part of the computed key.
	UniqueKey string
	// Unique makes the job unique by more than one key: by its args (ByArgs: all of
	// them, or only the fields of the args struct tagged `unique:"true"`), by period
	// (ByPeriod: one job per period of run_at, by the database's clock), by queue
	// (ByQueue), and in chosen states (ByState: the unfinished states and any final ones,
	// e.g. StateCompleted for "once per period, even after it ran"). A second enqueue
	// while the key is held returns the holder (InsertResult.Existing). The zero value
	// takes the kind's InsertOpts.
	Unique UniqueOpts
	// Tags label the job for operators (`fenceq jobs list --tag T`): at most 20, each
	// 1–64 letters, digits and "_ . : -". They are added to those of the kind's
	// InsertOpts.
	Tags []string
	// Metadata is stored with the job as a JSON object (JobRow.Metadata): what produced
	// it and what travels with it, apart from its args. Keys given here are added to
	// those of the kind's InsertOpts.
	Metadata map[string]any
}
