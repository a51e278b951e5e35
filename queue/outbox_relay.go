package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxState is the state of an outbox row.
type OutboxState string

// Outbox row states. A row starts pending and ends delivered or failed; an operator can
// make a failed row pending again with RetryOutbox. Rows are never dropped by the relay.
const (
	OutboxPending   OutboxState = "pending"
	OutboxDelivered OutboxState = "delivered"
	OutboxFailed    OutboxState = "failed"
)

// OutboxStates lists every outbox state.
var OutboxStates = []OutboxState{OutboxPending, OutboxDelivered, OutboxFailed}

// Valid reports whether s names an outbox state.
func (s OutboxState) Valid() bool {
	for _, v := range OutboxStates {
		if s == v {
			return true
		}
	}
	return false
}

// OutboxRow is one row of fenceq_outbox. LeaseGen and LeasedBy name the lease of the
// delivery job that last worked the row (the one that delivered it, once delivered).
type OutboxRow struct {
	ID        int64           `json:"id"`
	Topic     string          `json:"topic"`
	DedupeKey string          `json:"dedupe_key"`
	Payload   json.RawMessage `json:"payload"`
	State     OutboxState     `json:"state"`
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
	DeliveryJobState State `json:"delivery_job_state"`
}

func scanOutbox(row pgx.Row) (*OutboxRow, error) {
	var o OutboxRow
	var state, jobState string
	var payload []byte
	err := row.Scan(&o.ID, &o.Topic, &o.DedupeKey, &payload, &state, &o.Attempt, &o.LeaseGen,
		&o.LeasedBy, &o.LeaseExpiresAt, &o.AvailableAt, &o.DeliveredAt, &o.LastError, &o.JobID,
		&o.DeliveryJobID, &o.CreatedAt, &jobState)
	if err != nil {
		return nil, err
	}
	o.State = OutboxState(state)
	o.DeliveryJobState = State(jobState)
	o.Payload = json.RawMessage(payload)
	return &o, nil
}

