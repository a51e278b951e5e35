// Package bench measures fenceq's throughput and latency, side by side with River
// (v0.51.2, through its public Go API) and with a bare-SQL ceiling, on the same
// PostgreSQL server, in paired and alternating runs.
//
// Every run of every side happens in a fresh schema of the target database, created at
// the start of the run and dropped at its end, so the sides never see each other's rows
// and each starts from an empty, analyzed table. Each run records, besides its headline
// figures, the WAL bytes and commits per job and the dead tuples and HOT updates of the
// job table (pg_stat_*).
//
// Workloads:
//
//   - insert: COPY batches and single-row inserts, jobs/s each.
//   - drain: work down N pre-inserted no-op jobs; jobs/s from start to last completion.
//   - steady: inserts (COPY batches keeping a backlog) and work together for a duration.
//   - latency: single-row enqueues at a fixed arrival rate; enqueue→start p50/p95/p99.
//   - fenced: each job commits a result row, an outbox row and its completion in one
//     transaction (fenceq: Job.Commit, or Job.CommitWrites with Config.CommitWrites,
//     fenced by the lease generation; River: JobCompleteTx); its bare-SQL ceiling sends
//     each job's transaction in one pipelined round trip.
//   - ui: the dashboard's pages' server time at several sizes of retained history
//     (RunUI; ui.go).
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/redact"
)

// Workload names.
const (
	WorkloadInsert  = "insert"
	WorkloadDrain   = "drain"
	WorkloadSteady  = "steady"
	WorkloadLatency = "latency"
	WorkloadFenced  = "fenced"
	WorkloadIdle    = "idle"
	WorkloadLayout  = "layout"
	WorkloadUI      = "ui"
)

// Workloads lists every workload in the order the CLI documents them.
var Workloads = []string{WorkloadInsert, WorkloadDrain, WorkloadSteady, WorkloadLatency, WorkloadFenced, WorkloadIdle, WorkloadLayout, WorkloadUI}

// System names as they appear in reports.
const (
	SystemFenceq  = "fenceq"
	SystemRiver   = "river"
	SystemCeiling = "bare-sql"
)

