package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/migrations"
)

// The idle workload measures what a fleet of workers costs the server when there is
// nothing to do: Processes workers (fenceq Workers or River clients), each with its
// own small pool, serve 1 queue and then Queues queues, with no job anywhere, and the
// server's transactions per second in a database nobody else uses are the cost.
//
// PostgreSQL counts transactions per database (pg_stat_database), but a backend
// flushes its counts only now and then (at most once a second while busy, after up to
// PGSTAT_IDLE_INTERVAL when idle), so the window must be long (Config.Duration) and
// the database must be the run's alone: runIdle creates its own and drops it at the
// end. The statistics are read from a connection to Config.DatabaseURL's database,
// so the readings themselves are not counted.

// idleDatabasePrefix begins the name of the idle workload's own database; the
// process id ends it.
const idleDatabasePrefix = "fenceq_bench_idle_"

// Schemas of the two systems in the idle workload's database.
const (
	idleSchemaFenceq = "fq_idle"
	idleSchemaRiver  = "river_idle"
)

// defaultIdleWarmup is how long the workers run before the measured window: long
// enough for every worker to have connected, listened and polled once.
const defaultIdleWarmup = 3 * time.Second

// Default sizes of the idle workload.
const (
	defaultIdleProcesses = 10
	defaultIdleQueues    = 100
	defaultIdleConns     = 2
	defaultIdleDuration  = 30 * time.Second
	maxIdleProcesses     = 1000
)

// idleSide is one of the idle workload's sides: a system serving some queues.
type idleSide struct {
	sys    string
	queues int
}

func (s idleSide) name() string { return compareQueuesName(s.sys, s.queues) }

func (s idleSide) describe(cfg Config) string {
	q := "queue default"
	if s.queues > 1 {
		q = fmt.Sprintf("%d queues", s.queues)
	}
	if s.sys == SystemRiver {
		return fmt.Sprintf("%d River %s clients (riverpgxv5), each serving %s with MaxWorkers=%d, River's default fetch "+
			"settings, a pool of %d conns; no jobs", cfg.Processes, RiverVersion, q, cfg.Workers, cfg.Conns)
	}
	return fmt.Sprintf("%d fenceq Workers, each serving %s with MaxWorkers=%d, the engine's default settings, "+
		"a pool of %d conns; no jobs", cfg.Processes, q, cfg.Workers, cfg.Conns)
}

// idleSides lists the sides in report order.
func idleSides(cfg Config) []idleSide {
	sides := []idleSide{{SystemFenceq, 1}, {SystemFenceq, cfg.Queues}}
	if cfg.Vs == SystemRiver {
		sides = append(sides, idleSide{SystemRiver, 1}, idleSide{SystemRiver, cfg.Queues})
	}
	return sides
}

// idleDatabase is the idle workload's own database.
type idleDatabase struct {
	name  string
	admin *pgx.Conn // on Config.DatabaseURL's database
	base  *pgxpool.Config
}

// createIdleDatabase creates the workload's database on the server of
// Config.DatabaseURL and the two systems' tables in it.
func createIdleDatabase(ctx context.Context, cfg Config) (*idleDatabase, error) {
	base, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench: database url: %w", err)
	}
	admin, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(cfg.DatabaseURL), err)
	}
	d := &idleDatabase{name: fmt.Sprintf("%s%d", idleDatabasePrefix, os.Getpid()), admin: admin, base: base}
	if d.name == base.ConnConfig.Database {
		_ = admin.Close(ctx)
		return nil, fmt.Errorf("bench: idle: --database-url names %s, the database the idle workload creates and drops: name another", d.name)
	}
	ident := pgx.Identifier{d.name}.Sanitize()
	// A database of the same name is left over from an earlier bench of this process
	// id that was killed: it is the bench's own.
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		_ = admin.Close(ctx)
		return nil, fmt.Errorf("bench: idle: drop the leftover database %s: %w", d.name, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		_ = admin.Close(ctx)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			return nil, fmt.Errorf("bench: idle: create database %s on %s: the role needs the CREATEDB privilege "+
				"(or superuser), since the idle workload measures a database of its own: %w", d.name, redact.URL(cfg.DatabaseURL), err)
		}
		return nil, fmt.Errorf("bench: idle: create database %s on %s: %w", d.name, redact.URL(cfg.DatabaseURL), err)
	}
	if err := d.setup(ctx, cfg); err != nil {
		d.drop(cfg)
		return nil, err
	}
	return d, nil
}

// poolConfig is a pool of conns connections to the workload's database with
// search_path set to schema.
func (d *idleDatabase) poolConfig(schema string, conns int, tracer pgx.QueryTracer) *pgxpool.Config {
	pc := d.base.Copy()
	pc.ConnConfig.Database = d.name
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pc.MaxConns = int32(conns)
	pc.MinConns = 0
	pc.ConnConfig.Tracer = tracer
	return pc
}