// GetOutbox returns one outbox row, or ErrNotFound.
func GetOutbox(ctx context.Context, db DBTX, id int64) (*OutboxRow, error) {
	o, err := scanOutbox(db.QueryRow(ctx, sqlGetOutbox, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("outbox row %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get outbox row %d: %w", id, err)
	}
	return o, nil
}

// OutboxListParams filters ListOutbox; empty fields match everything.
type OutboxListParams struct {
	State OutboxState
	Topic string
	// BeforeID pages backwards: only rows with a smaller id.
	BeforeID int64
	// Limit defaults to 100.
	Limit int
}

// ListOutbox returns the newest outbox rows matching the filter.
func ListOutbox(ctx context.Context, db DBTX, p OutboxListParams) ([]*OutboxRow, error) {
	if p.State != "" && !p.State.Valid() {
		return nil, invalid("state", "%q is not an outbox state (want one of %v)", p.State, OutboxStates)
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	rows, err := db.Query(ctx, sqlListOutbox, string(p.State), p.Topic, p.Limit, p.BeforeID)
	if err != nil {
		return nil, fmt.Errorf("list outbox: %w", err)
	}
	defer rows.Close()
	var out []*OutboxRow
	for rows.Next() {
		o, err := scanOutbox(rows)
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

// outboxWrite runs one fenced relay write and explains a miss: ErrLeaseLost when the
// delivery job is no longer running under the lease, ErrWrongState when the row is not
// pending or belongs to another delivery job.
func outboxWrite(ctx context.Context, db DBTX, op string, id int64, l Lease, sql string, args ...any) (int, error) {
	all := append([]any{id, l.JobID, l.Gen, l.Holder}, args...)
	var attempt int
	err := db.QueryRow(ctx, sql, all...).Scan(&attempt)
	if err == nil {
		return attempt, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%s outbox row %d: %w", op, id, err)
	}
	var held bool
	if err := db.QueryRow(ctx, sqlOutboxHasFence, l.JobID, l.Gen).Scan(&held); err != nil {
		return 0, fmt.Errorf("%s outbox row %d: check lease: %w", op, id, err)
	}
	if !held {
		lost := fmt.Errorf("%s outbox row %d under job %d at lease generation %d: %w",
			op, id, l.JobID, l.Gen, ErrLeaseLost)
		// Recorded with db: kept when db is a pool; a caller's transaction that rolls
		// back loses it, but there the fence of WithLease has recorded it already.
		if rerr := RecordStaleWrite(ctx, db, l, op+" outbox row"); rerr != nil {
			return 0, errors.Join(lost, rerr)
		}
		return 0, lost
	}
	return 0, fmt.Errorf("%s outbox row %d: it is not pending with delivery job %d: %w", op, id, l.JobID, ErrWrongState)
}

// BeginOutboxAttempt records, under the delivery job's lease, that the holder is about
// to deliver the row: the row's attempt count grows by one and its lease columns name
// the lease. It returns the row's new attempt count. Call it before the external send:
// a holder whose lease was revoked is stopped here (ErrLeaseLost) instead of sending.
func BeginOutboxAttempt(ctx context.Context, db DBTX, id int64, l Lease) (int, error) {
	return outboxWrite(ctx, db, "begin delivery of", id, l, sqlBeginOutboxAttempt)
}

// MarkOutboxDelivered marks the row delivered under the delivery job's lease. Call it in
// the job's fenced commit (Job.Commit), so the row and the job's completion commit
// together and a stale holder can mark nothing (ErrLeaseLost).
func MarkOutboxDelivered(ctx context.Context, db DBTX, id int64, l Lease) error {
	_, err := outboxWrite(ctx, db, "mark delivered", id, l, sqlMarkOutboxDelivered)
	return err
}

// MarkOutboxFailed marks the row failed with a reason, under the delivery job's lease:
// a permanent rejection or the last attempt. The row is kept for RetryOutbox.
func MarkOutboxFailed(ctx context.Context, db DBTX, id int64, l Lease, reason string) error {
	_, err := outboxWrite(ctx, db, "mark failed", id, l, sqlMarkOutboxFailed, truncate(reason, maxErrorLen))
	return err
}

// RecordOutboxAttempt records the error of a failed attempt that will be retried, under
// the delivery job's lease.
func RecordOutboxAttempt(ctx context.Context, db DBTX, id int64, l Lease, errText string) error {
	_, err := outboxWrite(ctx, db, "record attempt of", id, l, sqlRecordOutboxAttempt, truncate(errText, maxErrorLen))
	return err
}

// RetryOutbox makes a failed row pending again and enqueues a new delivery job for it,
// in one transaction. It also takes a pending row that no unfinished job will deliver
// (an orphan, see FailOrphanedOutbox). Any other row gives ErrWrongState, and so does a
// failed row whose last delivery job has not ended yet (the relay marks the row failed,
// then ends its job); an unknown id ErrNotFound. The row keeps its dedupe key, so the new attempts carry the same
// idempotency key as the old ones.
func RetryOutbox(ctx context.Context, db Beginner, id int64) (*OutboxRow, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("retry outbox row %d: begin: %w", id, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var got int64
	err = tx.QueryRow(ctx, sqlRetryOutbox, id).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := GetOutbox(ctx, tx, id)
		if gerr != nil {
			return nil, fmt.Errorf("retry: %w", gerr)
		}
		return nil, fmt.Errorf("retry outbox row %d: it is %s (delivery job %s): %w",
			id, cur.State, cur.DeliveryJobState, ErrWrongState)
	}
	if err != nil {
		return nil, fmt.Errorf("retry outbox row %d: %w", id, err)
	}
	if _, err := enqueueDelivery(ctx, tx, id, DefaultOutboxMaxAttempts); err != nil {
		return nil, fmt.Errorf("retry: %w", err)
	}
	o, err := GetOutbox(ctx, tx, id)
	if err != nil {
		return nil, fmt.Errorf("retry: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("retry outbox row %d: commit: %w", id, err)
	}
	return o, nil
}

// FailOrphanedOutbox marks up to limit orphaned rows failed, each with the reason in
// last_error, and returns their ids. A row is orphaned when it is pending but no
// unfinished job will deliver it: typically the reaper discarded its delivery job after
// the holder of every attempt crashed, so no handler ever marked the row. Run it
// periodically (housekeeping): failed rows are counted, listed and retryable, never
// silently stuck.
func FailOrphanedOutbox(ctx context.Context, db DBTX, limit int) ([]int64, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := db.Query(ctx, sqlFailOrphanedOutbox, customPlan, limit)
	if err != nil {
		return nil, fmt.Errorf("fail orphaned outbox rows: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("fail orphaned outbox rows: %w", err)
	}
	return ids, nil
}

// OutboxBacklog is the outbox backlog, by the database's clock.
type OutboxBacklog struct {
	Pending int64 `json:"pending"`
	Failed  int64 `json:"failed"`
	// OldestPendingAge is now() minus the available_at of the oldest pending row; zero
	// when nothing is pending. Alert on it: it is the age of the undelivered backlog.
	OldestPendingAge time.Duration `json:"oldest_pending_age"`
	// Orphaned counts pending rows that no unfinished job will deliver (see
	// FailOrphanedOutbox).
	Orphaned int64 `json:"orphaned"`
}

// OutboxStats reads the outbox backlog: pending and failed counts, the age of the
// oldest pending row and the orphan count.
func OutboxStats(ctx context.Context, db DBTX) (OutboxBacklog, error) {
	var s OutboxBacklog
	var age float64
	if err := db.QueryRow(ctx, sqlOutboxStats).Scan(&s.Pending, &s.Failed, &age, &s.Orphaned); err != nil {
		return OutboxBacklog{}, fmt.Errorf("outbox stats: %w", err)
	}
	s.OldestPendingAge = time.Duration(age * float64(time.Second))
	return s, nil
}