// DefaultDatabaseURL is the server measured when Config.DatabaseURL is empty.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Config describes one benchmark: a workload, its size, and which sides to measure.
type Config struct {
	// Workload is one of Workloads. Required.
	Workload string
	// DatabaseURL is the server to measure. Each run creates and drops its own schema
	// there. Defaults to DefaultDatabaseURL.
	DatabaseURL string
	// Jobs is the number of jobs of insert, drain and fenced. Defaults to 200,000 for
	// drain and insert and 20,000 for fenced.
	Jobs int
	// Duration of steady and latency. Defaults to 10s.
	Duration time.Duration
	// Rate is the arrival rate (jobs/s) of latency. Defaults to 1,000.
	Rate int
	// Workers is the number of jobs each side runs at once per queue (fenceq
	// MaxWorkers, River MaxWorkers), or in all, split evenly over the queues, with
	// SplitWorkers. Defaults to 1,000 (1 for idle).
	Workers int
	// SplitWorkers makes Workers the total slots of drain, fenced, steady and latency,
	// split evenly over the queues: Workers must then be a multiple of Queues.
	SplitWorkers bool
	// CompareQueues, for drain, alternates runs of each side on one queue with runs on
	// this many queues, the Workers slots split evenly over them, and reports the
	// ratio of the two. 0 measures Queues queues only.
	CompareQueues int
	// CompareFlow, for drain, alternates runs of fenceq with no flow limit with runs in
	// which every job is under a flow limit of one running job per partition, over
	// this many partitions, and reports the ratio of the two. 0: off.
	CompareFlow int
	// FlowPartitions puts every job of a fenceq run under a flow limit of one running
	// job per partition, over this many partitions (set by CompareFlow for its side).
	FlowPartitions int
	// Conns is the size of each side's connection pool (of each process's, in idle).
	// Defaults to 8 (2 for idle).
	Conns int
	// Processes is the number of workers of each side in idle, each with its own pool
	// of Conns connections. Defaults to 10.
	Processes int
	// Runs is the number of paired runs. Defaults to 5.
	Runs int
	// Vs names the peer to run alongside fenceq: "" or "river".
	Vs string
	// Ceiling adds the bare-SQL ceiling to drain runs (claim + batched fenced
	// completion, 1,000 per batch) and fenced runs (claim, then each job's fenced
	// transaction in one pipelined round trip). The CLI turns it on for both.
	Ceiling bool
	// CeilingClaimers is the number of concurrent claimers of the ceiling. Defaults to 2.
	CeilingClaimers int
	// Retained pre-fills this many finished jobs before each run, as a system that keeps
	// finished jobs for a while would have.
	Retained int
	// IdleXact holds a REPEATABLE READ transaction open, idle, for this long from the
	// start of each measured phase, pinning the vacuum horizon.
	IdleXact time.Duration
	// Checkpoint runs CHECKPOINT before each measured phase, so that no run has a
	// checkpoint (and its storm of full-page writes) land in its middle by chance while
	// another has none; every run then starts right after one. It needs superuser or
	// pg_checkpoint; without them the run goes on and the report says so.
	Checkpoint bool
	// ClaimBatch overrides fenceq's Config.ClaimBatchSize; 0 keeps the engine default.
	ClaimBatch int
	// Queues spreads the jobs over this many queues, round robin by sequence number;
	// each side serves all of them with Workers slots per queue. Defaults to 1 (the
	// queue "default"). The bare-SQL ceiling claims from one queue and runs only then
	// (and only when jobs do not sleep: its claimers run no handlers).
	Queues int
	// ArgsBytes pads every job's args with a string of this many bytes, random
	// characters that do not compress, so args past the TOAST threshold (about 2 KB) are
	// stored out of line. 0 pads nothing.
	ArgsBytes int
	// CommitWrites has fenceq's fenced handler commit through Job.CommitWrites (its two
	// inserts and the completion in one pipeline) instead of Job.Commit. River's side is
	// unchanged: River has no such call.
	CommitWrites bool
	// NoSearchIndexes drops, on fenceq's side, the indexes of fenceq_jobs_history that
	// serve only the dashboard's and the CLI's searches (searchIndexes) once the schema is
	// migrated, to measure what they cost each finished job. The primary key and the
	// finished_at index, which retention and the counters use, stay.
	NoSearchIndexes bool
	// JobSleep makes every handler of drain and fenced sleep this long before it
	// returns, so that Workers jobs run at once: the memory figures per 1,000 running
	// jobs come from such runs.
	JobSleep time.Duration
	// Layouts names the storage layouts the layout workload compares, some of Layouts.
	// Defaults to all of them.
	Layouts []string
	// UIRows are the sizes of retained history the ui workload measures, finished jobs.
	// Defaults to 10,000 and 1,000,000.
	UIRows []int
	// UIRequests is how many requests per page and size the ui workload times.
	// Defaults to 20.
	UIRequests int
	// Progress receives a line per second during long phases; nil prints nothing.
	Progress io.Writer
	// TraceSQL prints to Progress, after each run, the statements of the measured phase
	// by total time.
	TraceSQL bool
	// Logger receives the systems' own logs; defaults to warnings and errors on
	// stderr-less discard.
	Logger *slog.Logger

	// Set by withDefaults: the queues' names and the args' padding.
	queueNames []string
	padding    string
	// idleWarmup is how long idle's workers run before the measured window.
	idleWarmup time.Duration
}

// queueOf is the queue of the job with this sequence number.
func (c Config) queueOf(seq int64) string {
	if seq < 0 {
		seq = -seq
	}
	return c.queueNames[seq%int64(len(c.queueNames))]
}

// slotsPerQueue is the MaxWorkers each side gives each queue.
func (c Config) slotsPerQueue() int {
	if c.SplitWorkers && c.Queues > 0 {
		return c.Workers / c.Queues
	}
	return c.Workers
}

// totalSlots is the jobs each side runs at once over all its queues.
func (c Config) totalSlots() int { return c.slotsPerQueue() * max(c.Queues, 1) }

// benchQueueNames names n queues: the one queue is "default", as in a system that
// never names one.
func benchQueueNames(n int) []string {
	if n <= 1 {
		return []string{"default"}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("bench_%04d", i)
	}
	return names
}

