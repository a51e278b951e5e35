package cli

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/internal/httpserver"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/queue"
)

func workerCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "worker",
		Usage: "run a worker process for the built-in kinds until SIGINT or SIGTERM",
		Description: "Runs the built-in kinds: " + strings.Join(builtin.KindNames(), ", ") + ".\n" +
			"Enqueues the jobs of every periodic schedule (see `fenceq periodic`) unless --no-periodic;\n" +
			"when it serves the default queue, it defines the housekeeping schedule (every --housekeeping-interval).\n" +
			"On SIGINT or SIGTERM it stops claiming, lets running jobs finish for --shutdown-timeout,\n" +
			"then cancels the rest and gives their leases back (fenced), and deregisters.\n" +
			"With --http KIND=URL it also runs KIND by POSTing each job's args to URL (see docs/http-handlers.md).",
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "queues", Usage: "comma-separated queues to serve (default: " +
				strings.Join(builtin.Queues(), ",") + ")"},
			&ucli.IntFlag{Name: "concurrency", Value: 10, Usage: "jobs run at once per queue"},
			&ucli.DurationFlag{Name: "lease", Value: 60 * time.Second, Usage: "lease duration without a heartbeat"},
			&ucli.DurationFlag{Name: "heartbeat", Usage: "lease renewal interval (default lease/3)"},
			&ucli.DurationFlag{Name: "reaper", Value: 5 * time.Second, Usage: "how often expired leases are revoked"},
			&ucli.DurationFlag{Name: "poll", Value: time.Second, Usage: "how often queues are polled without a wake-up"},
			&ucli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus /metrics and /healthz here, e.g. :9090"},
			&ucli.DurationFlag{Name: "shutdown-timeout", Value: 30 * time.Second, Usage: "how long running jobs may finish on shutdown"},
			&ucli.StringFlag{Name: "id", Usage: "worker id (default host-pid-random)"},
			&ucli.IntFlag{Name: "max-conns", Value: 10, Usage: "database connections of this process"},
			&ucli.DurationFlag{Name: "retention", Value: 24 * time.Hour, Usage: "how long finished jobs are kept (negative: forever)"},
			&ucli.BoolFlag{Name: "no-listen", Usage: "no LISTEN/NOTIFY wake-ups, only --poll (for PgBouncer in transaction pooling mode)"},
			&ucli.BoolFlag{Name: "no-periodic", Usage: "run no scheduling passes: enqueue no periodic jobs, not even housekeeping"},
			&ucli.DurationFlag{Name: "periodic-interval", Value: time.Second, Usage: "how often a scheduling pass runs (it also wakes at the next due slot)"},
			&ucli.DurationFlag{Name: "periodic-grace", Value: 10 * time.Second, Usage: "slots due within this long after the last pass are caught up; later ones follow their schedule's --missed policy"},
		}, slices.Concat(uiFlags("ui-"), orderFlags(), builtinFlags(), httpFlags(), logFlags(), []ucli.Flag{databaseURLFlag()})...),
		Action: workerAction,
	}
}

func workerAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[flags]"); err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	queues := builtin.Queues()
	if s := strings.TrimSpace(c.String("queues")); s != "" {
		queues = nil
		for _, q := range strings.Split(s, ",") {
			q = strings.TrimSpace(q)
			if err := queue.ValidateQueue(q); err != nil {
				return usageError{fmt.Errorf("--queues: %w", err)}
			}
			if !slices.Contains(queues, q) {
				queues = append(queues, q)
			}
		}
	}
	if c.Int("concurrency") < 1 {
		return usageError{fmt.Errorf("invalid --concurrency %d: must be at least 1", c.Int("concurrency"))}
	}
	if c.Int("max-conns") < 2 {
		return usageError{fmt.Errorf("invalid --max-conns %d: must be at least 2", c.Int("max-conns"))}
	}
	var periodic []*fenceq.PeriodicJob
	if slices.Contains(queues, queue.DefaultQueue) && !c.Bool("no-periodic") {
		d := c.Duration("housekeeping-interval")
		hk, err := housekeeping.Periodic(d)
		if err != nil {
			return usageError{fmt.Errorf("invalid --housekeeping-interval %s: want a whole number of seconds, at least 1s", d)}
		}
		periodic = append(periodic, hk)
	}
	httpKinds, err := httpEndpoints(c)
	if err != nil {
		return err
	}
	tax, err := newTax(c)
	if err != nil {
		return err
	}
	mailer, mailDesc, closeMailer, err := newMailer(c)
	if err != nil {
		return err
	}
	defer func() {
		if err := closeMailer(); err != nil {
			log.Warn("close the mailer", "err", err)
		}
	}()
	pool, err := openMigrated(c, int32(c.Int("max-conns")))
	if err != nil {
		return err
	}
	defer pool.Close()

	m, err := newMetrics(pool, log)
	if err != nil {
		return err
	}
	orders, err := newOrderService(c, pool, log, m)
	if err != nil {
		return err
	}
	hs := fenceq.NewHandlers()
	if err := builtin.Register(hs, builtin.Deps{Pool: pool, Mailer: mailer, Tax: tax, Orders: orders,
		Logger: log, InvoiceMetrics: m.Invoices, OutboxMetrics: m.Core.Outbox()}); err != nil {
		return err
	}
	if err := addHTTPKinds(hs, httpKinds, m.Core.HTTP()); err != nil {
		return err
	}

	qcfg := make(map[string]fenceq.QueueConfig, len(queues))
	for _, q := range queues {
		qcfg[q] = fenceq.QueueConfig{MaxWorkers: c.Int("concurrency")}
	}
	w, err := fenceq.NewWorker(pool, fenceq.Config{
		Handlers: hs, Queues: qcfg, ID: c.String("id"),
		LeaseDuration: c.Duration("lease"), HeartbeatInterval: c.Duration("heartbeat"),
		ReaperInterval: c.Duration("reaper"), PollInterval: c.Duration("poll"),
		RetentionPeriod: c.Duration("retention"), DisableListen: c.Bool("no-listen"), Logger: log, Hooks: []fenceq.Hook{m.Core},
		Periodic: periodic, DisablePeriodic: c.Bool("no-periodic"),
		PeriodicInterval: c.Duration("periodic-interval"), PeriodicGrace: c.Duration("periodic-grace"),
	})
	if err != nil {
		return usageError{err}
	}
	if addr := c.String("ui-addr"); addr != "" {
		h, err := newDashboard(c, "ui-", pool, health.Thresholds{}, log)
		if err != nil {
			return err
		}
		ui, err := startDashboard(h, addr, "ui-addr", log)
		if err != nil {
			return err
		}
		defer func() {
			if err := ui.Stop(5 * time.Second); err != nil {
				log.Warn("stop dashboard", "err", err)
			}
		}()
	}
	log.Info(mailDesc)
	var srv *httpserver.Server
	if addr := c.String("metrics-addr"); addr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", m.handler())
		mux.Handle("GET /healthz", healthzHandler(pool))
		if srv, err = httpserver.Start(addr, mux, log, "metrics"); err != nil {
			return err
		}
	}
	// Logged when the context ends; not at all if Run returns first (a failed start).
	stopLog := context.AfterFunc(c.Context, func() {
		log.Info("shutting down: no new claims; running jobs get --shutdown-timeout to finish (signal again to force)",
			"shutdown_timeout", c.Duration("shutdown-timeout"))
	})
	defer stopLog()
	runErr := w.Run(c.Context, c.Duration("shutdown-timeout"))
	if err := srv.Stop(5 * time.Second); err != nil {
		log.Warn("stop metrics server", "err", err)
	}
	if runErr != nil {
		return runErr
	}
	log.Info("worker shut down gracefully")
	return nil
}

// healthzHandler answers 200 when the database answers, 503 otherwise.
func healthzHandler(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
}
