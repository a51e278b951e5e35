package stockcli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/chaos"
	"github.com/fenceq/fenceq/internal/netns"
)

// chaosCommand is `fenceq chaos`: a fault-injection run with real worker processes,
// and its hidden naive-worker subcommand (the baseline's worker process).
func chaosCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "chaos",
		Usage: "run worker processes under injected faults and check that no outcome is duplicated or lost",
		Description: "Starts --workers real `fenceq worker` processes on a fresh schema, each behind its own TCP\n" +
			"fault proxy, gives them a billing run, an order retry storm and sleep jobs longer than the\n" +
			"lease, and injects faults drawn from --seed for --duration: pause (SIGSTOP past the lease),\n" +
			"kill (SIGKILL and restart), terminate (pg_terminate_backend), blackhole, reset, latency,\n" +
			"commit-drop (the reply to a COMMIT is lost) and pg-restart (immediate mode; needs\n" +
			"--own-cluster, a throwaway cluster the harness controls). Then it lets the work settle,\n" +
			"runs the verify invariants and prints one report.\n\n" +
			"With --hosts N each worker runs on a host of its own (a network namespace, root and iproute2\n" +
			"needed) and the faults link-down, commit-cut and db-partition cut links. With --failover the\n" +
			"harness runs a synchronous standby and, half-way, kills the primary with COMMITs in flight and\n" +
			"promotes the standby; every acknowledged enqueue and outcome must be on it (--async measures\n" +
			"what asynchronous replication loses instead, and exits 0).\n\n" +
			"With --workload flow the waves are jobs under flow limits instead, and the report adds one line\n" +
			"per limit (concurrency, sequence order, rate) with the violations found in the lease history\n" +
			"the database recorded, and how many starts were checked; --naive then enforces the limits in\n" +
			"each process, as a MaxWorkers semaphore does, and is expected to report violations.\n\n" +
			"Exit status 0 only when nothing was duplicated or lost and every scheduled fault type fired.\n" +
			"With --naive the same run uses the naive baseline (no lease generation, unconditional\n" +
			"release, check-then-insert, no unique constraints): it is expected to report duplicates.",
		Flags: append([]ucli.Flag{
			&ucli.DurationFlag{Name: "duration", Value: time.Minute, Usage: "how long work is issued and faults injected (default 2m with --hosts: eleven fault types)"},
			&ucli.Int64Flag{Name: "seed", Usage: "seed of the fault schedule and the workload (default: from the clock, printed)"},
			&ucli.IntFlag{Name: "workers", Value: 3, Usage: "worker processes"},
			&ucli.StringFlag{Name: "faults", Value: "all", Usage: "comma-separated fault types: " + faultNames() + ", all or none"},
			&ucli.BoolFlag{Name: "naive", Usage: "run the naive baseline workers instead (expect duplicates)"},
			&ucli.BoolFlag{Name: "own-cluster", Usage: "run a throwaway PostgreSQL cluster (initdb) the harness can restart, instead of --database-url"},
			&ucli.IntFlag{Name: "hosts", Usage: "run each of N workers on a host of its own (a network namespace), PostgreSQL on another, " +
				"on a private bridge; adds the faults link-down, commit-cut and db-partition (needs root and iproute2)"},
			&ucli.BoolFlag{Name: "failover", Usage: "run a primary and a synchronous streaming standby; half-way the primary is killed " +
				"with COMMITs in flight and the standby promoted (the failover fault)"},
			&ucli.BoolFlag{Name: "async", Usage: "with --failover: asynchronous replication; what is lost is measured and reported, not asserted"},
			&ucli.DurationFlag{Name: "replica-lag", Usage: "with --async: silence the link the standby streams over this long before the kill"},
			&ucli.DurationFlag{Name: "lease", Value: 2 * time.Second, Usage: "the workers' lease (heartbeat and reaper every lease/4)"},
			&ucli.IntFlag{Name: "concurrency", Value: 4, Usage: "jobs per queue each worker runs at once"},
			&ucli.DurationFlag{Name: "settle", Value: 2 * time.Minute, Usage: "how long the work may take to drain after the faults stop"},
			&ucli.DurationFlag{Name: "wave-every", Value: 10 * time.Second, Usage: "time between waves of work"},
			&ucli.IntFlag{Name: "customers", Value: 20, Usage: "customers seeded and billed per wave"},
			&ucli.IntFlag{Name: "order-keys", Value: 8, Usage: "idempotency keys of the order storm per wave"},
			&ucli.IntFlag{Name: "sleep-jobs", Value: 3, Usage: "sleep jobs longer than the lease per wave"},
			&ucli.StringFlag{Name: "workload", Value: "incidents", Usage: "what the workers are given: incidents (billing runs, " +
				"an order storm, sleep jobs) or flow (jobs under a concurrency limit, a sequence and a rate limit, " +
				"checked against the database's lease history)"},
			&ucli.IntFlag{Name: "flow-jobs", Value: 4, Usage: "with --workload flow: jobs per wave per partition of each limit"},
			&ucli.StringFlag{Name: "worker-database-url", Usage: "what the workers connect to instead, e.g. a PgBouncer " +
				"whose server connections select the run's schema (then also pass --database-url with that search_path)"},
			&ucli.BoolFlag{Name: "no-listen", Usage: "workers poll without LISTEN/NOTIFY (needed behind PgBouncer in transaction mode)"},
			&ucli.StringFlag{Name: "log-dir", Usage: "directory for the workers' logs and mail files (default: a new temporary one)"},
			&ucli.BoolFlag{Name: "keep-schema", Usage: "keep the run's schema for inspection"},
			&ucli.BoolFlag{Name: "fault-log", Value: true, Usage: "print every injected fault with its proof"},
			&ucli.StringFlag{Name: flagDatabaseURL, EnvVars: []string{"DATABASE_URL"}, Value: DefaultDatabaseURL,
				Usage: "PostgreSQL server to run on (a new schema is created and dropped)"},
			&ucli.BoolFlag{Name: flagJSON, Usage: "print the report as JSON"},
		}, logFlags()...),
		Action: chaosAction,
		Subcommands: []*ucli.Command{{
			Name:            "naive-worker",
			Usage:           "the naive baseline's worker process (started by `fenceq chaos --naive`)",
			Hidden:          true,
			SkipFlagParsing: true,
			Action: func(c *ucli.Context) error {
				cfg, err := chaos.ParseNaiveFlags(c.Args().Slice())
				if err != nil {
					return usageError{Err: err}
				}
				return chaos.RunNaiveWorker(c.Context, cfg)
			},
		}},
	}
}