// padAlphabet holds the characters of the args' padding: 64 of them, none escaped in
// JSON.
const padAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// argsPadding returns n characters drawn at random from padAlphabet (seeded, so every
// run pads alike). PostgreSQL's TOAST compression (pglz) finds no repeats in them, so
// the args are stored at their full size, as args that carry real data would be.
func argsPadding(n int) string {
	if n <= 0 {
		return ""
	}
	r := mrand.New(mrand.NewChaCha8([32]byte{'f', 'e', 'n', 'c', 'e', 'q'}))
	b := make([]byte, n)
	for i := range b {
		b[i] = padAlphabet[r.IntN(len(padAlphabet))]
	}
	return string(b)
}

func (c Config) withDefaults() Config {
	switch c.Workload {
	case WorkloadIdle:
		c.Workers = cmp.Or(c.Workers, 1)
		c.Duration = cmp.Or(c.Duration, defaultIdleDuration)
		c.Runs = cmp.Or(c.Runs, 3)
		c.Conns = cmp.Or(c.Conns, defaultIdleConns)
		c.Queues = cmp.Or(c.Queues, defaultIdleQueues)
		c.Processes = cmp.Or(c.Processes, defaultIdleProcesses)
		c.idleWarmup = cmp.Or(c.idleWarmup, defaultIdleWarmup)
	case WorkloadLayout:
		c.Runs = cmp.Or(c.Runs, 3)
		if len(c.Layouts) == 0 {
			c.Layouts = slices.Clone(Layouts)
		}
	case WorkloadUI:
		if len(c.UIRows) == 0 {
			c.UIRows = []int{10_000, 1_000_000}
		}
		c.UIRequests = cmp.Or(c.UIRequests, defaultUIRequests)
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = DefaultDatabaseURL
	}
	if c.Jobs == 0 {
		c.Jobs = 200_000
		if c.Workload == WorkloadFenced {
			c.Jobs = 20_000
		}
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Rate == 0 {
		c.Rate = 1000
	}
	if c.Workers == 0 {
		c.Workers = 1000
	}
	if c.Conns == 0 {
		c.Conns = 8
	}
	if c.Runs == 0 {
		c.Runs = 5
	}
	if c.CeilingClaimers == 0 {
		c.CeilingClaimers = 2
	}
	if c.Processes == 0 {
		c.Processes = 1
	}
	if c.Queues == 0 {
		c.Queues = 1
	}
	c = c.withQueues()
	if c.ArgsBytes > 0 && c.ArgsBytes <= maxArgsBytes {
		c.padding = argsPadding(c.ArgsBytes)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// withQueues names the queues of Config.Queues.
func (c Config) withQueues() Config {
	c.queueNames = nil
	if c.Queues > 0 && c.Queues <= maxQueues {
		c.queueNames = benchQueueNames(c.Queues)
	}
	return c
}

func (c Config) validate() error {
	if !slices.Contains(Workloads, c.Workload) {
		return fmt.Errorf("bench: workload %q: must be one of %s", c.Workload, strings.Join(Workloads, ", "))
	}
	if c.Vs != "" && c.Vs != SystemRiver {
		return fmt.Errorf("bench: --vs %q: the only peer is %q", c.Vs, SystemRiver)
	}
	for name, n := range map[string]int{"jobs": c.Jobs, "rate": c.Rate, "workers": c.Workers,
		"conns": c.Conns, "runs": c.Runs, "ceiling claimers": c.CeilingClaimers, "queues": c.Queues} {
		if n < 1 {
			return fmt.Errorf("bench: %s: %d must be at least 1", name, n)
		}
	}
	if c.Duration <= 0 {
		return fmt.Errorf("bench: duration: %s must be positive", c.Duration)
	}
	if err := c.validateSlots(); err != nil {
		return err
	}
	if c.Workload == WorkloadLayout {
		if err := c.validateLayouts(); err != nil {
			return err
		}
	}
	if c.Workload == WorkloadUI {
		for _, n := range c.UIRows {
			if n < 100 || n > 100_000_000 {
				return fmt.Errorf("bench: ui: --rows %d: must be 100–100,000,000", n)
			}
		}
		if c.UIRequests < 1 {
			return fmt.Errorf("bench: ui: --requests %d: must be at least 1", c.UIRequests)
		}
	}
	if c.Workload == WorkloadIdle {
		if c.Queues < 2 {
			return fmt.Errorf("bench: idle: --queues %d: idle compares 1 queue with --queues queues, which must be at least 2", c.Queues)
		}
		if c.Processes < 1 || c.Processes > maxIdleProcesses {
			return fmt.Errorf("bench: idle: --processes %d must be between 1 and %d", c.Processes, maxIdleProcesses)
		}
	}
	if c.NoSearchIndexes && slices.Contains([]string{WorkloadIdle, WorkloadLayout, WorkloadUI}, c.Workload) {
		return fmt.Errorf("bench: --no-search-indexes: the %s workload does not run fenceq's worker on its schema", c.Workload)
	}
	if c.Retained < 0 {
		return fmt.Errorf("bench: retained: %d must not be negative", c.Retained)
	}
	if c.IdleXact < 0 {
		return fmt.Errorf("bench: idle-xact: %s must not be negative", c.IdleXact)
	}
	if c.Conns > maxConns {
		return fmt.Errorf("bench: conns: %d is more than %d", c.Conns, maxConns)
	}
	if c.Queues > maxQueues {
		return fmt.Errorf("bench: queues: %d is more than %d", c.Queues, maxQueues)
	}
	if c.ArgsBytes < 0 || c.ArgsBytes > maxArgsBytes {
		return fmt.Errorf("bench: args bytes: %d must be between 0 and %d", c.ArgsBytes, maxArgsBytes)
	}
	if c.JobSleep < 0 {
		return fmt.Errorf("bench: job sleep: %s must not be negative", c.JobSleep)
	}
	if _, err := pgx.ParseConfig(c.DatabaseURL); err != nil {
		return fmt.Errorf("bench: database url: %w", err)
	}
	return nil
}

// validateSlots checks --split-workers and --compare-queues against --workers and
// --queues.
func (c Config) validateSlots() error {
	if c.CompareQueues < 0 {
		return fmt.Errorf("bench: --compare-queues: %d must not be negative", c.CompareQueues)
	}
	if c.CompareFlow < 0 {
		return fmt.Errorf("bench: --compare-flow: %d must not be negative", c.CompareFlow)
	}
	if c.CompareFlow > 0 && (c.Workload != WorkloadDrain || c.CompareQueues > 0 || c.Vs != "") {
		return fmt.Errorf("bench: --compare-flow: only the %s workload of fenceq alone compares flow limits "+
			"(without --compare-queues and --vs)", WorkloadDrain)
	}
	if c.CompareQueues > 0 {
		if c.Workload != WorkloadDrain {
			return fmt.Errorf("bench: --compare-queues: only the %s workload compares queues, not %s", WorkloadDrain, c.Workload)
		}
		if c.Queues > 1 {
			return fmt.Errorf("bench: --compare-queues %d with --queues %d: the comparison sets the queues itself (1 and %d)",
				c.CompareQueues, c.Queues, c.CompareQueues)
		}
		if c.CompareQueues < 2 || c.CompareQueues > maxQueues {
			return fmt.Errorf("bench: --compare-queues: %d must be between 2 and %d", c.CompareQueues, maxQueues)
		}
		if c.Workers < c.CompareQueues || c.Workers%c.CompareQueues != 0 {
			return fmt.Errorf("bench: --workers %d is split over --compare-queues %d queues: it must be a multiple of it (at least %d)",
				c.Workers, c.CompareQueues, c.CompareQueues)
		}
	}
	if !c.SplitWorkers {
		return nil
	}
	switch c.Workload {
	case WorkloadDrain, WorkloadFenced, WorkloadSteady, WorkloadLatency:
	default:
		return fmt.Errorf("bench: --split-workers: the %s workload runs no workers to split", c.Workload)
	}
	if c.Workers < c.Queues || c.Workers%c.Queues != 0 {
		return fmt.Errorf("bench: --workers %d with --split-workers is split evenly over --queues %d: it must be a multiple of --queues (at least %d)",
			c.Workers, c.Queues, c.Queues)
	}
	return nil
}

// Limits of Config: a pool larger than the server allows fails at the start of the
// run instead (see checkConnections).
const (
	maxConns     = 1024
	maxQueues    = 10_000
	maxArgsBytes = 16 << 20
)

// Run runs the benchmark: Runs paired runs, alternating which side goes first, and
// returns every run's figures with their medians and ratios.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sides := sidesOf(cfg)
	systems := make([]system, len(sides))
	for i, sd := range sides {
		systems[i] = sd.sys
	}
	switch cfg.Workload {
	case WorkloadUI:
		return nil, fmt.Errorf("bench: the %s workload has a report of its own: run it with RunUI", WorkloadUI)
	case WorkloadIdle:
		return runIdle(ctx, cfg)
	case WorkloadLayout:
		return runLayout(ctx, cfg)
	}
	rep, err := newReport(ctx, cfg, systems)
	if err != nil {
		return nil, err
	}
	if cfg.CompareQueues > 0 {
		rep.ratioPairs = compareQueuesPairs(cfg)
	}
	if cfg.CompareFlow > 0 {
		rep.ratioPairs = [][2]string{{compareFlowName(cfg.CompareFlow), SystemFenceq}}
	}
	if err := checkConnections(ctx, cfg); err != nil {
		return nil, err
	}
	ran := 0
	for i := 0; i < cfg.Runs; i++ {
		order := slices.Clone(sides)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, sd := range order {
			s := sd.sys
			progressf(cfg.Progress, "run %d/%d: %s %s…\n", i+1, cfg.Runs, s.name(), cfg.Workload)
			r, err := runOnce(ctx, sd.cfg, s, i+1)
			if err != nil {
				return rep, fmt.Errorf("run %d of %s: %w", i+1, s.name(), err)
			}
			ran++
			r.Order = ran
			rep.add(r)
			progressf(cfg.Progress, "run %d/%d: %s %s: %s\n", i+1, cfg.Runs, s.name(), cfg.Workload, r.headline(cfg.Workload))
		}
	}
	rep.finish(ctx, cfg)
	return rep, nil
}

// side is one system measured by Run with the configuration of its runs.
type side struct {
	sys system
	cfg Config
}

// sidesOf lists the sides of a benchmark in report order. With CompareQueues each
// system is measured twice, on one queue and on CompareQueues queues (the slots split
// over them), under the names of compareQueuesName.
func sidesOf(cfg Config) []side {
	if cfg.CompareFlow > 0 {
		flow := cfg
		flow.FlowPartitions = cfg.CompareFlow
		return []side{{sys: newFenceqSystem(cfg), cfg: cfg},
			{sys: renamed{newFenceqSystem(flow), compareFlowName(cfg.CompareFlow)}, cfg: flow}}
	}
	if cfg.CompareQueues > 0 {
		one := cfg
		one.Queues, one.SplitWorkers = 1, true
		one = one.withQueues()
		many := cfg
		many.Queues, many.SplitWorkers = cfg.CompareQueues, true
		many = many.withQueues()
		var out []side
		for _, c := range []Config{one, many} {
			out = append(out, side{sys: renamed{newFenceqSystem(c), compareQueuesName(SystemFenceq, c.Queues)}, cfg: c})
		}
		if cfg.Vs == SystemRiver {
			for _, c := range []Config{one, many} {
				out = append(out, side{sys: renamed{newRiverSystem(c), compareQueuesName(SystemRiver, c.Queues)}, cfg: c})
			}
		}
		return out
	}
	out := []side{{sys: newFenceqSystem(cfg), cfg: cfg}}
	if cfg.Vs == SystemRiver {
		out = append(out, side{sys: newRiverSystem(cfg), cfg: cfg})
	}
	if cfg.Ceiling && (cfg.Workload == WorkloadDrain || cfg.Workload == WorkloadFenced) && cfg.Queues == 1 && cfg.JobSleep == 0 {
		out = append(out, side{sys: newCeilingSystem(cfg), cfg: cfg})
	}
	return out
}

// compareQueuesName names a system's side of --compare-queues: "fenceq/1q",
// "fenceq/1000q".
func compareQueuesName(sys string, queues int) string { return fmt.Sprintf("%s/%dq", sys, queues) }

// compareFlowName names the limited side of --compare-flow: "fenceq/flow1000".
func compareFlowName(partitions int) string {
	return fmt.Sprintf("%s/flow%d", SystemFenceq, partitions)
}

// compareQueuesPairs are the ratios of --compare-queues: each system's N queues over
// its one queue, then fenceq over River on each.
func compareQueuesPairs(cfg Config) [][2]string {
	n := cfg.CompareQueues
	pairs := [][2]string{{compareQueuesName(SystemFenceq, n), compareQueuesName(SystemFenceq, 1)}}
	if cfg.Vs == SystemRiver {
		pairs = append(pairs,
			[2]string{compareQueuesName(SystemRiver, n), compareQueuesName(SystemRiver, 1)},
			[2]string{compareQueuesName(SystemFenceq, 1), compareQueuesName(SystemRiver, 1)},
			[2]string{compareQueuesName(SystemFenceq, n), compareQueuesName(SystemRiver, n)})
	}
	return pairs
}

// renamed is a system reported under another name.
type renamed struct {
	system
	label string
}

func (r renamed) name() string { return r.label }

// env is what one run of one side works with: its own schema, a pool of cfg.Conns
// connections for the system and an admin connection for setup and statistics.
type env struct {
	cfg    Config
	schema string
	url    string // with search_path
	pool   *pgxpool.Pool
	admin  *pgx.Conn
	trace  *sqlTrace // set by reopenPool when cfg.TraceSQL
}

func newEnv(ctx context.Context, cfg Config, sys string) (*env, error) {
	var b [5]byte
	_, _ = rand.Read(b[:])
	schema := "fq_bench_" + sys + "_" + hex.EncodeToString(b[:])
	schema = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(schema))
	boot, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(cfg.DatabaseURL), err)
	}
	defer boot.Close(ctx)
	if _, err := boot.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema %s: %w", schema, err)
	}
	e := &env{cfg: cfg, schema: schema, url: connstr.WithSearchPath(cfg.DatabaseURL, schema)}
	if err := e.reopenPool(ctx); err != nil {
		e.close()
		return nil, err
	}
	if e.admin, err = pgx.Connect(ctx, e.url); err != nil {
		e.close()
		return nil, fmt.Errorf("connect admin: %w", err)
	}
	return e, nil
}

