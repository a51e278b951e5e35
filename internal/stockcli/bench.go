package stockcli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/bench"
)

// benchCommand is `fenceq bench WORKLOAD`: throughput and latency of fenceq, side by
// side with River (--vs river) and, for drain and fenced, with the bare-SQL ceiling.
func benchCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "bench",
		Usage:     "measure throughput and latency, optionally side by side with River",
		ArgsUsage: "WORKLOAD",
		Description: "WORKLOAD is one of:\n" +
			"  insert   COPY batches of 5,000 (--jobs) and single-row inserts (--jobs/10), jobs/s\n" +
			"  drain    work down --jobs pre-inserted no-op jobs, jobs/s (with the bare-SQL ceiling)\n" +
			"  steady   insert and work together for --duration, worked jobs/s\n" +
			"  latency  enqueue→start p50/p95/p99 at --rate jobs/s for --duration\n" +
			"  fenced   each job commits a result row + an outbox row + its completion in one\n" +
			"           transaction (fenceq Job.Commit vs River JobCompleteTx), jobs/s (with the\n" +
			"           bare-SQL ceiling: each job's transaction in one pipelined round trip)\n" +
			"  idle     --processes workers, each with its own pool of --conns, serving 1 queue\n" +
			"           and then --queues queues (default 100) with no jobs: transactions/s of\n" +
			"           a database the bench creates and drops (needs CREATEDB), statements/s\n" +
			"           and claims/s, medians and the ratio N queues / 1 queue\n" +
			"  layout   storage layouts at the bare-SQL level (--layouts single,split,partitioned,\n" +
			"           narrow,heaponly,leaseset): --retained finished jobs, --jobs drained by\n" +
			"           --ceiling-claimers (claim 1,000, one batched fenced completion each);\n" +
			"           jobs/s, WAL per job, heap and index blocks per claim and per job, dead\n" +
			"           tuples, rows updated per job and the share of them heap-only, claims\n" +
			"           retried, VACUUM time, pages of the hot tables\n" +
			"  ui       the dashboard's pages' server time with --rows finished jobs retained\n" +
			"           (each size in a schema of its own, seeded, rolled up and analysed),\n" +
			"           the median of --requests requests per page through the handler in\n" +
			"           this process; fails when a page's statement scans history sequentially\n" +
			"Each run of each side uses a fresh schema of the database, dropped afterwards; with\n" +
			"--vs river the sides alternate which goes first. The table shows the median, min,\n" +
			"max and max/min of the runs per side and the ratios of the medians, plus WAL bytes,\n" +
			"commits and updates per job, the HOT share and dead tuples of the job table, and\n" +
			"the CPU time and heap allocations of this process per job; drain and fenced add\n" +
			"the most jobs running at once and this process's memory per 1,000 of them.\n" +
			"Examples:\n" +
			"  fenceq bench drain --jobs 200000 --vs river --runs 5\n" +
			"  fenceq bench latency --rate 1000 --duration 20s --vs river\n" +
			"  fenceq bench drain --retained 1000000 --idle-xact 60s --runs 3\n" +
			"  fenceq bench drain --queues 100 --workers 10 --args-bytes 10000 --runs 3\n" +
			"  fenceq bench drain --queues 1000 --workers 1000 --split-workers --vs river\n" +
			"  fenceq bench drain --workers 1000 --compare-queues 1000 --vs river\n" +
			"  fenceq bench drain --jobs 20000 --workers 10000 --job-sleep 3s --runs 1\n" +
			"  fenceq bench idle --processes 10 --queues 100 --vs river\n" +
			"  fenceq bench layout --jobs 200000 --retained 1000000 --runs 3\n" +
			"  fenceq bench ui --rows 10000,1000000,10000000",
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "jobs", Usage: "jobs of insert, drain, fenced and layout", DefaultText: "200000; fenced 20000"},
			&ucli.DurationFlag{Name: "duration", Usage: "length of steady and latency, measured window of idle", DefaultText: "10s; idle 30s"},
			&ucli.IntFlag{Name: "rate", Usage: "arrival rate of latency, jobs/s", DefaultText: "1000"},
			&ucli.IntFlag{Name: "workers", Usage: "jobs each side runs at once per queue (MaxWorkers)", DefaultText: "1000; idle 1"},
			&ucli.IntFlag{Name: "conns", Usage: "connections in each side's pool (each process's, in idle)", DefaultText: "8; idle 2"},
			&ucli.IntFlag{Name: "processes", Usage: "idle: workers of each side, each with its own pool of --conns", DefaultText: "10"},
			&ucli.IntFlag{Name: "runs", Usage: "paired runs (idle, layout: rounds over the sides)", DefaultText: "5; idle and layout 3"},
			&ucli.StringFlag{Name: "vs", Usage: "peer measured alongside: river"},
			&ucli.IntFlag{Name: "retained", Usage: "finished jobs pre-filled before each run (layout: in each layout's history)", DefaultText: "none"},
			&ucli.DurationFlag{Name: "idle-xact", Usage: "hold an idle transaction (vacuum horizon) open this long during each run", DefaultText: "none"},
			&ucli.BoolFlag{Name: "no-ceiling", Usage: "drain and fenced: skip the bare-SQL ceiling"},
			&ucli.BoolFlag{Name: "no-checkpoint", Usage: "do not run CHECKPOINT before each run (it needs superuser or pg_checkpoint)"},
			&ucli.IntFlag{Name: "ceiling-claimers", Usage: "concurrent claimers of the bare-SQL ceiling and of layout", DefaultText: "2"},
			&ucli.IntFlag{Name: "claim-batch", Usage: "fenceq ClaimBatchSize", DefaultText: "the engine's"},
			&ucli.IntFlag{Name: "queues", Usage: "spread the jobs over `N` queues, each served with --workers slots", DefaultText: "1"},
			&ucli.BoolFlag{Name: "split-workers", Usage: "drain, fenced, steady, latency: --workers is the total, split evenly over --queues"},
			&ucli.IntFlag{Name: "compare-flow", Usage: "drain: alternate runs with no flow limit and runs with every job under a " +
				"limit of one running job per partition, over `N` partitions, and report the ratio", DefaultText: "off"},
			&ucli.IntFlag{Name: "compare-queues", Usage: "drain: alternate runs on 1 queue and on `N` queues (--workers split over them) and report N/1", DefaultText: "off"},
			&ucli.IntFlag{Name: "args-bytes", Usage: "pad each job's args with `N` bytes that do not compress", DefaultText: "none"},
			&ucli.BoolFlag{Name: "commit-writes", Usage: "fenced: fenceq's handler commits through Job.CommitWrites (one pipeline) instead of Job.Commit"},
			&ucli.BoolFlag{Name: "no-search-indexes", Usage: "fenceq's side: drop history's search indexes after migrating, to measure what they cost"},
			&ucli.DurationFlag{Name: "job-sleep", Usage: "drain, fenced: each handler sleeps this long (memory per running job)", DefaultText: "none"},
			&ucli.StringFlag{Name: "layouts", Usage: "layout: the layouts compared, comma-separated", DefaultText: strings.Join(bench.Layouts, ",")},
			&ucli.StringFlag{Name: "rows", Usage: "ui: the sizes of retained history measured, finished jobs, comma-separated", DefaultText: "10000,1000000"},
			&ucli.IntFlag{Name: "requests", Usage: "ui: requests timed per page and size", DefaultText: "20"},
			&ucli.BoolFlag{Name: "trace-sql", Usage: "after each run, print its statements by total time on stderr"},
			&ucli.StringFlag{Name: "cpuprofile", Usage: "write a Go CPU profile of the whole bench (this process: the workers and the load) to `FILE`"},
			&ucli.StringFlag{Name: "memprofile", Usage: "write a Go allocation profile of the whole bench to `FILE`"},
			&ucli.BoolFlag{Name: "quiet", Usage: "no progress lines on stderr"},
			&ucli.BoolFlag{Name: "verbose", Usage: "show the systems' own warnings on stderr"},
		},
		Action: func(c *ucli.Context) error {
			if err := needArgs(c, 1, 1, "WORKLOAD [flags]"); err != nil {
				return err
			}
			cfg := bench.Config{
				Workload:        strings.ToLower(c.Args().First()),
				DatabaseURL:     dbURL(c),
				Jobs:            c.Int("jobs"),
				Duration:        c.Duration("duration"),
				Rate:            c.Int("rate"),
				Workers:         c.Int("workers"),
				Conns:           c.Int("conns"),
				Runs:            c.Int("runs"),
				Processes:       c.Int("processes"),
				Vs:              strings.ToLower(c.String("vs")),
				Ceiling:         !c.Bool("no-ceiling"),
				Checkpoint:      !c.Bool("no-checkpoint"),
				CeilingClaimers: c.Int("ceiling-claimers"),
				Retained:        c.Int("retained"),
				IdleXact:        c.Duration("idle-xact"),
				ClaimBatch:      c.Int("claim-batch"),
				Queues:          c.Int("queues"),
				SplitWorkers:    c.Bool("split-workers"),
				CompareQueues:   c.Int("compare-queues"),
				CompareFlow:     c.Int("compare-flow"),
				ArgsBytes:       c.Int("args-bytes"),
				JobSleep:        c.Duration("job-sleep"),
				CommitWrites:    c.Bool("commit-writes"),
				NoSearchIndexes: c.Bool("no-search-indexes"),
				TraceSQL:        c.Bool("trace-sql"),
				Layouts:         splitList(c.String("layouts")),
			}
			if !c.Bool("quiet") {
				cfg.Progress = stderr(c)
			}
			if c.Bool("verbose") {
				cfg.Logger = slog.New(slog.NewTextHandler(stderr(c), &slog.HandlerOptions{Level: slog.LevelWarn}))
			}
			for _, v := range splitList(c.String("rows")) {
				n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
				if err != nil {
					return usageError{Err: fmt.Errorf("--rows: %q is not a number of rows", v)}
				}
				cfg.UIRows = append(cfg.UIRows, n)
			}
			cfg.UIRequests = c.Int("requests")
			if c.IsSet("requests") && cfg.UIRequests < 1 {
				return usageError{Err: fmt.Errorf("--requests: %d must be at least 1", cfg.UIRequests)}
			}
			if c.IsSet("runs") && cfg.Runs < 1 {
				return usageError{Err: fmt.Errorf("--runs: %d must be at least 1", cfg.Runs)}
			}
			if err := benchUsage(cfg); err != nil {
				return err
			}
			stopProfiles, err := startProfiles(c.String("cpuprofile"), c.String("memprofile"))
			if err != nil {
				return err
			}
			if cfg.Workload == bench.WorkloadUI {
				rep, err := bench.RunUI(c.Context, cfg)
				if perr := stopProfiles(); perr != nil && err == nil {
					err = perr
				}
				if rep != nil && len(rep.Sizes) > 0 {
					var werr error
					if wantJSON(c) {
						werr = rep.WriteJSON(stdout(c))
					} else {
						werr = rep.WriteText(stdout(c))
					}
					if err == nil {
						err = werr
					}
				}
				if err != nil {
					return fmt.Errorf("bench ui against %s: %w", RedactURL(cfg.DatabaseURL), err)
				}
				return nil
			}
			rep, err := bench.Run(c.Context, cfg)
			if perr := stopProfiles(); perr != nil && err == nil {
				return perr
			}
			if err != nil {
				return fmt.Errorf("bench %s against %s: %w", cfg.Workload, RedactURL(cfg.DatabaseURL), err)
			}
			if wantJSON(c) {
				return rep.WriteJSON(stdout(c))
			}
			return rep.WriteText(stdout(c))
		},
	}
}

