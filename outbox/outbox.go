// Package outbox is fenceq's transactional outbox: effects on the outside world (an
// email, a webhook, a message to another system) written as rows in the transaction
// that decides them, and delivered at least once afterwards by a relay that runs inside
// a fenceq worker.
//
// # Writing
//
// Insert writes a row of any topic in the caller's transaction (typically a job's
// fenced Commit): the row exists if and only if the business rows that caused it
// commit. Insert also enqueues, in the same transaction, one job of kind DeliverKind on
// Queue whose args name the row, so rows are claimed, leased, fenced, heartbeated,
// reaped and retried by exactly the machinery that runs every other job. The row's
// lease_gen and leased_by record the lease of the delivery job that worked it.
//
// # Delivering
//
// A Relay holds one Deliverer per topic and is registered on a worker's Handlers. Each
// attempt reads the row, records the attempt under the delivery job's lease (a revoked
// holder stops there, before the external call), calls the topic's Deliverer, and then,
// under the same lease, marks the row delivered in the job's fenced commit, marks it
// failed (a permanent error or the last attempt), or records the error for a retry.
//
// A relay can crash after the receiver accepted a delivery but before the row was
// marked delivered; the next holder then delivers it again. Every attempt for a row
// therefore carries the same key (Delivery.Key, derived from the row's dedupe key), so
// the receiver can drop the copy.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// The delivery jobs.
const (
	// DeliverKind is the kind of the job that delivers one outbox row.
	DeliverKind = "outbox.deliver"
	// Queue is the queue delivery jobs run on; a worker that runs a Relay must serve it.
	Queue = "outbox"
	// DefaultMaxAttempts is how many delivery attempts a row gets before it is marked
	// failed.
	DefaultMaxAttempts = 10
	// MaxTopicLen bounds a topic name.
	MaxTopicLen = 128
)

// DeliverArgs are the args of a delivery job.
type DeliverArgs struct {
	OutboxID int64 `json:"outbox_id"`
}

// Kind implements fenceq.JobArgs.
func (DeliverArgs) Kind() string { return DeliverKind }

// State is the state of an outbox row.
type State string

// Row states. A row starts pending and ends delivered or failed; an operator can make
// a failed row pending again with Retry. Rows are never dropped by the relay.
const (
	StatePending   State = "pending"
	StateDelivered State = "delivered"
	StateFailed    State = "failed"
)

var states = [...]State{StatePending, StateDelivered, StateFailed}

// States returns every row state.
func States() []State { return slices.Clone(states[:]) }

// Valid reports whether s names a row state.
func (s State) Valid() bool { return slices.Contains(states[:], s) }

// Message is one row to write.
type Message struct {
	// Topic routes the row to its Deliverer, e.g. "email": 1–128 characters.
	Topic string
	// DedupeKey is unique across the outbox and is the idempotency key of every delivery
	// attempt, e.g. "invoice-email:42".
	DedupeKey string
	// Payload is a JSON object; the topic's Deliverer decodes it.
	Payload []byte
	// JobID is the job whose transaction wrote the row, if any.
	JobID int64
	// MaxAttempts for the delivery job; defaults to DefaultMaxAttempts.
	MaxAttempts int
}

// InsertResult is the outcome of Insert.
type InsertResult struct {
	ID int64
	// Existing is true when a row with the dedupe key already existed: nothing was
	// written and no delivery job enqueued.
	Existing bool
	// DeliveryJobID is the id of the delivery job (of the existing row, when Existing).
	DeliveryJobID int64
}

// validateTopic checks a topic: 1–MaxTopicLen bytes of text PostgreSQL can store
// (valid UTF-8, no NUL).
func validateTopic(t string) error {
	if t == "" || len(t) > MaxTopicLen {
		return invalid("topic", "must be 1–%d characters", MaxTopicLen)
	}
	if t != queue.StorableText(t, len(t)) {
		return invalid("topic", "%q must be valid UTF-8 without NUL bytes", queue.StorableText(t, 40))
	}
	return nil
}

