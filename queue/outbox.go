package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// Outbox rows are delivered by jobs: writing a row also enqueues, in the same
// transaction, one job of kind OutboxDeliverKind on OutboxQueue whose args name the row.
// The relay is that job's handler, so outbox rows are claimed, leased, fenced, heartbeated,
// reaped and retried by exactly the machinery that runs every other job; the row's
// lease_gen and leased_by record the delivery job's lease that delivered it.
const (
	OutboxDeliverKind = "outbox.deliver"
	OutboxQueue       = "outbox"
	// DefaultOutboxMaxAttempts is how many delivery attempts a row gets before it is
	// marked failed.
	DefaultOutboxMaxAttempts = 10
)

// OutboxDeliverArgs are the args of a delivery job.
type OutboxDeliverArgs struct {
	OutboxID int64 `json:"outbox_id"`
}

// OutboxParams describes one outbox row.
type OutboxParams struct {
	// Topic routes the row to its deliverer, e.g. "email".
	Topic string
	// DedupeKey is unique across the outbox and is the idempotency key of every delivery
	// attempt, e.g. "invoice-email:42".
	DedupeKey string
	// Payload is a JSON object.
	Payload []byte
	// JobID is the job whose transaction wrote the row, if any.
	JobID int64
	// MaxAttempts for the delivery job; defaults to DefaultOutboxMaxAttempts.
	MaxAttempts int
}

// OutboxResult is the outcome of InsertOutbox.
type OutboxResult struct {
	ID int64
	// Existing is true when a row with the dedupe key already existed: nothing was
	// written and no delivery job enqueued.
	Existing bool
	// DeliveryJobID is the id of the delivery job (of the existing row, when Existing).
	DeliveryJobID int64
}

const sqlInsertOutbox = `
INSERT INTO fenceq_outbox (topic, dedupe_key, payload, job_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (dedupe_key) DO NOTHING
RETURNING id`

const sqlSetOutboxDeliveryJob = `UPDATE fenceq_outbox SET delivery_job_id = $2 WHERE id = $1`

const sqlGetOutboxByKey = `SELECT id, COALESCE(delivery_job_id, 0) FROM fenceq_outbox WHERE dedupe_key = $1`

// InsertOutbox writes an outbox row and enqueues its delivery job, both in tx. Call it
// inside the transaction that writes the business rows (a job's fenced Commit): the row
// exists if and only if they commit. A second insert with the same dedupe key writes
// nothing and returns the existing row.
func InsertOutbox(ctx context.Context, tx pgx.Tx, p OutboxParams) (*OutboxResult, error) {
	if p.Topic == "" || len(p.Topic) > 128 {
		return nil, invalid("topic", "must be 1–128 characters")
	}
	if err := ValidateUniqueKey("dedupe_key", p.DedupeKey); err != nil {
		return nil, err
	}
	if len(p.Payload) == 0 {
		p.Payload = []byte("{}")
	}
	if err := ValidateArgs(p.Payload, 0); err != nil {
		return nil, fmt.Errorf("outbox payload: %w", err)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultOutboxMaxAttempts
	}
	var jobID *int64
	if p.JobID != 0 {
		jobID = &p.JobID
	}
	var id int64
	err := tx.QueryRow(ctx, sqlInsertOutbox, p.Topic, p.DedupeKey, p.Payload, jobID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		res := &OutboxResult{Existing: true}
		if err := tx.QueryRow(ctx, sqlGetOutboxByKey, p.DedupeKey).Scan(&res.ID, &res.DeliveryJobID); err != nil {
			return nil, fmt.Errorf("read outbox row %q: %w", p.DedupeKey, err)
		}
		return res, nil
	}
	if err != nil {
		return nil, fmt.Errorf("insert outbox row %q: %w", p.DedupeKey, err)
	}
	deliveryID, err := enqueueDelivery(ctx, tx, id, p.MaxAttempts)
	if err != nil {
		return nil, err
	}
	return &OutboxResult{ID: id, DeliveryJobID: deliveryID}, nil
}

// enqueueDelivery enqueues, in tx, the outbox.deliver job of row id (unique key
// "outbox:<id>") and links the row to it. A delivery job of the row that is still
// unfinished gives ErrWrongState: linking the row to it again would deliver nothing new.
func enqueueDelivery(ctx context.Context, tx pgx.Tx, id int64, maxAttempts int) (int64, error) {
	args, _ := json.Marshal(OutboxDeliverArgs{OutboxID: id})
	job, err := Insert(ctx, tx, InsertParams{
		Queue: OutboxQueue, Kind: OutboxDeliverKind, Args: args, MaxAttempts: maxAttempts,
		UniqueKey: "outbox:" + strconv.FormatInt(id, 10),
	})
	if err != nil {
		return 0, fmt.Errorf("enqueue delivery of outbox row %d: %w", id, err)
	}
	if job.Existing {
		return 0, fmt.Errorf("enqueue delivery of outbox row %d: it is failed but its delivery job %d is still %s; "+
			"retry once that job has ended: %w", id, job.Job.ID, job.Job.State, ErrWrongState)
	}
	if _, err := tx.Exec(ctx, sqlSetOutboxDeliveryJob, id, job.Job.ID); err != nil {
		return 0, fmt.Errorf("link outbox row %d to its delivery job: %w", id, err)
	}
	return job.Job.ID, nil
}
