// Package fenceq is a job queue for Go that needs only PostgreSQL and keeps one promise
// no other Postgres queue keeps: a job's outcome happens exactly once, even when a worker
// pauses past its lease, crashes, loses its connection, or a client retries.
//
// # How
//
// Every claim gives the job a new lease generation (a fencing token). The worker renews
// its leases with heartbeats; the reaper revokes expired ones by bumping the generation.
// Every write a worker makes for a job is checked against its generation by the database
// in the same statement or transaction, so a worker whose lease was revoked can write
// nothing and gets queue.ErrLeaseLost. A handler writes its results, its outbox rows and the
// job's completion in one fenced transaction (Job.Commit); business unique constraints
// stay as the last line of defence.
//
// # Use
//
//	hs := fenceq.NewHandlers()
//	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[InvoiceArgs]) error {
//		total, err := taxService.Compute(ctx, job.Args) // slow calls outside the transaction
//		if err != nil {
//			return err // retried with backoff
//		}
//		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, `INSERT INTO invoices …`, …) // results + outbox + completion
//			return err
//		})
//	}, nil) // nil: no HandlerOpts
//	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs})
//	…
//	err = w.Start(ctx)
//	defer w.Stop(shutdownCtx)
//	fenceq.Enqueue(ctx, pool, InvoiceArgs{CustomerID: 7, Period: "2026-10"}, nil)
//
// Package queue (github.com/fenceq/fenceq/queue) documents the lease state machine and
// the SQL behind each transition; packages outbox and idempotency hold the outbox and the
// idempotency keys.
package fenceq
