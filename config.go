package fenceq

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// QueueConfig configures one queue a worker serves.
type QueueConfig struct {
	// MaxWorkers is how many jobs of this queue run at once. Defaults to 10.
	MaxWorkers int
}

// Config configures a Worker. Every field has a documented default; see validate for
// the relations that must hold between them.
type Config struct {
	// Handlers maps kinds to handlers. Required.
	Handlers *Handlers
	// Queues to serve and their concurrency. Defaults to {"default": {MaxWorkers: 10}}.
	Queues map[string]QueueConfig
	// ID names this worker process in fenceq_workers and in leased_by. Defaults to
	// host-pid-random.
	ID string
	// LeaseDuration is how long a lease lasts without a heartbeat. Defaults to 60s.
	LeaseDuration time.Duration
	// HeartbeatInterval is how often every lease is renewed (one statement for all).
	// Defaults to LeaseDuration/3.
	HeartbeatInterval time.Duration
	// LeaseMargin: a job's context is cancelled when no renewal was confirmed by the
	// monotonic time the last successful renewal was sent + LeaseDuration - LeaseMargin.
	// Defaults to LeaseDuration/10.
	LeaseMargin time.Duration
	// ReaperInterval is how often expired leases are revoked and due jobs promoted.
	// A job whose holder stopped heartbeating is offered again within LeaseDuration +
	// ReaperInterval, and a scheduled job or a retry becomes available up to
	// ReaperInterval after its run_at. Defaults to 5s.
	ReaperInterval time.Duration
	// PollInterval is how often the worker polls its queues when no wake-up arrives:
	// one claim statement for all of them (more only when their claims add up to more
	// than ClaimBatchSize). Defaults to 1s.
	PollInterval time.Duration
	// ClaimBatchSize caps the jobs claimed in one statement, which claims from all the
	// queues that have work and free slots. A queue's part never exceeds its free slots,
	// nor half its MaxWorkers (so claiming overlaps the completion of the previous
	// batch). Defaults to 1000.
	ClaimBatchSize int
	// CompleteBatchSize caps the completions written in one statement. Defaults to 1000.
	CompleteBatchSize int
	// ReapBatchSize caps the leases revoked in one statement. Defaults to 1000.
	ReapBatchSize int
	// RetentionPeriod is how long finished jobs are kept. Defaults to 24h; negative
	// disables pruning.
	RetentionPeriod time.Duration
	// LeaseEventRetention is how long lease events are kept. Defaults to 7 days.
	LeaseEventRetention time.Duration
	// PruneInterval is how often retention runs. Defaults to 1m.
	PruneInterval time.Duration
	// CountersInterval is how often the worker rolls the job counters up (the finished
	// counts of the dashboard, CountJobs and JobThroughput; see RollupJobCounts): each
	// roll-up reads the jobs finished since the last one. Defaults to ReaperInterval;
	// negative leaves the roll-up to other workers and the dashboard. A longer interval
	// makes the counts later, not cheaper: every finished job is read once.
	CountersInterval time.Duration
	// PruneBatchSize caps the rows deleted per statement. Defaults to 1000.
	PruneBatchSize int
	// HolderFreshness is how recent a holder's fenceq_workers heartbeat must be for the
	// reaper to count it alive. Defaults to 2×HeartbeatInterval.
	HolderFreshness time.Duration
	// StaleWorkerAge: worker rows not heartbeated for this long and holding no job are
	// removed. Defaults to 10×LeaseDuration.
	StaleWorkerAge time.Duration
	// Backoff is the retry policy. The zero value takes DefaultBackoff(): 1s doubling,
	// capped at 1h, 20% jitter. A Backoff with any field set is taken as given, its
	// Jitter 0 meaning none (see Backoff).
	// A retry runs at the first promotion pass (every ReaperInterval) after its delay.
	Backoff queue.Backoff
	// ShutdownGrace bounds how long Stop waits for cancelled handlers to return once its
	// context is done. Defaults to 5s.
	ShutdownGrace time.Duration
	// WriteTimeout bounds each lease write (complete, fail, heartbeat…). Defaults to 10s.
	WriteTimeout time.Duration
	// DisableListen turns off LISTEN/NOTIFY wake-ups (e.g. behind PgBouncer in transaction
	// mode); queues are then only polled.
	DisableListen bool
	// Periodic are the schedules this worker defines in code. Start upserts them into
	// fenceq_periodic, replacing their definitions and keeping their paused state and
	// last slot. Every worker whose periodic scheduling is on enqueues every schedule in
	// that table, whichever worker (or operator) defined it. Defaults to none.
	Periodic []*PeriodicJob
	// PeriodicInterval is how often the worker runs a scheduling pass; it also wakes
	// when the next slot of any schedule falls due. Defaults to 1s.
	PeriodicInterval time.Duration
	// PeriodicGrace: a slot that fell due within this long after the last completed
	// pass of any worker is caught up (every slot, none skipped); a later one fell due
	// while every worker was down and follows its schedule's queue.MissedPolicy. It also
	// bounds (half of it) how long a pass paused mid-transaction can hold up the others.
	// Defaults to 10s; must be longer than PeriodicInterval.
	PeriodicGrace time.Duration
	// DisablePeriodic turns this worker's scheduling passes off: it enqueues no
	// periodic jobs (Periodic is still upserted at Start).
	DisablePeriodic bool
	// FlowLimits are the flow limits this worker defines in code (queue.FlowLimit): Start
	// sets each in fenceq_flow_limits, replacing its numbers. Jobs enqueued under a
	// limit (InsertOpts.Flow) are claimed only while their partition has room, by any
	// worker, whichever defined the limit. Defaults to none.
	FlowLimits []queue.FlowLimit
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Hooks observe the worker's lifecycle events (jobs started and finished, leases
	// lost and revoked, stale writes rejected, heartbeats failed), for metrics and
	// tracing: each is a Hook, called in the order given. Defaults to none.
	Hooks []Hook
	// Middleware wraps the work of every job this worker runs, outside the kind's own
	// (HandlerOpts.Middleware), the first outermost. Defaults to none.
	Middleware []Middleware
	// InsertMiddleware wraps the enqueues made inside this worker's handlers — Enqueue
	// and EnqueueMany with the handler's context, and so the delivery jobs outbox.Insert
	// enqueues inside Job.Commit — the first outermost. Give an application's own
	// enqueues the same middleware with an Inserter. Defaults to none.
	InsertMiddleware []InsertMiddleware
}

