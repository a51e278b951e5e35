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
	"github.com/fenceq/fenceq/internal/clikit"
	"github.com/fenceq/fenceq/internal/httpserver"
	"github.com/fenceq/fenceq/queue"
)

func workerCommand(e *env) *ucli.Command {
	return &ucli.Command{
		Name:  "worker",
		Usage: "run a worker process until SIGINT or SIGTERM",
		Description: "Runs the kinds: " + listOrNone(e.kindNames()) + ".\n" +
			"Applies the pending migrations of the sets `" + e.opts.Name + " migrate up` installs, then starts.\n" +
			"Enqueues the jobs of every periodic schedule (see `" + e.opts.Name + " periodic`) unless --no-periodic.\n" +
			"On SIGINT or SIGTERM it stops claiming, lets running jobs finish for --shutdown-timeout,\n" +
			"then cancels the rest and gives their leases back (fenced), and deregisters.\n" +
			"With --http KIND=URL it also runs KIND by POSTing each job's args to URL (see docs/other-languages.md).",
		Flags: slices.Concat([]ucli.Flag{
			&ucli.StringFlag{Name: "queues", Usage: "comma-separated queues to serve (default: " +
				strings.Join(e.opts.Queues, ",") + ")"},
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
			&ucli.BoolFlag{Name: "no-periodic", Usage: "run no scheduling passes: enqueue no periodic jobs"},
			&ucli.BoolFlag{Name: "no-counters", Usage: "roll up no job counters for the dashboard (other workers, or the dashboard itself, do)"},
			&ucli.DurationFlag{Name: "periodic-interval", Value: time.Second, Usage: "how often a scheduling pass runs (it also wakes at the next due slot)"},
			&ucli.DurationFlag{Name: "periodic-grace", Value: 10 * time.Second, Usage: "slots due within this long after the last pass are caught up; later ones follow their schedule's --missed policy"},
		}, uiFlags("ui-"), e.opts.WorkerFlags, httpFlags(), logFlags(), []ucli.Flag{databaseURLFlag()}),
		Action: workerAction,
	}
}

// workerQueues reads --queues, else the command tree's default queues.
func workerQueues(c *ucli.Context, e *env) ([]string, error) {
	s := strings.TrimSpace(c.String("queues"))
	if s == "" {
		return slices.Clone(e.opts.Queues), nil
	}
	var queues []string
	for _, q := range strings.Split(s, ",") {
		q = strings.TrimSpace(q)
		if err := queue.ValidateQueue(q); err != nil {
			return nil, usageError{Err: fmt.Errorf("--queues: %w", err)}
		}
		if !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	return queues, nil
}

// openMigrated connects and applies the pending migrations of every set plain
// `migrate up` installs, as the worker does at start. A schema that is current is only
// read, so a worker behind a pooler in transaction mode starts on a schema migrated
// beforehand.
func openMigrated(c *ucli.Context, e *env, maxConns int32) (*pgxpool.Pool, error) {
	pool, err := openPool(c, maxConns)
	if err != nil {
		return nil, err
	}
	for _, s := range e.defaultSets() {
		if clikit.SetBehind(c.Context, pool, dbURL(c), s, "") == nil {
			continue
		}
		if err := s.Up(c.Context, pool); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

func workerAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[flags]"); err != nil {
		return err
	}
	e := envOf(c)
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	queues, err := workerQueues(c, e)
	if err != nil {
		return err
	}
	if c.Int("concurrency") < 1 {
		return usageError{Err: fmt.Errorf("invalid --concurrency %d: must be at least 1", c.Int("concurrency"))}
	}
	if c.Int("max-conns") < 2 {
		return usageError{Err: fmt.Errorf("invalid --max-conns %d: must be at least 2", c.Int("max-conns"))}
	}
	httpKinds, err := httpEndpoints(c)
	if err != nil {
		return err
	}
	pool, err := openMigrated(c, e, int32(c.Int("max-conns")))
	if err != nil {
		return err
	}
	defer pool.Close()

	m, err := newMetrics(pool, log)
	if err != nil {
		return err
	}
	hs := e.opts.Handlers
	if hs == nil {
		hs = fenceq.NewHandlers()
	}
	if err := addHTTPKinds(hs, httpKinds, m.Core.HTTP()); err != nil {
		return err
	}
	qcfg := make(map[string]fenceq.QueueConfig, len(queues))
	for _, q := range queues {
		qcfg[q] = fenceq.QueueConfig{MaxWorkers: c.Int("concurrency")}
	}
	cfg := fenceq.Config{
		Handlers: hs, Queues: qcfg, ID: c.String("id"),
		LeaseDuration: c.Duration("lease"), HeartbeatInterval: c.Duration("heartbeat"),
		ReaperInterval: c.Duration("reaper"), PollInterval: c.Duration("poll"),
		RetentionPeriod: c.Duration("retention"), DisableListen: c.Bool("no-listen"), Logger: log, Hooks: []fenceq.Hook{m.Core},
		DisablePeriodic:  c.Bool("no-periodic"),
		PeriodicInterval: c.Duration("periodic-interval"), PeriodicGrace: c.Duration("periodic-grace"),
	}
	if c.Bool("no-counters") {
		cfg.CountersInterval = -1
	}
	if !c.Bool("no-periodic") {
		cfg.Periodic = slices.Clone(e.opts.Periodic)
	}
	we := &WorkerEnv{Context: c, Pool: pool, Logger: log, Handlers: hs, Config: &cfg, Registry: m.reg, Metrics: m.Core}
	defer func() {
		for i := len(we.cleanups) - 1; i >= 0; i-- {
			we.cleanups[i]()
		}
	}()
	for _, setup := range e.opts.WorkerSetup {
		if err := setup(we); err != nil {
			return err
		}
	}
	if e.opts.Configure != nil {
		e.opts.Configure(&cfg)
	}
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		return usageError{Err: err}
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
	var srv *httpserver.Server
	if addr := c.String("metrics-addr"); addr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", m.handler())
		mux.Handle("GET /healthz", HealthzHandler(pool))
		if srv, err = httpserver.Start(addr, mux, log, "metrics"); err != nil {
			return err
		}
	}
	for _, fn := range we.starts {
		fn()
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

// HealthzHandler answers 200 when the database answers, 503 otherwise: the /healthz
// of the worker's --metrics-addr, for an application's own servers too.
func HealthzHandler(pool *pgxpool.Pool) http.Handler {
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