// startProfiles starts a CPU profile into cpuFile (if set); the returned function stops
// it and writes the allocation profile into memFile (if set).
func startProfiles(cpuFile, memFile string) (func() error, error) {
	var cpu *os.File
	if cpuFile != "" {
		f, err := os.Create(cpuFile)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("cpu profile %s: %w", cpuFile, err)
		}
		cpu = f
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			if err := cpu.Close(); err != nil {
				errs = append(errs, fmt.Errorf("cpu profile %s: %w", cpuFile, err))
			}
		}
		if memFile != "" {
			f, err := os.Create(memFile)
			if err != nil {
				errs = append(errs, fmt.Errorf("memory profile: %w", err))
			} else {
				if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
					errs = append(errs, fmt.Errorf("memory profile %s: %w", memFile, err))
				}
				if err := f.Close(); err != nil {
					errs = append(errs, fmt.Errorf("memory profile %s: %w", memFile, err))
				}
			}
		}
		return errors.Join(errs...)
	}, nil
}

// benchUsage turns the command-line mistakes into usage errors (exit 2) before any
// connection is made.
func benchUsage(cfg bench.Config) error {
	known := false
	for _, w := range bench.Workloads {
		known = known || w == cfg.Workload
	}
	if !known {
		return usageError{Err: fmt.Errorf("unknown workload %q: use one of %s", cfg.Workload, strings.Join(bench.Workloads, ", "))}
	}
	if cfg.Vs != "" && cfg.Vs != bench.SystemRiver {
		return usageError{Err: fmt.Errorf("--vs %q: the only peer is %s", cfg.Vs, bench.SystemRiver)}
	}
	for name, n := range map[string]int{"--jobs": cfg.Jobs, "--rate": cfg.Rate, "--workers": cfg.Workers,
		"--conns": cfg.Conns, "--retained": cfg.Retained, "--ceiling-claimers": cfg.CeilingClaimers,
		"--claim-batch": cfg.ClaimBatch, "--queues": cfg.Queues, "--args-bytes": cfg.ArgsBytes,
		"--compare-queues": cfg.CompareQueues, "--compare-flow": cfg.CompareFlow, "--processes": cfg.Processes, "--runs": cfg.Runs} {
		if n < 0 {
			return usageError{Err: fmt.Errorf("%s: %d must not be negative", name, n)}
		}
	}
	for _, l := range cfg.Layouts {
		if !slices.Contains(bench.Layouts, l) {
			return usageError{Err: fmt.Errorf("--layouts: %q is not a layout: use some of %s", l, strings.Join(bench.Layouts, ","))}
		}
	}
	if len(cfg.Layouts) > 0 && cfg.Workload != bench.WorkloadLayout {
		return usageError{Err: fmt.Errorf("--layouts: only the %s workload compares layouts, not %s", bench.WorkloadLayout, cfg.Workload)}
	}
	if (len(cfg.UIRows) > 0 || cfg.UIRequests != 0) && cfg.Workload != bench.WorkloadUI {
		return usageError{Err: fmt.Errorf("--rows and --requests: only the %s workload takes them, not %s", bench.WorkloadUI, cfg.Workload)}
	}
	for _, n := range cfg.UIRows {
		if n < 100 || n > 100_000_000 {
			return usageError{Err: fmt.Errorf("--rows: %d must be 100–100,000,000", n)}
		}
	}
	if cfg.JobSleep < 0 {
		return usageError{Err: fmt.Errorf("--job-sleep: %s must not be negative", cfg.JobSleep)}
	}
	if cfg.CommitWrites && cfg.Workload != bench.WorkloadFenced {
		return usageError{Err: fmt.Errorf("--commit-writes: only the %s workload commits in its handlers, not %s", bench.WorkloadFenced, cfg.Workload)}
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if f = strings.ToLower(strings.TrimSpace(f)); f != "" {
			out = append(out, f)
		}
	}
	return out
}
