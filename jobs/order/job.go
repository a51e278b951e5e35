package order

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/queue"
)

// PlaceKind is the job kind that places an order that arrived through the queue.
const PlaceKind = "order.place"

// PlaceArgs are the args of an order.place job.
type PlaceArgs struct {
	IdempotencyKey string  `json:"idempotency_key"`
	Request        Request `json:"request"`
}

// Kind implements fenceq.JobArgs.
func (PlaceArgs) Kind() string { return PlaceKind }

// Register adds the order.place handler to hs. The handler runs PlaceTx inside the job's
// fenced Commit, so the order, its items, its email outbox row, its idempotency record
// and the job's completion commit together, and only while the job's lease is held:
//
//   - first placement with the key: the order is created, job_id/lease_gen recorded;
//   - the key was already used with the same request (by HTTP or another job): the job
//     completes with the existing order and writes nothing else;
//   - the key was used with a different request, or the args are invalid: the job is
//     discarded (no retry can succeed);
//   - the key's first request is still in flight: the attempt fails and is retried
//     with backoff.
func Register(hs *fenceq.Handlers, svc *Service) error {
	if svc == nil {
		return errors.New("register order handler: nil Service")
	}
	return fenceq.AddHandlerSafely(hs, func(ctx context.Context, job *fenceq.Job[PlaceArgs]) error {
		lease := job.Lease()
		var res *Result
		// Detached from the job's context, as the invoice handler and Place do: whether
		// a holder may still write is the database's fence to decide, not a local timer.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), svc.cfg.WriteTimeout)
		defer cancel()
		err := job.Commit(cctx, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = svc.PlaceTx(ctx, tx, job.Args.IdempotencyKey, job.Args.Request, &lease)
			return err
		})
		switch {
		case errors.Is(err, queue.ErrInvalid), errors.Is(err, idempotency.ErrKeyReuse):
			return fenceq.JobDiscard(fmt.Errorf("order.place job %d: %w", job.ID, err))
		case err != nil:
			return err
		}
		log := svc.log.With("job_id", job.ID, "lease_gen", lease.Gen, "idempotency_key", job.Args.IdempotencyKey)
		if res.Replayed {
			log.Info("order.place job found its order already placed", "order_id", res.Order.ID)
			return nil
		}
		svc.cfg.Metrics.Created()
		log.Info("order placed by job", "order_id", res.Order.ID, "total_cents", res.Order.TotalCents)
		return nil
	}, nil)
}