func faultNames() string {
	names := make([]string, len(chaos.AllFaults))
	for i, f := range chaos.AllFaults {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

func chaosAction(c *ucli.Context) error {
	if c.Args().Len() > 0 {
		return usageError{Err: fmt.Errorf("unknown argument %q (see `fenceq chaos --help`)", c.Args().First())}
	}
	faults, err := chaos.ParseFaults(c.String("faults"))
	if err != nil {
		return usageError{Err: fmt.Errorf("--faults: %w", err)}
	}
	for _, f := range []string{"duration", "lease", "settle", "wave-every"} {
		if c.Duration(f) <= 0 {
			return usageError{Err: fmt.Errorf("invalid --%s %s: must be positive", f, c.Duration(f))}
		}
	}
	flow := false
	switch c.String("workload") {
	case "incidents":
	case "flow":
		flow = true
	default:
		return usageError{Err: fmt.Errorf("invalid --workload %q: want incidents or flow", c.String("workload"))}
	}
	if c.Int("flow-jobs") < 1 {
		return usageError{Err: fmt.Errorf("invalid --flow-jobs %d: must be at least 1", c.Int("flow-jobs"))}
	}
	if c.Int("workers") < 1 || c.Int("workers") > 64 {
		return usageError{Err: fmt.Errorf("invalid --workers %d: must be 1–64", c.Int("workers"))}
	}
	hosts := c.Int("hosts")
	switch {
	case hosts < 0 || hosts > 64:
		return usageError{Err: fmt.Errorf("invalid --hosts %d: must be 1–64", hosts)}
	case hosts > 0 && c.Bool("failover"):
		return usageError{Err: errors.New("--hosts and --failover cannot be combined")}
	case hosts > 0 && c.IsSet("workers") && c.Int("workers") != hosts:
		return usageError{Err: fmt.Errorf("--workers %d differs from --hosts %d: one worker runs per host", c.Int("workers"), hosts)}
	case c.Bool("async") && !c.Bool("failover"):
		return usageError{Err: errors.New("--async needs --failover")}
	case c.Duration("replica-lag") < 0 || (c.Duration("replica-lag") > 0 && !c.Bool("async")):
		return usageError{Err: errors.New("--replica-lag needs --async (a synchronous standby that lags stalls every commit)")}
	}
	if hosts > 0 {
		if err := netns.Available(); err != nil {
			return usageError{Err: fmt.Errorf("--hosts: %w", err)}
		}
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("chaos: find the fenceq binary to start workers from: %w", err)
	}
	seed := c.Int64("seed")
	if !c.IsSet("seed") {
		seed = time.Now().UnixNano() % 1_000_000
	}
	lease := c.Duration("lease")
	duration := c.Duration("duration")
	if hosts > 0 && !c.IsSet("duration") {
		duration = 2 * time.Minute
	}
	cfg := chaos.Config{
		Env: chaos.EnvConfig{Binary: self, DatabaseURL: dbURL(c), OwnCluster: c.Bool("own-cluster"),
			Workers: c.Int("workers"), Naive: c.Bool("naive"), Lease: lease, Heartbeat: lease / 4,
			Reaper: lease / 4, Concurrency: c.Int("concurrency"), LogDir: c.String("log-dir"),
			KeepSchema: c.Bool("keep-schema"), WorkerDatabaseURL: c.String("worker-database-url"), Logger: log,
			Hosts: hosts, Failover: c.Bool("failover"), AsyncReplication: c.Bool("async"), ReplicaLag: c.Duration("replica-lag")},
		Workload: chaos.WorkloadConfig{WaveEvery: c.Duration("wave-every"), Customers: c.Int("customers"),
			OrderKeys: c.Int("order-keys"), SleepJobs: c.Int("sleep-jobs"), Flow: flow, FlowJobs: c.Int("flow-jobs")},
		Seed: seed, Duration: duration, Faults: faults, Settle: c.Duration("settle"), Logger: log,
	}
	if hosts > 0 {
		cfg.Env.Workers = hosts
	}
	if cfg.Env.OwnCluster || hosts > 0 || cfg.Env.Failover {
		cfg.Env.DatabaseURL = ""
	}
	if c.Bool("no-listen") {
		cfg.Env.WorkerArgs = append(cfg.Env.WorkerArgs, "--no-listen")
	}
	for _, f := range faults {
		if f == chaos.FaultPGRestart && !cfg.Env.OwnCluster && hosts == 0 && !cfg.Env.Failover {
			log.Warn("fault pg-restart skipped: " + chaos.ErrNoCluster.Error())
		}
	}
	log.Info("chaos run", "seed", seed, "duration", cfg.Duration, "workers", cfg.Env.Workers, "faults", c.String("faults"))
	rep, err := chaos.Run(c.Context, cfg)
	if err != nil {
		return err
	}
	err = output(c, rep, func(w io.Writer) error {
		if err := rep.WriteText(w); err != nil {
			return err
		}
		if c.Bool("fault-log") && len(rep.FaultLog) > 0 {
			fmt.Fprintln(w)
			return rep.WriteFaultLog(w)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !rep.Pass && rep.Asserted {
		return silentError{Msg: "chaos: " + strings.Join(rep.Failures, "; ")}
	}
	return nil
}
