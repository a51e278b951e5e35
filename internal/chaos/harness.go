package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fenceq/fenceq/jobs/builtin"
)

// Config describes one chaos run.
type Config struct {
	// Env: the database, the worker processes and their settings.
	Env EnvConfig
	// Workload: what the workers are given to do.
	Workload WorkloadConfig
	// Seed draws the fault schedule and the workload. The same seed gives the same
	// schedule and requests (the processes' timing still varies).
	Seed int64
	// Duration is how long work is issued and faults injected. Defaults to 30s.
	Duration time.Duration
	// Faults are the fault types to draw the schedule from. Nil means all;
	// pg-restart is skipped (and reported) unless Env.OwnCluster.
	Faults []FaultType
	// Schedule, when set, is used instead of a drawn one (Faults is then ignored).
	Schedule []PlannedFault
	// FaultGap is the mean time between faults. Defaults to the lease.
	FaultGap time.Duration
	// Settle bounds the wait for the work to drain once the faults stopped. Defaults
	// to 90s.
	Settle time.Duration
	// Logger receives progress. Defaults to discarding.
	Logger *slog.Logger
	// OnStarted, if set, runs once the workers are up, before the workload starts.
	OnStarted func(*Env)
}

// Run starts the workers, issues the workload while injecting faults, lets the work
// settle, stops the workers, and reports. The error is only for a run that could not
// be carried out; a run that found duplicates or lost work returns a report with Pass
// false.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Env.Logger == nil {
		cfg.Env.Logger = cfg.Logger
	}
	if cfg.Duration == 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.Settle == 0 {
		cfg.Settle = 90 * time.Second
	}
	if cfg.Duration < 0 || cfg.Settle < 0 {
		return nil, fmt.Errorf("chaos: duration %s and settle %s must be positive", cfg.Duration, cfg.Settle)
	}
	if cfg.Workload.Seed == 0 {
		cfg.Workload.Seed = cfg.Seed
	}
	asked := cfg.Faults
	if asked == nil {
		asked = slices.Clone(AllFaults)
	}
	skipped := map[FaultType]string{}
	var faults []FaultType
	failover := false
	own := cfg.Env.OwnCluster || cfg.Env.Hosts > 0 || cfg.Env.Failover
	for _, f := range asked {
		switch {
		case f == FaultPGRestart && !own:
			skipped[f] = ErrNoCluster.Error()
		case f == FaultPGRestart && cfg.Env.Failover:
			skipped[f] = "a restart would bring the killed primary back beside the promoted standby"
		case slices.Contains(hostFaults, f) && cfg.Env.Hosts == 0:
			skipped[f] = ErrNoHosts.Error()
		case f == FaultFailover && !cfg.Env.Failover:
			skipped[f] = "the harness runs no standby (run with --failover)"
		case f == FaultFailover:
			failover = true
		default:
			faults = append(faults, f)
		}
	}
	started := time.Now()
	env, err := NewEnv(ctx, cfg.Env)
	if err != nil {
		return nil, err
	}
	defer func() { _ = env.Close(context.Background()) }()
	plan := cfg.Schedule
	if plan == nil {
		plan, err = Plan(PlanParams{Seed: cfg.Seed, Faults: faults, Workers: len(env.Workers),
			Duration: cfg.Duration, Lease: env.cfg.Lease, Gap: cfg.FaultGap})
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		if failover {
			// Once, half-way: the other faults before and after it.
			fo := PlannedFault{Type: FaultFailover, At: cfg.Duration / 2}
			i := 0
			for i < len(plan) && plan[i].At < fo.At {
				i++
			}
			plan = slices.Insert(plan, i, fo)
		}
	}
	for _, f := range plan {
		if f.Type == FaultPGRestart && env.Cluster == nil {
			return nil, fmt.Errorf("chaos: the schedule restarts PostgreSQL: %w", ErrNoCluster)
		}
	}
	log := cfg.Logger
	log.Info("starting workers", "workers", len(env.Workers), "schema", env.Schema, "logs", env.LogDir,
		"mode", map[bool]string{false: "fenced", true: "naive"}[env.cfg.Naive])
	if err := env.StartWorkers(ctx); err != nil {
		return nil, err
	}
	if cfg.OnStarted != nil {
		cfg.OnStarted(env)
	}
	wl, err := StartWorkload(ctx, env, cfg.Workload)
	if err != nil {
		return nil, err
	}
	defer wl.Close()
	stopProbe := func() {}
	if env.fo != nil {
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			env.runProbe(ctx, wl.pool, time.Now().Add(cfg.Duration), stop)
		}()
		var once sync.Once
		stopProbe = func() { once.Do(func() { close(stop); <-done }) }
		defer stopProbe()
	}

	log.Info("running the workload and injecting faults", "duration", cfg.Duration, "faults", len(plan), "seed", cfg.Seed)
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	wlErr := make(chan error, 1)
	faultsDone := make(chan struct{})
	go func() { wlErr <- wl.Run(ctx, deadline, faultsDone) }()
	records := env.RunSchedule(ctx, start, plan, env.cfg.Lease/2, deadline.Add(env.cfg.Lease))
	close(faultsDone)
	if err := <-wlErr; err != nil {
		return nil, err
	}
	sleepCtx(ctx, time.Until(deadline))
	phase := time.Since(start).Round(time.Millisecond)
	env.Restore()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("chaos: run interrupted: %w", err)
	}

	log.Info("faults stopped; waiting for the work to settle", "within", cfg.Settle)
	settleStart := time.Now()
	sctx, cancel := context.WithTimeout(ctx, cfg.Settle)
	wl.WaitStorm(sctx)
	env.waitSettled(sctx)
	cancel()
	stopProbe()
	settled := time.Since(settleStart)
	if err := env.StopWorkers(15 * time.Second); err != nil {
		log.Warn("stopping workers", "err", err)
	}

	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer rcancel()
	rep, err := collect(rctx, collectInput{env: env, wl: wl, plan: plan, records: records, skipped: skipped,
		asked: asked, seed: cfg.Seed, duration: cfg.Duration})
	if err != nil {
		return nil, err
	}
	rep.FaultPhase = Duration(phase)
	rep.Settle = Duration(settled.Round(time.Millisecond))
	rep.Elapsed = Duration(time.Since(started).Round(time.Millisecond))
	if f, err := os.Create(filepath.Join(env.LogDir, "report.json")); err == nil {
		_ = rep.WriteJSON(f)
		_ = f.Close()
	}
	return rep, nil
}

// waitSettled waits until every job is final (a periodic job only once it is due, see
// sqlUnfinishedJobs) and no outbox row is pending, or ctx ends. Database errors (a
// restart still in progress) are retried.
func (e *Env) waitSettled(ctx context.Context) {
	for {
		var jobs, outbox int64
		err := e.Pool.QueryRow(ctx, sqlUnfinishedJobs, builtin.RecurringKinds()).Scan(&jobs)
		if err == nil {
			err = e.Pool.QueryRow(ctx, sqlPendingOutbox).Scan(&outbox)
		}
		if err == nil && jobs == 0 && outbox == 0 {
			return
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			e.log.Warn("settle check failed", "err", err)
		}
		sleepCtx(ctx, 250*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
	}
}