// reopenPool replaces the system's pool with a fresh one.
func (e *env) reopenPool(ctx context.Context) error {
	e.closePool()
	pcfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	pcfg.MaxConns = int32(e.cfg.Conns)
	e.trace = nil
	if e.cfg.TraceSQL {
		e.trace = newSQLTrace()
		pcfg.ConnConfig.Tracer = e.trace
	}
	if e.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("open pool: %w", err)
	}
	return nil
}

// closePool closes the system's pool: its backends exit and flush their statistics.
func (e *env) closePool() {
	if e.pool != nil {
		e.pool.Close()
		e.pool = nil
	}
}

// close drops the schema and closes every connection.
func (e *env) close() {
	e.closePool()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.admin != nil {
		_ = e.admin.Close(ctx)
	}
	c, err := pgx.Connect(ctx, e.cfg.DatabaseURL)
	if err != nil {
		e.cfg.Logger.Warn("bench: drop schema: connect", "schema", e.schema, "err", err)
		return
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{e.schema}.Sanitize()+" CASCADE"); err != nil {
		e.cfg.Logger.Warn("bench: drop schema", "schema", e.schema, "err", err)
	}
}

// connsBesidesPool are the connections a run opens besides its pool: the admin
// connection, the idle transaction's and the one that creates and drops the schema.
const connsBesidesPool = 3

