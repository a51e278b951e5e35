package email

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// DeliverArgs are the args of an outbox delivery job (queue.OutboxDeliverKind), as
// written by queue.InsertOutbox.
type DeliverArgs struct {
	OutboxID int64 `json:"outbox_id"`
}

// Kind implements fenceq.JobArgs.
func (DeliverArgs) Kind() string { return queue.OutboxDeliverKind }

// Metrics counts the relay's outcomes by outbox topic. Methods must be fast and safe for
// concurrent use.
type Metrics interface {
	// Delivered: a row was sent and marked delivered.
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

// RelayConfig configures the outbox relay.
type RelayConfig struct {
	// Pool reads outbox rows. Required.
	Pool *pgxpool.Pool
	// Mailer sends rows of topic "email". Required.
	Mailer Mailer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics defaults to NopMetrics.
	Metrics Metrics
	// MessageIDDomain is the right-hand side of derived Message-IDs. Defaults to
	// DefaultMessageIDDomain. Changing it changes the Message-ID of rows not yet
	// delivered: keep it fixed.
	MessageIDDomain string
	// Timeout bounds one delivery attempt (the handler's context). Defaults to 2m.
	Timeout time.Duration
	// Backoff overrides the worker's retry policy for delivery jobs.
	Backoff *queue.Backoff
	// WriteTimeout bounds the fenced writes made after the send (delivered, failed,
	// attempt error). Defaults to 10s.
	WriteTimeout time.Duration
}

type relay struct {
	cfg RelayConfig
	log *slog.Logger
}

func newRelay(cfg RelayConfig) (*relay, error) {
	if cfg.Pool == nil {
		return nil, errors.New("email relay: Pool: required")
	}
	if cfg.Mailer == nil {
		return nil, errors.New("email relay: Mailer: required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
	}
	if cfg.MessageIDDomain == "" {
		cfg.MessageIDDomain = DefaultMessageIDDomain
	}
	if !printableASCII(cfg.MessageIDDomain, false) {
		return nil, fmt.Errorf("email relay: MessageIDDomain %q: must be printable ASCII without spaces", cfg.MessageIDDomain)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	return &relay{cfg: cfg, log: cfg.Logger.With("component", "outbox-relay")}, nil
}

// Handler returns the relay as a handler of outbox delivery jobs, for callers that wrap
// it; Register is the usual way in.
func Handler(cfg RelayConfig) (fenceq.HandlerFunc[DeliverArgs], error) {
	r, err := newRelay(cfg)
	if err != nil {
		return nil, err
	}
	return r.deliver, nil
}

// HandlerOpts returns the handler options Register uses for cfg.
func (cfg RelayConfig) HandlerOpts() fenceq.HandlerOpts {
	t := cfg.Timeout
	if t <= 0 {
		t = 2 * time.Minute
	}
	return fenceq.HandlerOpts{Timeout: t, Backoff: cfg.Backoff}
}

// Register adds the relay to hs as the handler of queue.OutboxDeliverKind. The worker
// must serve queue.OutboxQueue for rows to be delivered.
func Register(hs *fenceq.Handlers, cfg RelayConfig) error {
	h, err := Handler(cfg)
	if err != nil {
		return err
	}
	return fenceq.AddHandlerSafely(hs, h, cfg.HandlerOpts())
}

// deliver is one delivery attempt of one outbox row, under the delivery job's lease:
//
//  1. read the row; nothing to do unless it is pending and this job is its delivery job;
//  2. record the attempt under the lease (a revoked holder stops here);
//  3. send, with Message-ID and Idempotency-Key derived from the dedupe key;
//  4. in the job's fenced commit, mark the row delivered and complete the job — or, on a
//     permanent rejection or the last attempt, mark it failed (fenced) and discard the
//     job; otherwise record the error (fenced) and let the job retry with backoff.
//
// The writes after the send use a context that the job's cancellation does not reach:
// whether this holder may still write is the database's call (the fence), not a local
// timer's, and a message that went out should be recorded if the lease still allows it.
func (r *relay) deliver(ctx context.Context, job *fenceq.Job[DeliverArgs]) error {
	id := job.Args.OutboxID
	lease := job.Lease()
	log := r.log.With("outbox_id", id, "job_id", lease.JobID, "lease_gen", lease.Gen, "attempt", job.Attempt)

	row, err := queue.GetOutbox(ctx, r.cfg.Pool, id)
	if errors.Is(err, queue.ErrNotFound) {
		log.Error("outbox row of a delivery job does not exist; nothing to deliver")
		return fenceq.JobDiscard(err)
	}
	if err != nil {
		return fmt.Errorf("deliver outbox row %d: %w", id, err)
	}
	log = log.With("topic", row.Topic, "dedupe_key", row.DedupeKey)
	if row.State != queue.OutboxPending || row.DeliveryJobID == nil || *row.DeliveryJobID != job.ID {
		log.Info("outbox row needs no delivery by this job", "state", row.State)
		return nil
	}

	// Writes after this point get their own WriteTimeout, detached from the job's
	// context, counted from when they start: started before the send, the clock ran
	// through a slow SMTP exchange and left the writes after it no time.
	writeCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), r.cfg.WriteTimeout)
	}

	msg, err := r.message(row)
	if err != nil {
		wctx, cancel := writeCtx()
		defer cancel()
		return r.fail(wctx, job, row, log, &PermanentError{Err: err})
	}
	err = job.WithLease(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := queue.BeginOutboxAttempt(ctx, tx, id, lease)
		return err
	})
	if err != nil {
		if errors.Is(err, queue.ErrLeaseLost) {
			log.Warn("delivery not started: lease lost", "err", err)
		}
		return fmt.Errorf("deliver outbox row %d: %w", id, err)
	}

	sendErr := r.cfg.Mailer.Send(ctx, msg)
	wctx, cancel := writeCtx()
	defer cancel()
	if sendErr == nil {
		err := job.Commit(wctx, func(ctx context.Context, tx pgx.Tx) error {
			return queue.MarkOutboxDelivered(ctx, tx, id, lease)
		})
		if errors.Is(err, queue.ErrLeaseLost) {
			log.Warn("message sent but the lease was lost before the row was marked delivered; "+
				"the next holder sends it again with the same Message-ID", "message_id", msg.MessageID, "err", err)
			return err
		}
		if err != nil {
			return fmt.Errorf("mark outbox row %d delivered: %w", id, err)
		}
		r.cfg.Metrics.Delivered(row.Topic)
		log.Info("outbox row delivered", "message_id", msg.MessageID)
		return nil
	}

	if IsPermanent(sendErr) || job.Attempt >= job.MaxAttempts {
		return r.fail(wctx, job, row, log, sendErr)
	}
	err = job.WithLease(wctx, func(ctx context.Context, tx pgx.Tx) error {
		return queue.RecordOutboxAttempt(ctx, tx, id, lease, sendErr.Error())
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
func (r *relay) fail(ctx context.Context, job *fenceq.Job[DeliverArgs], row *queue.OutboxRow, log *slog.Logger, cause error) error {
	reason := fmt.Sprintf("attempt %d of %d: %v", job.Attempt, job.MaxAttempts, cause)
	err := job.WithLease(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return queue.MarkOutboxFailed(ctx, tx, row.ID, job.Lease(), reason)
	})
	if err != nil {
		// Not marked: the job retries (or, past its attempts, is discarded and the row
		// becomes an orphan that queue.FailOrphanedOutbox marks failed).
		log.Error("could not mark outbox row failed", "err", err, "cause", cause)
		return errors.Join(cause, fmt.Errorf("mark outbox row %d failed: %w", row.ID, err))
	}
	r.cfg.Metrics.Failed(row.Topic)
	log.Error("outbox row failed; kept for an operator to retry", "reason", reason, "permanent", IsPermanent(cause))
	return fenceq.JobDiscard(cause)
}

// message decodes a row's payload and stamps it with the headers derived from the
// dedupe key and the row's creation time.
func (r *relay) message(row *queue.OutboxRow) (Message, error) {
	if row.Topic != TopicEmail {
		return Message{}, fmt.Errorf("outbox topic %q: this relay delivers only %q", row.Topic, TopicEmail)
	}
	var m Message
	if err := json.Unmarshal(row.Payload, &m); err != nil {
		return Message{}, fmt.Errorf("decode email payload: %w", err)
	}
	m.MessageID = MessageIDFor(row.DedupeKey, r.cfg.MessageIDDomain)
	m.IdempotencyKey = IdempotencyKeyFor(row.DedupeKey)
	m.Date = row.CreatedAt
	if err := m.Validate(); err != nil {
		return Message{}, err
	}
	return m, nil
}