func (d *idleDatabase) setup(ctx context.Context, cfg Config) error {
	pool, err := pgxpool.NewWithConfig(ctx, d.poolConfig("public", 1, nil))
	if err != nil {
		return fmt.Errorf("bench: idle: connect to %s: %w", d.name, err)
	}
	defer pool.Close()
	for _, s := range []string{idleSchemaFenceq, idleSchemaRiver} {
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+s); err != nil {
			return fmt.Errorf("bench: idle: create schema %s: %w", s, err)
		}
	}
	fq, err := pgxpool.NewWithConfig(ctx, d.poolConfig(idleSchemaFenceq, 1, nil))
	if err != nil {
		return fmt.Errorf("bench: idle: connect to %s: %w", d.name, err)
	}
	defer fq.Close()
	if err := migrations.Up(ctx, fq); err != nil {
		return fmt.Errorf("bench: idle: migrate fenceq: %w", err)
	}
	if cfg.Vs != SystemRiver {
		return nil
	}
	rv, err := pgxpool.NewWithConfig(ctx, d.poolConfig(idleSchemaRiver, 1, nil))
	if err != nil {
		return fmt.Errorf("bench: idle: connect to %s: %w", d.name, err)
	}
	defer rv.Close()
	m, err := rivermigrate.New(riverpgxv5.New(rv), &rivermigrate.Config{Logger: cfg.Logger})
	if err != nil {
		return fmt.Errorf("bench: idle: river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("bench: idle: river migrate up: %w", err)
	}
	return nil
}

// drop drops the workload's database (its connections are ended first) and closes
// the admin connection.
func (d *idleDatabase) drop(cfg Config) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.name}.Sanitize()+" WITH (FORCE)"); err != nil {
		cfg.Logger.Warn("bench: idle: drop database", "database", d.name, "err", err)
	}
	_ = d.admin.Close(ctx)
}

// transactions reads the database's committed and rolled back transactions, from a
// fresh statistics snapshot.
func (d *idleDatabase) transactions(ctx context.Context) (int64, error) {
	if _, err := d.admin.Exec(ctx, sqlClearSnapshot); err != nil {
		return 0, fmt.Errorf("clear statistics snapshot: %w", err)
	}
	var n int64
	if err := d.admin.QueryRow(ctx, sqlDatabaseXacts, d.name).Scan(&n); err != nil {
		return 0, fmt.Errorf("read pg_stat_database of %s: %w", d.name, err)
	}
	return n, nil
}

// stmtCounter counts the statements sent on the pools it traces, and among them the
// claims (fenceq's and River's claim statements).
type stmtCounter struct {
	stmts  atomic.Int64
	claims atomic.Int64
}

func (c *stmtCounter) count(sql string) {
	c.stmts.Add(1)
	if isClaim(sql) {
		c.claims.Add(1)
	}
}