// checkConnections fails when the server cannot give a run its pool: the pool would
// otherwise wait for connections that never come, and the figures would measure that.
func checkConnections(ctx context.Context, cfg Config) error {
	return checkFreeConnections(ctx, cfg, cfg.Conns+connsBesidesPool, fmt.Sprintf("conns: %d", cfg.Conns))
}

// checkFreeConnections fails when the server has fewer than need connections free for
// what (the settings that need them, named in the error).
func checkFreeConnections(ctx context.Context, cfg Config, need int, what string) error {
	c, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redact.URL(cfg.DatabaseURL), err)
	}
	defer c.Close(ctx)
	var maxConn, reserved, inUse int
	if err := c.QueryRow(ctx, sqlConnectionLimits).Scan(&maxConn, &reserved, &inUse); err != nil {
		return fmt.Errorf("read connection limits: %w", err)
	}
	free := maxConn - reserved - inUse
	if need > free {
		return fmt.Errorf("bench: %s needs %d connections, but the server has %d free "+
			"(max_connections %d, %d reserved, %d in use)", what, need, free, maxConn, reserved, inUse)
	}
	return nil
}

func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format, args...)
	}
}

// errVerify marks a run whose outcome broke an invariant of the benchmark (a job worked
// twice, not at all, or not completed).
var errVerify = errors.New("bench invariant violated")
