package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/verify"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/outbox"
)

// demoRun is one run of the demo in its schema.
type demoRun struct {
	cfg    Scale
	url    string
	pool   *pgxpool.Pool
	log    *slog.Logger
	pr     *progress
	dir    string
	m      *builtin.Metrics
	period string
	pause  *pauser
	pools  []*pgxpool.Pool // the workers' pools
}

func (r *demoRun) mailPath() string { return filepath.Join(r.dir, "mail.jsonl") }

// The demo's scaled-down timing: heartbeats and the reaper at a quarter of the lease.
func (r *demoRun) heartbeat() time.Duration { return r.cfg.Lease / 4 }
func (r *demoRun) reaper() time.Duration    { return r.cfg.Lease / 4 }

// Per-worker sizes: the billing and outbox handlers plus heartbeat, claims, LISTEN and
// the reaper share a pool of workerConns.
const (
	billingSlots   = 4
	outboxSlots    = 2
	workerConns    = 6
	clientsPerKey  = 3
	retryEvery     = 300 * time.Millisecond
	minSendsPerKey = 6
)

type demoCounts struct {
	invoices, unfinishedInvoiceJobs, orders, delivered, pending, revoked, stale, alive int64
}

func (r *demoRun) counts(ctx context.Context) (demoCounts, error) {
	var d demoCounts
	err := r.pool.QueryRow(ctx, sqlProgress).Scan(&d.invoices, &d.unfinishedInvoiceJobs, &d.orders, &d.delivered,
		&d.pending, &d.revoked, &d.stale, &d.alive)
	if err != nil {
		return d, fmt.Errorf("demo: read progress: %w", err)
	}
	return d, nil
}

func (r *demoRun) run(ctx context.Context) (*Report, error) {
	r.period = invoice.PreviousPeriod(time.Now())
	var err error
	if r.m, err = builtin.NewMetrics(prometheus.NewRegistry()); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	rep := &Report{Config: r.cfg, Period: r.period}
	if _, err := invoice.SeedCustomers(ctx, r.pool, r.cfg.Customers, r.period); err != nil {
		return nil, fmt.Errorf("demo: seed customers: %w", err)
	}
	r.pr.say("seeded %d customers with usage for %s", r.cfg.Customers, r.period)

	mailer, err := email.NewFileMailer(r.mailPath())
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	defer mailer.Close()

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	r.pause = newPauser(r, runCtx)
	workers, taxes, err := r.startWorkers(ctx, mailer)
	stopWorkers := func() {
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Go(func() {
				sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				if err := w.Stop(sctx); err != nil {
					r.log.Warn("stop demo worker", "worker", w.ID(), "err", err)
				}
			})
		}
		wg.Wait()
		workers = nil
		for _, p := range r.pools {
			p.Close()
		}
		r.pools = nil
	}
	defer func() {
		cancelRun() // releases a pause still in progress
		stopWorkers()
	}()
	if err != nil {
		return nil, err
	}
	r.pr.say("%d workers started (lease %s, heartbeat %s, reaper %s), each with its own pool; "+
		"the tax service's slow tail takes %s–%s, longer than the lease",
		len(workers), r.cfg.Lease, r.heartbeat(), r.reaper(), r.cfg.Lease*3/2, r.cfg.Lease*5/2)

	srv, closeOrders, err := r.startOrders(ctx)
	if err != nil {
		return nil, err
	}
	defer closeOrders()

	n, err := invoice.RunBilling(ctx, r.pool, r.period)
	if err != nil {
		return nil, fmt.Errorf("demo: billing run: %w", err)
	}
	rows, err := r.pool.Query(ctx, sqlJobIDs, invoice.Kind)
	if err != nil {
		return nil, fmt.Errorf("demo: list invoice jobs: %w", err)
	}
	invoiceJobs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("demo: list invoice jobs: %w", err)
	}
	r.pr.say("billing run for %s: %d invoice jobs on queue %s", r.period, n, invoice.Queue)

	stormDone := make(chan StormCounts, 1)
	go func() { stormDone <- r.storm(runCtx, "http://"+srv.Addr) }()
	r.pr.say("order retry storm: %d idempotency keys, %d clients each, a retry every %s, commits slowed to 400–600 ms",
		r.cfg.OrderKeys, clientsPerKey, retryEvery)

	var storm *StormCounts
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last demoCounts
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			why := "gave up after " + time.Since(r.pr.start).Round(time.Second).String() + " (see --timeout)"
			if errors.Is(ctx.Err(), context.Canceled) {
				why = "interrupted"
			}
			return nil, fmt.Errorf("demo: %s: %d of %d invoices, %d of %d orders, %d emails pending",
				why, last.invoices, r.cfg.Customers, last.orders, r.cfg.OrderKeys, last.pending)
		case s := <-stormDone:
			storm = &s
			r.pr.say("order storm over: %d requests, %d created, %d replayed, %d told to retry",
				s.Requests, s.Created, s.Replayed, s.InFlight)
		case <-tick.C:
		}
		d, err := r.counts(ctx)
		if err != nil {
			return nil, err
		}
		last = d
		if i%2 == 0 {
			r.pr.say("invoices %d/%d · orders %d/%d · emails delivered %d, pending %d · revoked %d · stale writes rejected %d · "+
				"expired while holder lived %d", d.invoices, r.cfg.Customers, d.orders, r.cfg.OrderKeys, d.delivered, d.pending,
				d.revoked, d.stale, d.alive)
		}
		if storm != nil && r.pause.finished() && d.unfinishedInvoiceJobs == 0 && d.pending == 0 {
			break
		}
	}
	stopWorkers()
	closeOrders()
	r.pr.say("all work done; workers stopped")

	d, err := r.counts(ctx)
	if err != nil {
		return nil, err
	}
	rep.Invoices, rep.Orders, rep.LeasesRevoked, rep.StaleWritesRejected, rep.ExpiredHolderAlive =
		d.invoices, d.orders, d.revoked, d.stale, d.alive
	rep.Storm = *storm
	if err := r.pool.QueryRow(ctx, sqlEmails).Scan(&rep.InvoiceEmails, &rep.OrderEmails); err != nil {
		return nil, fmt.Errorf("demo: count emails: %w", err)
	}
	for _, t := range taxes {
		st := t.Stats()
		rep.TaxCalls += st.Calls
		rep.SlowTaxCalls += st.Tails
	}
	if rep.MailLines, rep.DistinctMessageIDs, err = readMailFile(r.mailPath()); err != nil {
		return nil, err
	}
	if rep.Pause, err = r.pause.report(ctx); err != nil {
		return nil, err
	}
	rep.Verify, err = verify.Run(ctx, r.pool, verify.Options{ReaperInterval: r.reaper(), ExpectedJobs: invoiceJobs,
		RequireFinal: true, RequireAllFinal: true})
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	rep.Duplicates, rep.LostJobs = rep.Verify.Duplicates(), rep.Verify.Lost()
	return rep, nil
}

