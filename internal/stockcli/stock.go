// Package stockcli is the stock fenceq binary's command tree: package cli's commands
// over the built-in jobs (invoice, order, email, housekeeping, diag), with the commands
// that need them or River or the demo: demo, bench, chaos, serve and billing. It stays
// apart from package cli so that an application building its own command with cli.New
// links none of them.
package stockcli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// Options returns the stock binary's options for cli.New, writing to stdout and stderr.
func Options(stdout, stderr io.Writer) cli.Options {
	var kinds []cli.Kind
	for _, k := range builtin.Kinds() {
		kinds = append(kinds, cli.Kind{Name: k.Name, Queue: k.Queue, Description: k.Description, ValidateArgs: k.ValidateArgs})
	}
	return cli.Options{
		Name:  "fenceq",
		Usage: "a PostgreSQL job queue whose jobs' outcomes happen exactly once",
		Description: "Every command that talks to the database takes --database-url (env DATABASE_URL,\n" +
			"default " + DefaultDatabaseURL + ", the local server).\n" +
			"Listing and report commands take --json for machine-readable output.\n" +
			"Start with `fenceq demo`: it needs no setup.",
		Kinds:              kinds,
		OptionalMigrations: []migrations.Set{invoice.Migrations(), order.Migrations()},
		Queues:             builtin.Queues(),
		RecurringKinds:     builtin.RecurringKinds(),
		WorkerFlags:        slices.Concat(orderFlags(), builtinFlags()),
		WorkerSetup:        []func(*cli.WorkerEnv) error{setupBuiltin},
		Extra: []*ucli.Command{
			withReportFlags(billingCommand()),
			serveCommand(),
			demoCommand(),
			withReportFlags(benchCommand()),
			chaosCommand(),
		},
		Stdout: stdout,
		Stderr: stderr,
	}
}

// New returns the stock fenceq command tree.
func New(stdout, stderr io.Writer) *ucli.App { return cli.New(Options(stdout, stderr)) }

// Run runs the stock fenceq command with args (args[0] is the program name) and returns
// the exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, New(stdout, stderr), args)
}

// setupBuiltin registers the built-in kinds on the worker, with their dependencies
// built from the worker's flags, their metrics, and the housekeeping schedule when the
// worker serves the default queue.
func setupBuiltin(env *cli.WorkerEnv) error {
	c, log := env.Context, env.Logger
	for _, s := range []migrations.Set{invoice.Migrations(), order.Migrations()} {
		// A plain catalog read, not the set's Status: that takes golang-migrate's session
		// advisory lock, which a PgBouncer in transaction pooling mode can leave held on
		// a server connection, stalling every later start.
		var installed bool
		if err := env.Pool.QueryRow(c.Context, `SELECT to_regclass($1) IS NOT NULL`, s.Table).Scan(&installed); err != nil {
			return fmt.Errorf("check the %s set's version table: %w", s.Name, err)
		}
		if !installed {
			env.OnStart(func() {
				log.Warn("a built-in job's tables are not installed: its jobs fail until they are",
					"set", s.Name, "install", "fenceq migrate up --set "+s.Name)
			})
		}
	}
	if _, ok := env.Config.Queues[queue.DefaultQueue]; ok && !c.Bool("no-periodic") {
		d := c.Duration("housekeeping-interval")
		hk, err := housekeeping.Periodic(d)
		if err != nil {
			return usageError{Err: fmt.Errorf("invalid --housekeeping-interval %s: want a whole number of seconds, at least 1s", d)}
		}
		env.Config.Periodic = append(env.Config.Periodic, hk)
	}
	tax, err := newTax(c)
	if err != nil {
		return err
	}
	mailer, mailDesc, closeMailer, err := newMailer(c)
	if err != nil {
		return err
	}
	env.OnStop(func() {
		if err := closeMailer(); err != nil {
			log.Warn("close the mailer", "err", err)
		}
	})
	invoices, err := invoice.NewPrometheusMetrics(env.Registry)
	if err != nil {
		return err
	}
	orderMetrics, err := order.NewPrometheusMetrics(env.Registry, env.Metrics.Idempotency())
	if err != nil {
		return err
	}
	orders, err := newOrderService(c, env.Pool, log, orderMetrics)
	if err != nil {
		return err
	}
	if err := builtin.Register(env.Handlers, builtin.Deps{Pool: env.Pool, Mailer: mailer, Tax: tax, Orders: orders,
		Logger: log, InvoiceMetrics: invoices, OutboxMetrics: env.Metrics.Outbox()}); err != nil {
		return err
	}
	env.OnStart(func() { log.Info(mailDesc) })
	return nil
}

// serveMetrics are the orders API's metrics in one registry: the built-in kinds' and
// the mechanism's, the Go runtime's, the process's and the database collector's.
type serveMetrics struct {
	*builtin.Metrics
	reg *prometheus.Registry
}

// newMetrics registers the metrics in a fresh registry; db is read at every scrape.
func newMetrics(db queue.DBTX, log *slog.Logger) (*serveMetrics, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register Go metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process metrics: %w", err)
	}
	m, err := builtin.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(fenceqprom.NewDBCollector(db, 5*time.Second, log)); err != nil {
		return nil, fmt.Errorf("register database metrics: %w", err)
	}
	return &serveMetrics{Metrics: m, reg: reg}, nil
}

// handler serves the metrics in the Prometheus exposition format.
func (m *serveMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// openOrders connects and checks that the core and the order set are current: what the
// orders API needs.
func openOrders(c *ucli.Context, maxConns int32) (*pgxpool.Pool, error) {
	return openSchema(c, maxConns, migrations.Core(), order.Migrations())
}
