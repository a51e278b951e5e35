// Package demo replays both incidents fenceq was built for, at a small scale, and
// reports what happened: the `fenceq demo` command.
//
// Billing: Workers in-process workers, each with its own connection pool, invoice
// Customers customers with a short lease while a simulated tax service has a slow tail
// longer than the lease (heartbeats keep those leases). One worker freezes inside a tax
// call past its lease; the reaper revokes it, another worker writes the invoice, and the
// frozen worker's late commit is rejected by the database. Orders: clients retry the
// same idempotency keys every 300 ms against the real HTTP API while the first requests
// are still committing. Emails go through the outbox to a mail file. Then the verify
// invariants run.
//
// Run picks the database (the one given, else the local server, else a throwaway
// cluster), works in a fresh schema and removes what it created.
package demo

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
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/connect"
	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/migrations"
)

// Scale is the size of a run: what the report shows as its config.
type Scale struct {
	// Customers to invoice: 1 to 10000.
	Customers int `json:"customers"`
	// Workers are in-process workers, each with its own pool: 2 to 32 (one of them is
	// frozen).
	Workers int `json:"workers"`
	// OrderKeys are the idempotency keys of the order retry storm: 1 to 1000.
	OrderKeys int `json:"order_keys"`
	// Lease is the workers' scaled-down lease: 500ms to 1m. Heartbeats and the reaper
	// run every quarter lease.
	Lease time.Duration `json:"lease"`
	// Seed seeds the simulated latencies.
	Seed uint64 `json:"seed"`
}

// DefaultScale is the scale of `fenceq demo` without flags: a few seconds on a small
// machine.
func DefaultScale() Scale {
	return Scale{Customers: 48, Workers: 8, OrderKeys: 24, Lease: 2 * time.Second, Seed: 1}
}

// Config is one demo run.
type Config struct {
	Scale
	// DatabaseURL is the server to run on. Empty: LocalDatabaseURL when it answers,
	// else a throwaway cluster started from the machine's PostgreSQL binaries.
	DatabaseURL string
	// LocalDatabaseURL is the local server tried when DatabaseURL is empty. Defaults to
	// connect.DefaultURL.
	LocalDatabaseURL string
	// PGBinDir holds initdb and pg_ctl for the throwaway cluster. Defaults to
	// pgcluster.FindBinDir().
	PGBinDir string
	// Schema, when set, is an existing schema to run in, empty or migrated by an earlier
	// run's sets; the demo neither creates nor drops it. By default the demo creates a
	// schema fenceq_demo_<random> of its own.
	Schema string
	// Keep keeps the demo's schema, mail file and worker log for inspection (a
	// throwaway cluster is removed all the same).
	Keep bool
	// Verbose shows the workers' log records from INFO up on Stderr; otherwise only
	// ERROR records.
	Verbose bool
	// Timeout bounds the run. Required.
	Timeout time.Duration
	// Stderr receives progress lines and the workers' log records. Defaults to
	// io.Discard.
	Stderr io.Writer
}