// gatedPool opens a worker's pool whose connections can be withheld, as from a frozen
// process: while the gate is closed every acquire waits (until it opens or the caller's
// context ends), so none of the worker's heartbeats, claims or writes reaches the
// database.
func (r *demoRun) gatedPool(ctx context.Context, g *gate, name string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(r.url)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	cfg.MaxConns = workerConns
	cfg.ConnConfig.RuntimeParams["application_name"] = "fenceq demo " + name
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if err := g.wait(ctx); err != nil {
			return true, fmt.Errorf("%s is frozen: %w", name, err)
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("demo: pool of %s: %w", name, err)
	}
	return pool, nil
}

// startWorkers starts the demo's workers, each with its own gated pool (closed by
// stopWorkers) and its own simulated tax service.
func (r *demoRun) startWorkers(ctx context.Context, mailer email.Mailer) ([]*fenceq.Worker, []*invoice.SimulatedTax, error) {
	var workers []*fenceq.Worker
	var taxes []*invoice.SimulatedTax
	for i := range r.cfg.Workers {
		id := fmt.Sprintf("worker-%d", i+1)
		pool, err := r.gatedPool(ctx, r.pause.db[i], id)
		if err != nil {
			return workers, taxes, err
		}
		r.pools = append(r.pools, pool)
		tax, err := invoice.NewSimulatedTax(invoice.SimulatedTaxConfig{
			MinLatency: 50 * time.Millisecond, MaxLatency: 250 * time.Millisecond,
			TailProbability: 0.12, TailMin: r.cfg.Lease * 3 / 2, TailMax: r.cfg.Lease * 5 / 2,
			Seed: r.cfg.Seed*1000 + uint64(i) + 1, Hook: r.pause.hook(i, id),
		})
		if err != nil {
			return workers, taxes, fmt.Errorf("demo: %w", err)
		}
		hs := fenceq.NewHandlers()
		log := r.log.With("worker", id)
		if err := invoice.Register(hs, invoice.Config{Pool: pool, Tax: tax, Logger: log, Metrics: r.m.Invoices}); err != nil {
			return workers, taxes, fmt.Errorf("demo: %w", err)
		}
		if _, err := email.RegisterRelay(hs, outbox.RelayConfig{Pool: pool, Logger: log, Metrics: r.m.Core.Outbox()},
			email.DelivererConfig{Mailer: mailer}); err != nil {
			return workers, taxes, fmt.Errorf("demo: %w", err)
		}
		w, err := fenceq.NewWorker(pool, fenceq.Config{
			Handlers: hs, ID: id,
			Queues: map[string]fenceq.QueueConfig{invoice.Queue: {MaxWorkers: billingSlots},
				outbox.Queue: {MaxWorkers: outboxSlots}},
			LeaseDuration: r.cfg.Lease, HeartbeatInterval: r.heartbeat(), ReaperInterval: r.reaper(),
			PollInterval: 200 * time.Millisecond, Logger: r.log, Hooks: []fenceq.Hook{r.m.Core},
		})
		if err != nil {
			return workers, taxes, fmt.Errorf("demo: %s: %w", id, err)
		}
		if err := w.Start(ctx); err != nil {
			return workers, taxes, fmt.Errorf("demo: start %s: %w", id, err)
		}
		workers = append(workers, w)
		taxes = append(taxes, tax)
	}
	return workers, taxes, nil
}