// isClaim tells a claim statement: it locks rows with SKIP LOCKED and counts an
// attempt (fenceq: attempt = attempt + 1; River: attempt = river_job.attempt + 1).
func isClaim(sql string) bool {
	s := strings.Join(strings.Fields(sql), " ")
	return strings.Contains(s, "SKIP LOCKED") &&
		(strings.Contains(s, "attempt = attempt + 1") || strings.Contains(s, "attempt = river_job.attempt + 1"))
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.count(d.SQL)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (c *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c *stmtCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.count(d.SQL)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// runIdle runs the idle workload: Runs rounds, each measuring every side once, the
// order rotating from round to round.
func runIdle(ctx context.Context, cfg Config) (*Report, error) {
	sides := idleSides(cfg)
	rep, err := newBaseReport(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for _, s := range sides {
		rep.Systems = append(rep.Systems, &SystemReport{Name: s.name(), Config: s.describe(cfg)})
	}
	rep.ratioPairs = [][2]string{{compareQueuesName(SystemFenceq, cfg.Queues), compareQueuesName(SystemFenceq, 1)}}
	if cfg.Vs == SystemRiver {
		rep.ratioPairs = append(rep.ratioPairs,
			[2]string{compareQueuesName(SystemRiver, cfg.Queues), compareQueuesName(SystemRiver, 1)},
			[2]string{compareQueuesName(SystemFenceq, 1), compareQueuesName(SystemRiver, 1)},
			[2]string{compareQueuesName(SystemFenceq, cfg.Queues), compareQueuesName(SystemRiver, cfg.Queues)})
	}
	if err := checkFreeConnections(ctx, cfg, cfg.Processes*cfg.Conns+2,
		fmt.Sprintf("--processes %d × --conns %d", cfg.Processes, cfg.Conns)); err != nil {
		return nil, err
	}
	db, err := createIdleDatabase(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer db.drop(cfg)
	ran := 0
	for i := range cfg.Runs {
		order := rotate(sides, i)
		for _, s := range order {
			progressf(cfg.Progress, "run %d/%d: %s idle…\n", i+1, cfg.Runs, s.name())
			m, err := measureIdle(ctx, cfg, db, s)
			if err != nil {
				return rep, fmt.Errorf("run %d of %s: %w", i+1, s.name(), err)
			}
			ran++
			r := &RunResult{System: s.name(), Run: i + 1, Order: ran, Metrics: m, Schema: db.name}
			rep.add(r)
			progressf(cfg.Progress, "run %d/%d: %s idle: %s\n", i+1, cfg.Runs, s.name(), r.headline(cfg.Workload))
		}
	}
	rep.finish(ctx, cfg)
	return rep, nil
}

// rotate returns xs rotated left by i places.
func rotate[T any](xs []T, i int) []T {
	if len(xs) == 0 {
		return nil
	}
	i %= len(xs)
	return append(slices.Clone(xs[i:]), xs[:i]...)
}

// measureIdle starts the side's Processes workers, lets them warm up, and measures
// the database's transactions over Duration.
func measureIdle(ctx context.Context, cfg Config, db *idleDatabase, s idleSide) (map[string]float64, error) {
	counter := &stmtCounter{}
	var stops []func(context.Context) error
	var pools []*pgxpool.Pool
	stopAll := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var errs []error
		for _, stop := range stops {
			if err := stop(sctx); err != nil {
				errs = append(errs, err)
			}
		}
		for _, p := range pools {
			p.Close()
		}
		return errors.Join(errs...)
	}
	names := benchQueueNames(s.queues)
	schema := idleSchemaFenceq
	if s.sys == SystemRiver {
		schema = idleSchemaRiver
	}
	for p := range cfg.Processes {
		pool, err := pgxpool.NewWithConfig(ctx, db.poolConfig(schema, cfg.Conns, counter))
		if err != nil {
			_ = stopAll()
			return nil, fmt.Errorf("process %d: open pool: %w", p, err)
		}
		pools = append(pools, pool)
		stop, err := startIdleProcess(ctx, cfg, s.sys, pool, names)
		if err != nil {
			_ = stopAll()
			return nil, fmt.Errorf("process %d: %w", p, err)
		}
		stops = append(stops, stop)
	}
	if err := sleepCtx(ctx, cfg.idleWarmup); err != nil {
		_ = stopAll()
		return nil, err
	}
	x0, err := db.transactions(ctx)
	if err != nil {
		_ = stopAll()
		return nil, err
	}
	st0, cl0, t0 := counter.stmts.Load(), counter.claims.Load(), time.Now()
	if err := sleepCtx(ctx, cfg.Duration); err != nil {
		_ = stopAll()
		return nil, err
	}
	x1, err := db.transactions(ctx)
	st1, cl1, elapsed := counter.stmts.Load(), counter.claims.Load(), time.Since(t0)
	if serr := stopAll(); serr != nil && err == nil {
		err = fmt.Errorf("stop %s: %w", s.name(), serr)
	}
	if err != nil {
		return nil, err
	}
	sec := elapsed.Seconds()
	return map[string]float64{
		MetricXactPerSec:   float64(x1-x0) / sec,
		MetricStmtsPerSec:  float64(st1-st0) / sec,
		MetricClaimsPerSec: float64(cl1-cl0) / sec,
		MetricSeconds:      sec,
	}, nil
}

// startIdleProcess starts one worker of the side on pool, serving the named queues.
func startIdleProcess(ctx context.Context, cfg Config, sys string, pool *pgxpool.Pool, queues []string) (func(context.Context) error, error) {
	if sys == SystemRiver {
		workers := river.NewWorkers()
		river.AddWorker(workers, &riverNoopWorker{h: hooks{started: func(int64) {}, done: func(int) {}}})
		qs := make(map[string]river.QueueConfig, len(queues))
		for _, q := range queues {
			qs[q] = river.QueueConfig{MaxWorkers: cfg.Workers}
		}
		c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: cfg.Logger, Queues: qs, Workers: workers})
		if err != nil {
			return nil, fmt.Errorf("river client: %w", err)
		}
		if err := c.Start(ctx); err != nil {
			return nil, fmt.Errorf("start river client: %w", err)
		}
		return c.Stop, nil
	}
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[noopArgs]) error { return nil }, nil)
	qs := make(map[string]fenceq.QueueConfig, len(queues))
	for _, q := range queues {
		qs[q] = fenceq.QueueConfig{MaxWorkers: cfg.Workers}
	}
	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Queues: qs, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("fenceq worker: %w", err)
	}
	if err := w.Start(ctx); err != nil {
		return nil, fmt.Errorf("start fenceq worker: %w", err)
	}
	return w.Stop, nil
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
