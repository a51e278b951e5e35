package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/verify"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/migrations"
)

func demoCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "demo",
		Usage: "replay both incidents at a small scale, then verify that every outcome happened exactly once",
		Description: "Needs no setup. The database is --database-url / DATABASE_URL when given, else the local\n" +
			"server at 127.0.0.1:5432, else a throwaway PostgreSQL cluster started from this machine's\n" +
			"PostgreSQL binaries (initdb, pg_ctl) in a temporary directory and removed afterwards.\n" +
			"Everything happens in a fresh schema fenceq_demo_<random>, dropped at the end (--keep keeps it).\n\n" +
			"Billing: 8 workers invoice every customer, calling a simulated tax service whose slow\n" +
			"tail outlasts the (scaled-down) lease; one worker freezes past its lease mid-invoice.\n" +
			"Orders: clients retry the same idempotency keys every 300 ms against the real HTTP API\n" +
			"while first requests are still committing. Emails go through the outbox to a mail file.\n" +
			"Exit status 0 only when verify passes and the injected fault really fired.",
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "customers", Value: 48, Usage: "customers to invoice"},
			&ucli.IntFlag{Name: "workers", Value: 8, Usage: "worker processes (in-process, each with its own pool)"},
			&ucli.IntFlag{Name: "order-keys", Value: 24, Usage: "idempotency keys of the order retry storm"},
			&ucli.DurationFlag{Name: "lease", Value: 2 * time.Second, Usage: "the scaled-down lease"},
			&ucli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the simulated latencies"},
			&ucli.BoolFlag{Name: "keep", Usage: "keep the demo schema (and the mail and log files) for inspection"},
			&ucli.BoolFlag{Name: "verbose", Usage: "print the workers' logs (INFO and up) on stderr; by default only ERROR records"},
			&ucli.DurationFlag{Name: "timeout", Value: 3 * time.Minute, Usage: "give up after this long"},
			&ucli.StringFlag{Name: "pg-bin-dir", Usage: "where initdb and pg_ctl live, for the throwaway cluster (default: the newest /usr/lib/postgresql/*/bin, else PATH)"},
			&ucli.StringFlag{Name: "local-database-url", Value: DefaultDatabaseURL, Hidden: true,
				Usage: "the local server tried before a throwaway cluster (tests point it elsewhere)"},
		},
		Action: demoAction,
	}
}

// DemoConfig is the demo's shape.
type DemoConfig struct {
	Customers int           `json:"customers"`
	Workers   int           `json:"workers"`
	OrderKeys int           `json:"order_keys"`
	Lease     time.Duration `json:"lease"`
	Seed      uint64        `json:"seed"`
}

// progress prints timestamped lines on stderr.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (p *progress) say(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "demo [%5.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

func demoAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[flags]"); err != nil {
		return err
	}
	cfg := DemoConfig{Customers: c.Int("customers"), Workers: c.Int("workers"), OrderKeys: c.Int("order-keys"),
		Lease: c.Duration("lease"), Seed: c.Uint64("seed")}
	switch {
	case cfg.Customers < 1 || cfg.Customers > 10000:
		return usageError{fmt.Errorf("invalid --customers %d: want 1 to 10000", cfg.Customers)}
	case cfg.Workers < 2 || cfg.Workers > 32:
		return usageError{fmt.Errorf("invalid --workers %d: want 2 to 32 (one of them is paused)", cfg.Workers)}
	case cfg.OrderKeys < 1 || cfg.OrderKeys > 1000:
		return usageError{fmt.Errorf("invalid --order-keys %d: want 1 to 1000", cfg.OrderKeys)}
	case cfg.Lease < 500*time.Millisecond || cfg.Lease > time.Minute:
		return usageError{fmt.Errorf("invalid --lease %s: want 500ms to 1m", cfg.Lease)}
	}
	pr := &progress{w: stderr(c), start: time.Now()}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()

	base, where, stopDB, err := demoDatabase(ctx, c, pr)
	if err != nil {
		return err
	}
	if stopDB != nil {
		defer stopDB()
	}

	dir, err := os.MkdirTemp("", "fenceq-demo-")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	keep := c.Bool("keep")
	defer func() {
		if !keep {
			_ = os.RemoveAll(dir)
		}
	}()
	logFile, err := os.Create(filepath.Join(dir, "workers.log"))
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer logFile.Close()
	stderrLevel := slog.LevelError
	if c.Bool("verbose") {
		stderrLevel = slog.LevelInfo
	}
	log := slog.New(fanout{
		slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug}),
		slog.NewTextHandler(stderr(c), &slog.HandlerOptions{Level: stderrLevel}),
	})

	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "fenceq_demo_" + hex.EncodeToString(b[:])
	admin, err := openPoolURL(ctx, base, 2)
	if err != nil {
		return err
	}
	defer admin.Close()
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := admin.Exec(ctx, fmt.Sprintf(sqlDemoCreateSchema, ident)); err != nil {
		return fmt.Errorf("demo: create schema %s: %w (the demo needs the CREATE privilege on the database)", schema, err)
	}
	schemaURL := connstr.WithSearchPath(base, schema)
	defer func() {
		if keep && stopDB == nil {
			return
		}
		if keep {
			pr.say("--keep cannot keep a throwaway cluster's schema: the cluster is removed now")
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(dctx, fmt.Sprintf(sqlDemoDropSchema, ident)); err != nil {
			pr.say("could not drop schema %s: %v", schema, err)
		}
	}()
	pr.say("database: %s, schema %s", where, schema)

	pool, err := openPoolURL(ctx, schemaURL, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.UpAll(ctx, pool, builtin.Migrations()...); err != nil {
		return fmt.Errorf("demo: %w", err)
	}

	run := &demoRun{cfg: cfg, url: schemaURL, pool: pool, log: log, pr: pr, dir: dir}
	rep, runErr := run.run(ctx)
	if rep != nil {
		rep.Database, rep.Schema = where, schema
		if keep {
			rep.Kept = map[string]string{"database_url": RedactURL(schemaURL), "mail_file": run.mailPath(),
				"worker_log": logFile.Name()}
		}
		rep.Duration = time.Since(pr.start).Round(100 * time.Millisecond).String()
		if err := output(c, rep, func(w io.Writer) error { return printDemoReport(w, rep) }); err != nil {
			return err
		}
	}
	if runErr != nil {
		return runErr
	}
	switch {
	case !rep.Verify.Passed:
		return silentError{fmt.Sprintf("demo: verify found %d violation(s)", rep.Verify.Violations)}
	case rep.StaleWritesRejected == 0:
		return silentError{"demo: the injected fault did not fire (no stale write was rejected), so the run proves nothing"}
	case rep.Invoices != int64(cfg.Customers) || rep.Orders != int64(cfg.OrderKeys):
		return silentError{fmt.Sprintf("demo: %d of %d invoices and %d of %d orders were written",
			rep.Invoices, cfg.Customers, rep.Orders, cfg.OrderKeys)}
	}
	return nil
}

// demoDatabase picks the server: the URL given, else the local server, else a
// throwaway cluster. stop is nil unless a cluster was started; it removes the cluster.
func demoDatabase(ctx context.Context, c *ucli.Context, pr *progress) (raw, where string, stop func(), err error) {
	if c.IsSet(flagDatabaseURL) {
		raw = dbURL(c)
		pool, err := openPoolURL(ctx, raw, 1)
		if err != nil {
			return "", "", nil, err
		}
		pool.Close()
		return raw, RedactURL(raw), nil, nil
	}
	local := c.String("local-database-url")
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	pool, lerr := openPoolURL(pctx, local, 1)
	cancel()
	if lerr == nil {
		pool.Close()
		return local, "the local server " + RedactURL(local), nil, nil
	}
	pr.say("no PostgreSQL answers at 127.0.0.1:5432; starting a throwaway cluster from this machine's PostgreSQL binaries")
	cl, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: c.String("pg-bin-dir")})
	hint := "point the demo at a server with DATABASE_URL=postgres://USER:PASSWORD@HOST:5432/DB"
	if errors.Is(err, pgcluster.ErrNoBinaries) {
		return "", "", nil, fmt.Errorf("the demo needs PostgreSQL: none answers at 127.0.0.1:5432 and no server binaries "+
			"(initdb, pg_ctl) are installed to start a throwaway one; install PostgreSQL or %s", hint)
	}
	if err != nil {
		return "", "", nil, fmt.Errorf("the demo needs PostgreSQL: none answers at 127.0.0.1:5432 and a throwaway "+
			"cluster could not start (%v); %s", oneLine(err.Error()), hint)
	}
	stop = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.Stop(sctx); err != nil {
			pr.say("could not remove the throwaway cluster: %v", err)
			return
		}
		pr.say("throwaway cluster stopped and removed")
	}
	return cl.URL, fmt.Sprintf("a throwaway cluster (PostgreSQL from %s, port %d, in %s)", cl.BinDir, cl.Port, cl.Dir), stop, nil
}

// fanout sends each record to every handler that wants its level.
type fanout []slog.Handler