// Validate reports the first setting out of range, named as the demo command's flag.
func (c Config) Validate() error {
	switch {
	case c.Customers < 1 || c.Customers > 10000:
		return fmt.Errorf("invalid --customers %d: want 1 to 10000", c.Customers)
	case c.Workers < 2 || c.Workers > 32:
		return fmt.Errorf("invalid --workers %d: want 2 to 32 (one of them is paused)", c.Workers)
	case c.OrderKeys < 1 || c.OrderKeys > 1000:
		return fmt.Errorf("invalid --order-keys %d: want 1 to 1000", c.OrderKeys)
	case c.Lease < 500*time.Millisecond || c.Lease > time.Minute:
		return fmt.Errorf("invalid --lease %s: want 500ms to 1m", c.Lease)
	case c.Timeout <= 0:
		return fmt.Errorf("invalid --timeout %s: must be positive", c.Timeout)
	}
	return nil
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

// Run runs the demo and returns its report, once everything it created is removed
// (unless cfg.Keep). An error means the run could not finish; a report means it did,
// and Report.Failure says whether it proved its point.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.LocalDatabaseURL == "" {
		cfg.LocalDatabaseURL = connect.DefaultURL
	}
	if cfg.Stderr == nil {
		cfg.Stderr = io.Discard
	}
	pr := &progress{w: cfg.Stderr, start: time.Now()}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	base, where, stopDB, err := chooseDatabase(ctx, cfg, pr)
	if err != nil {
		return nil, err
	}
	if stopDB != nil {
		defer stopDB()
	}

	dir, err := os.MkdirTemp("", "fenceq-demo-")
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	defer func() {
		if !cfg.Keep {
			_ = os.RemoveAll(dir)
		}
	}()
	logFile, err := os.Create(filepath.Join(dir, "workers.log"))
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	defer logFile.Close()
	stderrLevel := slog.LevelError
	if cfg.Verbose {
		stderrLevel = slog.LevelInfo
	}
	log := slog.New(fanout{
		slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug}),
		slog.NewTextHandler(cfg.Stderr, &slog.HandlerOptions{Level: stderrLevel}),
	})

	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "fenceq_demo_" + hex.EncodeToString(b[:])
	if cfg.Schema != "" {
		schema = cfg.Schema
	}
	admin, err := connect.Open(ctx, base, 2)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	ident := pgx.Identifier{schema}.Sanitize()
	if cfg.Schema == "" {
		if _, err := admin.Exec(ctx, fmt.Sprintf(sqlCreateSchema, ident)); err != nil {
			return nil, fmt.Errorf("demo: create schema %s: %w (the demo needs the CREATE privilege on the database)", schema, err)
		}
	}
	schemaURL := connstr.WithSearchPath(base, schema)
	defer func() {
		if cfg.Schema != "" {
			return // the caller's schema
		}
		if cfg.Keep && stopDB == nil {
			return
		}
		if cfg.Keep {
			pr.say("--keep cannot keep a throwaway cluster's schema: the cluster is removed now")
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(dctx, fmt.Sprintf(sqlDropSchema, ident)); err != nil {
			pr.say("could not drop schema %s: %v", schema, err)
		}
	}()
	pr.say("database: %s, schema %s", where, schema)

	pool, err := connect.Open(ctx, schemaURL, 4)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := migrations.UpAll(ctx, pool, builtin.Migrations()...); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}

	r := &demoRun{cfg: cfg.Scale, url: schemaURL, pool: pool, log: log, pr: pr, dir: dir}
	rep, err := r.run(ctx)
	if err != nil {
		return nil, err
	}
	rep.Database, rep.Schema = where, schema
	if cfg.Keep {
		rep.Kept = map[string]string{"database_url": redact.URL(schemaURL), "mail_file": r.mailPath(),
			"worker_log": logFile.Name()}
	}
	rep.Duration = time.Since(pr.start).Round(100 * time.Millisecond).String()
	return rep, nil
}

// chooseDatabase picks the server: the URL given, else the local server, else a
// throwaway cluster. stop is nil unless a cluster was started; it removes the cluster.
func chooseDatabase(ctx context.Context, cfg Config, pr *progress) (raw, where string, stop func(), err error) {
	if cfg.DatabaseURL != "" {
		pool, err := connect.Open(ctx, cfg.DatabaseURL, 1)
		if err != nil {
			return "", "", nil, err
		}
		pool.Close()
		return cfg.DatabaseURL, redact.URL(cfg.DatabaseURL), nil, nil
	}
	local := cfg.LocalDatabaseURL
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	pool, lerr := connect.Open(pctx, local, 1)
	cancel()
	if lerr == nil {
		pool.Close()
		return local, "the local server " + redact.URL(local), nil, nil
	}
	pr.say("no PostgreSQL answers at 127.0.0.1:5432; starting a throwaway cluster from this machine's PostgreSQL binaries")
	cl, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: cfg.PGBinDir})
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

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n\t", " ")
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.TrimSpace(s)
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