func (c Config) withDefaults() Config {
	if len(c.Queues) == 0 {
		c.Queues = map[string]QueueConfig{queue.DefaultQueue: {}}
	}
	qs := make(map[string]QueueConfig, len(c.Queues))
	for name, q := range c.Queues {
		if q.MaxWorkers == 0 {
			q.MaxWorkers = 10
		}
		qs[name] = q
	}
	c.Queues = qs
	if c.ID == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&c.LeaseDuration, 60*time.Second)
	def(&c.HeartbeatInterval, c.LeaseDuration/3)
	def(&c.LeaseMargin, c.LeaseDuration/10)
	def(&c.ReaperInterval, 5*time.Second)
	def(&c.PollInterval, time.Second)
	def(&c.RetentionPeriod, 24*time.Hour)
	def(&c.LeaseEventRetention, 7*24*time.Hour)
	def(&c.PruneInterval, time.Minute)
	def(&c.CountersInterval, c.ReaperInterval)
	def(&c.HolderFreshness, 2*c.HeartbeatInterval)
	def(&c.StaleWorkerAge, 10*c.LeaseDuration)
	def(&c.ShutdownGrace, 5*time.Second)
	def(&c.WriteTimeout, 10*time.Second)
	def(&c.PeriodicInterval, time.Second)
	def(&c.PeriodicGrace, 10*time.Second)
	defInt(&c.ClaimBatchSize, 1000)
	defInt(&c.CompleteBatchSize, 1000)
	defInt(&c.ReapBatchSize, 1000)
	defInt(&c.PruneBatchSize, 1000)
	if c.Backoff == (queue.Backoff{}) {
		c.Backoff = queue.DefaultBackoff()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate checks a config with defaults applied; errors name the field.
func (c Config) validate() error {
	for i, l := range c.FlowLimits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("config: FlowLimits[%d]: %w", i, err)
		}
	}
	if c.Handlers == nil || len(c.Handlers.m) == 0 {
		return fmt.Errorf("config: Handlers: no handler registered")
	}
	for name, q := range c.Queues {
		if err := queue.ValidateQueue(name); err != nil {
			return fmt.Errorf("config: Queues: %w", err)
		}
		if q.MaxWorkers < 1 {
			return fmt.Errorf("config: Queues[%q].MaxWorkers: %d must be at least 1", name, q.MaxWorkers)
		}
	}
	positive := map[string]time.Duration{
		"LeaseDuration": c.LeaseDuration, "HeartbeatInterval": c.HeartbeatInterval,
		"ReaperInterval": c.ReaperInterval, "PollInterval": c.PollInterval,
		"PruneInterval": c.PruneInterval, "HolderFreshness": c.HolderFreshness,
		"WriteTimeout": c.WriteTimeout, "ShutdownGrace": c.ShutdownGrace,
		// Negative ages would delete every lease event, or the rows of live workers.
		"LeaseEventRetention": c.LeaseEventRetention, "StaleWorkerAge": c.StaleWorkerAge,
		"PeriodicInterval": c.PeriodicInterval, "PeriodicGrace": c.PeriodicGrace,
	}
	for name, d := range positive {
		if d <= 0 {
			return fmt.Errorf("config: %s: %s must be positive", name, d)
		}
	}
	if c.HeartbeatInterval >= c.LeaseDuration {
		return fmt.Errorf("config: HeartbeatInterval: %s must be shorter than LeaseDuration %s",
			c.HeartbeatInterval, c.LeaseDuration)
	}
	if c.LeaseMargin < 0 || c.LeaseMargin >= c.LeaseDuration-c.HeartbeatInterval {
		return fmt.Errorf("config: LeaseMargin: %s must be between 0 and LeaseDuration-HeartbeatInterval (%s)",
			c.LeaseMargin, c.LeaseDuration-c.HeartbeatInterval)
	}
	if c.PeriodicGrace <= c.PeriodicInterval {
		return fmt.Errorf("config: PeriodicGrace: %s must be longer than PeriodicInterval %s",
			c.PeriodicGrace, c.PeriodicInterval)
	}
	if _, err := c.periodicParams(); err != nil {
		return err
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	for i, mw := range c.Middleware {
		if mw == nil {
			return fmt.Errorf("config: Middleware[%d]: nil", i)
		}
	}
	for i, mw := range c.InsertMiddleware {
		if mw == nil {
			return fmt.Errorf("config: InsertMiddleware[%d]: nil", i)
		}
	}
	if _, err := newHookSet(c.Hooks); err != nil {
		return err
	}
	for name, n := range map[string]int{"ClaimBatchSize": c.ClaimBatchSize,
		"CompleteBatchSize": c.CompleteBatchSize, "ReapBatchSize": c.ReapBatchSize,
		"PruneBatchSize": c.PruneBatchSize} {
		if n < 1 {
			return fmt.Errorf("config: %s: %d must be at least 1", name, n)
		}
	}
	return nil
}

// periodicParams checks Periodic and returns the schedules as stored.
func (c Config) periodicParams() ([]queue.PeriodicParams, error) {
	out := make([]queue.PeriodicParams, 0, len(c.Periodic))
	seen := make(map[string]bool, len(c.Periodic))
	for i, pj := range c.Periodic {
		if pj == nil {
			return nil, fmt.Errorf("config: Periodic[%d]: nil", i)
		}
		p, err := pj.Params()
		if err != nil {
			return nil, fmt.Errorf("config: Periodic[%d] (%q): %w", i, pj.name, err)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("config: Periodic[%d]: name %q is defined twice", i, p.Name)
		}
		seen[p.Name] = true
		out = append(out, p)
	}
	return out, nil
}
