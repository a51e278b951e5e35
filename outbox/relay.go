package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// Delivery is one attempt to deliver one row.
type Delivery struct {
	// Row is the row as the attempt began: pending, its payload to decode.
	Row *Row
	// Key is the idempotency key of the row: the same on every attempt (see DeliveryKey).
	// Send it to the receiver (an Idempotency-Key header, a message id) so that it can
	// drop a second copy.
	Key string
	// Attempt counts from 1; MaxAttempts is the last one.
	Attempt, MaxAttempts int
}

// Deliverer delivers the rows of one topic. Deliver returns nil only once the receiver
// accepted the row; an error matching IsPermanent when no retry can succeed (the row
// is marked failed at once); any other error is retried with backoff until the last
// attempt. It must honour ctx and be safe for concurrent use.
type Deliverer interface {
	Deliver(ctx context.Context, d *Delivery) error
}

// DelivererFunc adapts a function to Deliverer.
type DelivererFunc func(ctx context.Context, d *Delivery) error

// Deliver implements Deliverer.
func (f DelivererFunc) Deliver(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// PermanentError is a delivery error that no retry can fix: a rejection that will not
// change, or a payload the deliverer cannot read. The relay marks the row failed with
// the error as its reason.
type PermanentError struct{ Err error }

// Error implements error.
func (e *PermanentError) Error() string { return fmt.Sprintf("permanent failure: %v", e.Err) }

// Unwrap returns Err.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as a permanent delivery failure.
func Permanent(err error) error { return &PermanentError{Err: err} }

// IsPermanent reports whether err is a permanent delivery failure: a *PermanentError, or
// an error in the chain with a method Permanent() bool that returns true.
func IsPermanent(err error) bool {
	var pe *PermanentError
	if errors.As(err, &pe) {
		return true
	}
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

// DeliveryKey derives the idempotency key of every delivery attempt of a row from its
// dedupe key: the dedupe key itself when it is printable ASCII without spaces and at
// most 200 bytes, else "sha256:" and the hex SHA-256 of it.
func DeliveryKey(dedupeKey string) string {
	if dedupeKey != "" && len(dedupeKey) <= 200 && printableASCII(dedupeKey) {
		return dedupeKey
	}
	sum := sha256.Sum256([]byte(dedupeKey))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Metrics counts the relay's outcomes by topic. Methods must be fast and safe for
// concurrent use.
type Metrics interface {
	// Delivered: a row was delivered and marked delivered.
	Delivered(topic string)
	// Retried: an attempt failed transiently; the row will be tried again.
	Retried(topic string)
	// Failed: a row was marked failed (permanent rejection or last attempt).
	Failed(topic string)
}

// NopMetrics counts nothing.
type NopMetrics struct{}

// Delivered implements Metrics.
func (NopMetrics) Delivered(string) {}

// Retried implements Metrics.
func (NopMetrics) Retried(string) {}

// Failed implements Metrics.
func (NopMetrics) Failed(string) {}

var _ Metrics = NopMetrics{}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Pool reads outbox rows. Required.
	Pool *pgxpool.Pool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics defaults to NopMetrics.
	Metrics Metrics
	// Timeout bounds one delivery attempt (the handler's context). Defaults to 2m.
	Timeout time.Duration
	// Backoff overrides the worker's retry policy for delivery jobs.
	Backoff *queue.Backoff
	// WriteTimeout bounds the fenced writes made after the delivery (delivered, failed,
	// attempt error). Defaults to 10s.
	WriteTimeout time.Duration
}

// Relay delivers outbox rows through one Deliverer per topic, as the handler of
// DeliverKind jobs.
type Relay struct {
	cfg    RelayConfig
	log    *slog.Logger
	topics map[string]Deliverer
}

// NewRelay checks cfg and returns a relay with no topics yet.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if cfg.Pool == nil {
		return nil, errors.New("outbox relay: Pool: required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
	}
	if cfg.Timeout < 0 || cfg.WriteTimeout < 0 {
		return nil, errors.New("outbox relay: Timeout and WriteTimeout must not be negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	return &Relay{cfg: cfg, log: cfg.Logger.With("component", "outbox-relay"), topics: map[string]Deliverer{}}, nil
}

// Handle makes d the deliverer of topic's rows. A topic takes one deliverer.
func (r *Relay) Handle(topic string, d Deliverer) error {
	if topic == "" || len(topic) > MaxTopicLen {
		return fmt.Errorf("outbox relay: topic %q: must be 1–%d characters", topic, MaxTopicLen)
	}
	if d == nil {
		return fmt.Errorf("outbox relay: topic %q: nil deliverer", topic)
	}
	if _, dup := r.topics[topic]; dup {
		return fmt.Errorf("outbox relay: topic %q already has a deliverer", topic)
	}
	r.topics[topic] = d
	return nil
}

// Register adds the relay to hs as the handler of DeliverKind. The worker must serve
// Queue for rows to be delivered. Add every topic before the worker starts.
func (r *Relay) Register(hs *fenceq.Handlers) error {
	return fenceq.AddHandlerSafely(hs, r.deliver, &fenceq.HandlerOpts{Timeout: r.cfg.Timeout, Backoff: r.cfg.Backoff})
}

// deliver is one delivery attempt of one outbox row, under the delivery job's lease:
//
//  1. read the row; nothing to do unless it is pending and this job is its delivery job;
//  2. record the attempt under the lease (a revoked holder stops here);
//  3. deliver through the topic's Deliverer, with the row's idempotency key;
//  4. in the job's fenced commit, mark the row delivered and complete the job — or, on a
//     permanent error or the last attempt, mark it failed (fenced) and discard the job;
//     otherwise record the error (fenced) and let the job retry with backoff.
//
// The writes after the delivery use a context that the job's cancellation does not
// reach: whether this holder may still write is the database's call (the fence), not a
// local timer's, and a delivery that happened should be recorded if the lease allows.
func (r *Relay) deliver(ctx context.Context, job *fenceq.Job[DeliverArgs]) error {
	id := job.Args.OutboxID
	lease := job.Lease()
	log := r.log.With("outbox_id", id, "job_id", lease.JobID, "lease_gen", lease.Gen, "attempt", job.Attempt)

	row, err := Get(ctx, r.cfg.Pool, id)
	if errors.Is(err, queue.ErrNotFound) {
		log.Error("outbox row of a delivery job does not exist; nothing to deliver")
		return fenceq.JobDiscard(err)
	}
	if err != nil {
		return fmt.Errorf("deliver outbox row %d: %w", id, err)
	}
	log = log.With("topic", row.Topic, "dedupe_key", row.DedupeKey)
	if row.State != StatePending || row.DeliveryJobID == nil || *row.DeliveryJobID != job.ID {
		log.Info("outbox row needs no delivery by this job", "state", row.State)
		return nil
	}

	// Writes after this point get their own WriteTimeout, detached from the job's
	// context, counted from when they start, so a slow delivery leaves them their time.
	writeCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), r.cfg.WriteTimeout)
	}

	d, ok := r.topics[row.Topic]
	if !ok {
		wctx, cancel := writeCtx()
		defer cancel()
		return r.fail(wctx, job, row, log, Permanent(fmt.Errorf("no deliverer for outbox topic %q on this worker", row.Topic)))
	}
	var attempt int
	err = job.WithLease(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		attempt, err = beginAttempt(ctx, tx, id, lease)
		return err
	})
	if err != nil {
		if errors.Is(err, queue.ErrLeaseLost) {
			log.Warn("delivery not started: lease lost", "err", err)
		}
		return fmt.Errorf("deliver outbox row %d: %w", id, err)
	}
	row.Attempt = attempt

	delivery := &Delivery{Row: row, Key: DeliveryKey(row.DedupeKey), Attempt: job.Attempt, MaxAttempts: job.MaxAttempts}
	sendErr := d.Deliver(ctx, delivery)
	wctx, cancel := writeCtx()
	defer cancel()
	if sendErr == nil {
		err := job.Commit(wctx, func(ctx context.Context, tx pgx.Tx) error {
			return markDelivered(ctx, tx, id, lease)
		})
		if errors.Is(err, queue.ErrLeaseLost) {
			log.Warn("delivered but the lease was lost before the row was marked delivered; "+
				"the next holder delivers it again with the same key", "key", delivery.Key, "err", err)
			return err
		}
		if err != nil {
			return fmt.Errorf("mark outbox row %d delivered: %w", id, err)
		}
		r.cfg.Metrics.Delivered(row.Topic)
		log.Info("outbox row delivered", "key", delivery.Key)
		return nil
	}

	if IsPermanent(sendErr) || job.Attempt >= job.MaxAttempts {
		return r.fail(wctx, job, row, log, sendErr)
	}
	err = job.WithLease(wctx, func(ctx context.Context, tx pgx.Tx) error {
		return recordAttempt(ctx, tx, id, lease, sendErr.Error())
	})
	if err != nil {
		log.Warn("could not record the failed attempt", "err", err)
		if errors.Is(err, queue.ErrLeaseLost) {
			return errors.Join(sendErr, err)
		}
	}
	r.cfg.Metrics.Retried(row.Topic)
	log.Warn("delivery attempt failed; will retry", "err", sendErr, "max_attempts", job.MaxAttempts)
	return fmt.Errorf("deliver outbox row %d: %w", id, sendErr)
}

// fail marks the row failed with the reason, under the lease, and discards the job.
func (r *Relay) fail(ctx context.Context, job *fenceq.Job[DeliverArgs], row *Row, log *slog.Logger, cause error) error {
	reason := fmt.Sprintf("attempt %d of %d: %v", job.Attempt, job.MaxAttempts, cause)
	err := job.WithLease(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return markFailed(ctx, tx, row.ID, job.Lease(), reason)
	})
	if err != nil {
		// Not marked: the job retries (or, past its attempts, is discarded and the row
		// becomes an orphan that FailOrphaned marks failed).
		log.Error("could not mark outbox row failed", "err", err, "cause", cause)
		return errors.Join(cause, fmt.Errorf("mark outbox row %d failed: %w", row.ID, err))
	}
	r.cfg.Metrics.Failed(row.Topic)
	log.Error("outbox row failed; kept for an operator to retry", "reason", reason, "permanent", IsPermanent(cause))
	return fenceq.JobDiscard(cause)
}