func (f fanout) Enabled(ctx context.Context, l slog.Level) bool {
	for _, h := range f {
		if h.Enabled(ctx, l) {
			return true
		}
	}
	return false
}

func (f fanout) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	for _, h := range f {
		if h.Enabled(ctx, r.Level) {
			errs = append(errs, h.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (f fanout) WithAttrs(as []slog.Attr) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithAttrs(as)
	}
	return out
}

func (f fanout) WithGroup(name string) slog.Handler {
	out := make(fanout, len(f))
	for i, h := range f {
		out[i] = h.WithGroup(name)
	}
	return out
}

// DemoReport is what the demo prints at the end.
type DemoReport struct {
	Database string     `json:"database"`
	Schema   string     `json:"schema"`
	Duration string     `json:"duration"`
	Config   DemoConfig `json:"config"`
	Period   string     `json:"period"`

	Invoices      int64 `json:"invoices"`
	InvoiceEmails int64 `json:"invoice_emails_delivered"`
	Orders        int64 `json:"orders"`
	OrderEmails   int64 `json:"order_emails_delivered"`
	// Storm counts the order requests by answer.
	Storm StormCounts `json:"order_requests"`
	// MailLines and DistinctMessageIDs read the mail file: a line per delivery attempt
	// that reached the mailer, and the distinct Message-IDs among them.
	MailLines          int `json:"mail_file_lines"`
	DistinctMessageIDs int `json:"distinct_message_ids"`
	// SlowTaxCalls took longer than the lease; heartbeats kept their leases.
	SlowTaxCalls int64 `json:"tax_calls_longer_than_lease"`
	TaxCalls     int64 `json:"tax_calls"`
	// Pause is what happened to the frozen worker.
	Pause *PauseReport `json:"pause"`

	LeasesRevoked       int64 `json:"leases_revoked"`
	StaleWritesRejected int64 `json:"stale_writes_rejected"`
	ExpiredHolderAlive  int64 `json:"leases_expired_while_holder_lived"`
	Duplicates          int64 `json:"duplicates"`
	LostJobs            int64 `json:"lost_jobs"`

	Verify *verify.Report    `json:"verify"`
	Kept   map[string]string `json:"kept,omitempty"`
}

func printDemoReport(w io.Writer, r *DemoReport) error {
	fmt.Fprintf(w, "\nfenceq demo: %d customers, %d workers, lease %s, %s\n\n", r.Config.Customers, r.Config.Workers,
		r.Config.Lease, r.Duration)
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	rows := [][]string{
		{"invoices", i(r.Invoices), fmt.Sprintf("one per customer for %s (%d customers)", r.Period, r.Config.Customers)},
		{"invoice emails delivered", i(r.InvoiceEmails), "through the outbox"},
		{"orders", i(r.Orders), fmt.Sprintf("%d idempotency keys, %d requests: %d created, %d replayed, %d told to retry (in flight)",
			r.Config.OrderKeys, r.Storm.Requests, r.Storm.Created, r.Storm.Replayed, r.Storm.InFlight)},
		{"order emails delivered", i(r.OrderEmails), "through the outbox"},
		{"mail file", strconv.Itoa(r.MailLines), fmt.Sprintf("lines, %d distinct Message-IDs", r.DistinctMessageIDs)},
		{"tax calls longer than the lease", i(r.SlowTaxCalls), fmt.Sprintf("of %d; heartbeats kept those leases", r.TaxCalls)},
		{"leases revoked", i(r.LeasesRevoked), "by the reaper, generation bumped"},
		{"stale writes rejected", i(r.StaleWritesRejected), "by the database: the fence held"},
		{"leases expired while the holder lived", i(r.ExpiredHolderAlive), "alerted (ERROR log, metric, health)"},
		{"duplicates", i(r.Duplicates), "invoices, orders, outbox rows"},
		{"lost jobs", i(r.LostJobs), "jobs or emails that nothing would finish"},
	}
	if err := table(w, []string{"WHAT", "COUNT", ""}, rows); err != nil {
		return err
	}
	if p := r.Pause; p != nil {
		fmt.Fprintf(w, "\nthe pause: %s froze for %s inside the tax call of customer %d; its lease (job %d, generation %d) "+
			"was revoked and the job finished on %s; its late commit was rejected\n",
			p.Worker, p.Frozen, p.CustomerID, p.JobID, p.Gen, orDash(p.TakenBy))
	}
	fmt.Fprintln(w)
	if err := printVerify(w, r.Verify); err != nil {
		return err
	}
	for k, v := range r.Kept {
		fmt.Fprintf(w, "kept %s: %s\n", k, v)
	}
	return nil
}