func invalid(field, format string, args ...any) error {
	return &queue.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks m as Insert would, without touching the database. Errors match
// queue.ErrInvalid and name the field.
func (m *Message) Validate() error {
	if err := validateTopic(m.Topic); err != nil {
		return err
	}
	if err := queue.ValidateUniqueKey("dedupe_key", m.DedupeKey); err != nil {
		return err
	}
	payload := m.Payload
	if len(payload) == 0 {
		payload = []byte("{}")
	}
	if err := queue.ValidateArgs(payload, 0); err != nil {
		return fmt.Errorf("outbox payload: %w", err)
	}
	if m.MaxAttempts < 0 || m.MaxAttempts > queue.MaxMaxAttempts {
		return invalid("max_attempts", "%d is outside 1–%d", m.MaxAttempts, queue.MaxMaxAttempts)
	}
	return nil
}

// Insert writes an outbox row and enqueues its delivery job, both in tx. Call it inside
// the transaction that writes the business rows (a job's fenced Commit): the row exists
// if and only if they commit. A second insert with the same dedupe key writes nothing
// and returns the existing row.
func Insert(ctx context.Context, tx pgx.Tx, m Message) (*InsertResult, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	if len(m.Payload) == 0 {
		m.Payload = []byte("{}")
	}
	if m.MaxAttempts == 0 {
		m.MaxAttempts = DefaultMaxAttempts
	}
	var jobID *int64
	if m.JobID != 0 {
		jobID = &m.JobID
	}
	var id int64
	err := tx.QueryRow(ctx, sqlInsert, m.Topic, m.DedupeKey, m.Payload, jobID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		res := &InsertResult{Existing: true}
		if err := tx.QueryRow(ctx, sqlGetByKey, m.DedupeKey).Scan(&res.ID, &res.DeliveryJobID); err != nil {
			return nil, fmt.Errorf("read outbox row %q: %w", m.DedupeKey, err)
		}
		return res, nil
	}
	if err != nil {
		return nil, fmt.Errorf("insert outbox row %q: %w", m.DedupeKey, err)
	}
	deliveryID, err := enqueueDelivery(ctx, tx, id, m.MaxAttempts)
	if err != nil {
		return nil, err
	}
	return &InsertResult{ID: id, DeliveryJobID: deliveryID}, nil
}

// deliveryUniqueKey is the unique key of a row's delivery job: one unfinished delivery
// per row.
func deliveryUniqueKey(id int64) string { return "outbox:" + strconv.FormatInt(id, 10) }

// enqueueDelivery enqueues, in tx, the delivery job of row id and links the row to it.
// A delivery job of the row that is still unfinished gives queue.ErrWrongState: linking the
// row to it again would deliver nothing new.
func enqueueDelivery(ctx context.Context, tx pgx.Tx, id int64, maxAttempts int) (int64, error) {
	job, err := fenceq.Enqueue(ctx, tx, DeliverArgs{OutboxID: id}, &fenceq.InsertOpts{
		Queue: Queue, MaxAttempts: maxAttempts, UniqueKey: deliveryUniqueKey(id),
	})
	if err != nil {
		return 0, fmt.Errorf("enqueue delivery of outbox row %d: %w", id, err)
	}
	if job.Existing {
		return 0, fmt.Errorf("enqueue delivery of outbox row %d: its delivery job %d is still %s; "+
			"retry once that job has ended: %w", id, job.Job.ID, job.Job.State, queue.ErrWrongState)
	}
	if _, err := tx.Exec(ctx, sqlSetDeliveryJob, id, job.Job.ID); err != nil {
		return 0, fmt.Errorf("link outbox row %d to its delivery job: %w", id, err)
	}
	return job.Job.ID, nil
}

// Row is one row of fenceq_outbox. LeaseGen and LeasedBy name the lease of the delivery
// job that last worked the row (the one that delivered it, once delivered).
type Row struct {
	ID        int64           `json:"id"`
	Topic     string          `json:"topic"`
	DedupeKey string          `json:"dedupe_key"`
	Payload   json.RawMessage `json:"payload"`
	State     State           `json:"state"`
	Attempt   int             `json:"attempt"`
	LeaseGen  int64           `json:"lease_gen"`
	LeasedBy  *string         `json:"leased_by"`
	// LeaseExpiresAt is when the lease delivering the row expires, while that delivery
	// job still runs under it; nil otherwise.
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	AvailableAt    time.Time  `json:"available_at"`
	DeliveredAt    *time.Time `json:"delivered_at"`
	LastError      *string    `json:"last_error"`
	JobID          *int64     `json:"job_id"`
	DeliveryJobID  *int64     `json:"delivery_job_id"`
	CreatedAt      time.Time  `json:"created_at"`
	// DeliveryJobState is the current state of the delivery job, "" when that job no
	// longer exists (pruned).
	DeliveryJobState queue.State `json:"delivery_job_state"`
}

func scanRow(row pgx.Row) (*Row, error) {
	var o Row
	var state, jobState string
	var payload []byte
	err := row.Scan(&o.ID, &o.Topic, &o.DedupeKey, &payload, &state, &o.Attempt, &o.LeaseGen,
		&o.LeasedBy, &o.LeaseExpiresAt, &o.AvailableAt, &o.DeliveredAt, &o.LastError, &o.JobID,
		&o.DeliveryJobID, &o.CreatedAt, &jobState)
	if err != nil {
		return nil, err
	}
	o.State = State(state)
	o.DeliveryJobState = queue.State(jobState)
	o.Payload = json.RawMessage(payload)
	return &o, nil
}

// Get returns one outbox row, or an error matching queue.ErrNotFound.
func Get(ctx context.Context, db queue.DBTX, id int64) (*Row, error) {
	o, err := scanRow(db.QueryRow(ctx, sqlGet, queue.StateRunning, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("outbox row %d: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get outbox row %d: %w", id, err)
	}
	return o, nil
}

// ListParams filters List; empty fields match everything.
type ListParams struct {
	State State
	Topic string
	// BeforeID pages backwards: only rows with a smaller id.
	BeforeID int64
	// Limit defaults to 100.
	Limit int
}

// List returns the newest outbox rows matching the filter.
func List(ctx context.Context, db queue.DBTX, p ListParams) ([]*Row, error) {
	if p.State != "" && !p.State.Valid() {
		return nil, invalid("state", "%q is not an outbox state (want one of %v)", p.State, states)
	}
	if p.Topic != "" {
		if err := validateTopic(p.Topic); err != nil {
			return nil, err
		}
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	rows, err := db.Query(ctx, sqlList, queue.StateRunning, string(p.State), p.Topic, p.Limit, p.BeforeID)
	if err != nil {
		return nil, fmt.Errorf("list outbox: %w", err)
	}
	defer rows.Close()
	var out []*Row
	for rows.Next() {
		o, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("list outbox: %w", err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list outbox: %w", err)
	}
	return out, nil
}

// Retry makes a failed row pending again and enqueues a new delivery job for it, in
// one transaction. It also takes a pending row that no unfinished job will deliver (an
// orphan, see FailOrphaned). Any other row gives queue.ErrWrongState, and so does a failed row
// whose last delivery job has not ended yet (the relay marks the row failed, then ends
// its job); an unknown id queue.ErrNotFound. The row keeps its dedupe key, so the new
// attempts carry the same idempotency key as the old ones.
func Retry(ctx context.Context, db queue.Beginner, id int64) (*Row, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("retry outbox row %d: begin: %w", id, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var got int64
	err = tx.QueryRow(ctx, sqlRetry, id, queue.UnfinishedStates()).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := Get(ctx, tx, id)
		if gerr != nil {
			return nil, fmt.Errorf("retry: %w", gerr)
		}
		return nil, fmt.Errorf("retry outbox row %d: it is %s (delivery job %s): %w",
			id, cur.State, cur.DeliveryJobState, queue.ErrWrongState)
	}
	if err != nil {
		return nil, fmt.Errorf("retry outbox row %d: %w", id, err)
	}
	if _, err := enqueueDelivery(ctx, tx, id, DefaultMaxAttempts); err != nil {
		return nil, fmt.Errorf("retry: %w", err)
	}
	o, err := Get(ctx, tx, id)
	if err != nil {
		return nil, fmt.Errorf("retry: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("retry outbox row %d: commit: %w", id, err)
	}
	return o, nil
}

// FailOrphaned marks up to limit orphaned rows failed, each with the reason in
// last_error, and returns their ids. A row is orphaned when it is pending but no
// unfinished job will deliver it: typically the reaper discarded its delivery job after
// the holder of every attempt crashed, so no handler ever marked the row. Run it
// periodically: failed rows are counted, listed and retryable, never silently stuck.
func FailOrphaned(ctx context.Context, db queue.DBTX, limit int) ([]int64, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := db.Query(ctx, sqlFailOrphaned, pgx.QueryExecModeCacheDescribe, limit, queue.UnfinishedStates())
	if err != nil {
		return nil, fmt.Errorf("fail orphaned outbox rows: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("fail orphaned outbox rows: %w", err)
	}
	return ids, nil
}

// Backlog is the outbox backlog, by the database's clock.
type Backlog struct {
	Pending int64 `json:"pending"`
	Failed  int64 `json:"failed"`
	// OldestPendingAge is now() minus the available_at of the oldest pending row; zero
	// when nothing is pending. Alert on it: it is the age of the undelivered backlog.
	OldestPendingAge time.Duration `json:"oldest_pending_age"`
	// Orphaned counts pending rows that no unfinished job will deliver (see
	// FailOrphaned).
	Orphaned int64 `json:"orphaned"`
}

// Stats reads the outbox backlog: pending and failed counts, the age of the oldest
// pending row and the orphan count.
func Stats(ctx context.Context, db queue.DBTX) (Backlog, error) {
	var s Backlog
	var age float64
	if err := db.QueryRow(ctx, sqlStats, queue.UnfinishedStates()).Scan(&s.Pending, &s.Failed, &age, &s.Orphaned); err != nil {
		return Backlog{}, fmt.Errorf("outbox stats: %w", err)
	}
	s.OldestPendingAge = time.Duration(age * float64(time.Second))
	return s, nil
}
