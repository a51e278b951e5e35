package queue

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what the queue functions need from a connection: a *pgxpool.Pool, a *pgx.Conn
// and a pgx.Tx all satisfy it. Passing a transaction makes the call part of it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// Beginner is a DBTX that can also open a transaction (a pool or a connection).
type Beginner interface {
	DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Lease names one holding of a job: the job id, the lease generation the claim produced
// and the worker that holds it. Every write made under a lease is checked against the
// generation by the database.
type Lease struct {
	JobID  int64  `json:"job_id"`
	Gen    int64  `json:"lease_gen"`
	Holder string `json:"leased_by"`
}

// AttemptError is one failed attempt, stored in the job's errors column.
type AttemptError struct {
	At       time.Time `json:"at"`
	Attempt  int       `json:"attempt"`
	LeaseGen int64     `json:"lease_gen"`
	Worker   string    `json:"worker,omitempty"`
	Error    string    `json:"error"`
	Trace    string    `json:"trace,omitempty"`
}

// JobRow is one row of fenceq_jobs.
type JobRow struct {
	ID    int64  `json:"id"`
	Queue string `json:"queue"`
	Kind  string `json:"kind"`
	// EncodedArgs are the job's arguments as stored: a JSON object. A handler reads
	// them decoded, as Job[T].Args.
	EncodedArgs    json.RawMessage `json:"args"`
	State          State           `json:"state"`
	Priority       int16           `json:"priority"`
	RunAt          time.Time       `json:"run_at"`
	Attempt        int             `json:"attempt"`
	MaxAttempts    int             `json:"max_attempts"`
	LeaseGen       int64           `json:"lease_gen"`
	LeasedBy       *string         `json:"leased_by"`
	HeartbeatAt    *time.Time      `json:"heartbeat_at"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at"`
	AttemptedAt    *time.Time      `json:"attempted_at"`
	UniqueKey      *string         `json:"unique_key"`
	Errors         []AttemptError  `json:"errors"`
	// Metadata is a JSON object about the job rather than for its handler: who
	// enqueued it and what travels with it. "{}" when there is none.
	Metadata json.RawMessage `json:"metadata"`
	// Output is the JSON value the handler recorded (fenceq.RecordOutput), written with
	// the job's completion; nil when it recorded none or has not completed. A claimed
	// row does not carry it.
	Output     json.RawMessage `json:"output"`
	CreatedAt  time.Time       `json:"created_at"`
	FinishedAt *time.Time      `json:"finished_at"`
	// UniqueStates are the states in which the job holds UniqueKey; nil without a key.
	UniqueStates []State `json:"unique_states,omitempty"`
	// Tags label the job; nil when it has none.
	Tags []string `json:"tags,omitempty"`
	// FlowKey is the flow key the job runs under (its FlowLimit's name, ":", its
	// partition; see FlowOpts); nil when it runs under no limit.
	FlowKey *string `json:"flow_key,omitempty"`
}

// Defaults applied by fenceq.Enqueue and fenceq.EnqueueMany to zero-valued options.
const (
	DefaultQueue       = "default"
	DefaultPriority    = 1
	DefaultMaxAttempts = 25
)

// InsertResult is the outcome of fenceq.Enqueue.
type InsertResult struct {
	Job *JobRow
	// Existing is true when the job's unique key is held by another job (then Job is
	// that job) and no row was inserted.
	Existing bool
	// Debounced is true when the enqueue carried a debounce key (DebounceOpts) and a job
	// of the same kind and key that had not started yet took its args and options
	// instead of a new row: Job is that job, with its id, and its run_at is the end of
	// the new window.
	Debounced bool
}

// DebounceOpts makes an enqueue replace a waiting job instead of adding one: while a
// job of the same kind with the same Key has not started (it is scheduled or
// available and was never claimed), the enqueue gives that job its args, queue,
// priority, max attempts, tags and metadata and moves its run_at to the database's
// now() plus Window, so that only the latest of a burst of enqueues runs, once the
// burst has been quiet for Window. A job that has started is never changed: the enqueue
// inserts a new job, which waits for its own window. With MaxWait, a burst that never
// goes quiet still runs: the job waits at most MaxWait after the enqueue that created
// it. The zero value adds nothing.
//
// The database decides, race-free: the key is a partial unique index over the jobs that
// have not started, and the enqueue is one INSERT … ON CONFLICT … DO UPDATE on it. A
// debounced job always waits for its window, so RunAt and RunIn cannot be combined with
// it, and neither can a unique key (UniqueKey, UniqueOpts); a batch (EnqueueMany)
// refuses it.
type DebounceOpts struct {
	// Key names the burst, among the jobs of one kind: at most 255 bytes of printable
	// UTF-8.
	Key string
	// Window is how long the job waits after the latest enqueue: more than 0.
	Window time.Duration
	// MaxWait, when set, caps the wait: the job runs at the latest MaxWait after the
	// enqueue that created it (its created_at), however often later enqueues replace
	// its args. At least Window; 0 for no cap.
	MaxWait time.Duration
}

// IsZero reports whether d adds nothing.
func (d DebounceOpts) IsZero() bool { return d.Key == "" && d.Window == 0 && d.MaxWait == 0 }

// UniqueOpts makes a job unique by more than one explicit key: by its args, by period,
// by queue, and in a chosen set of states. The zero value adds nothing.
//
// The key a job holds is computed from its kind and the chosen parts (a SHA-256 of
// their canonical JSON, and the start of the period) and stored in unique_key; the
// states are stored beside it as a mask. A unique index admits one job per key among
// the jobs whose state is in their own mask, and every insert targets it with ON
// CONFLICT DO NOTHING: the database decides, race-free, for single inserts and for
// COPY batches alike (duplicates inside one batch included).
type UniqueOpts struct {
	// ByArgs makes the job's args part of its key: all of them, or, when ArgsFields is
	// set, only those top-level fields. Args are compared as canonical JSON (object keys
	// sorted), so field order and spacing do not matter.
	ByArgs bool
	// ArgsFields, with ByArgs, names the top-level JSON fields of the args that make the
	// key; a field absent from the args counts as absent. The root package fills it
	// from the fields of the args struct tagged `unique:"true"`.
	ArgsFields []string
	// ByPeriod, when set, allows one job per period: the job's run_at (RunAt, or the
	// database's now() plus RunIn) truncated to a multiple of the period since the Unix
	// epoch, by the database's clock. At least one second.
	ByPeriod time.Duration
	// ByQueue makes the queue part of the key: the same job may wait once per queue.
	ByQueue bool
	// ByState lists the states in which a job holds its key. It must include every
	// unfinished state (UnfinishedStates) and may add final ones: with StateCompleted,
	// a completed job keeps holding its key (until retention deletes it). Nil means the
	// unfinished states.
	ByState []State
}

// IsZero reports whether u adds nothing.
func (u UniqueOpts) IsZero() bool {
	return !u.ByArgs && len(u.ArgsFields) == 0 && u.ByPeriod == 0 && !u.ByQueue && u.ByState == nil
}

// Revocation is one lease the reaper revoked.
type Revocation struct {
	Lease
	// State is the job's new state: available, or discarded past max attempts.
	State State
	Queue string
	Kind  string
	// HolderAlive is true when the holder process still heartbeated in fenceq_workers:
	// a paused or stuck process, not a dead one. This is the alert condition.
	HolderAlive bool
}
