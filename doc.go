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
// # Packages
//
// Package queue (github.com/fenceq/fenceq/queue) is the data model every fenceq package
// shares: job rows, states and the state machine, leases, schedules, limits and the
// sentinel errors (queue.ErrLeaseLost, queue.ErrNotFound, queue.ErrInvalid). Packages
// outbox and idempotency hold the outbox and the idempotency keys, fenceqtest the test
// helpers, fenceqprom, fenceqotel and fenceqweb the metrics, traces and dashboard.
//
// # Operating
//
// The functions an operator's tools call are in this package too, each taking a
// queue.DBTX (a pool, or a pgx.Tx to act inside your transaction): GetJob, ListJobs,
// RetryJob, CancelJob, RequeueJob, DeleteJob and their bulk forms by filter (RetryJobs,
// ...), ListQueues, PauseQueue, ResumeQueue, AddQueue, RemoveQueue, ListWorkers, the
// periodic schedule calls and the counts (CountJobs, JobThroughput, CountLeaseEvents).
// The fenceq CLI and the dashboard are built on them.
package fenceq
