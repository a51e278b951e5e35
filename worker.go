package fenceq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// Worker claims jobs from its queues, runs their handlers under fenced leases, renews
// every lease it holds in one statement per heartbeat, and runs the reaper, scheduler
// and retention. Several workers (in one process or many) can share a database.
type Worker struct {
	cfg  Config
	pool *pgxpool.Pool
	log  *slog.Logger
	// hooks are Config.Hooks by event.
	hooks hookSet
	// inserter carries Config.InsertMiddleware into the handlers' contexts; nil when
	// there is none.
	inserter *Inserter

	mu       sync.Mutex
	execs    map[leaseKey]*execution // by (job id, generation): a job revoked here may be re-claimed here
	running  map[string]int          // per queue: handlers running or settling (a success frees its slot once its completion is queued)
	state    lifecycle
	queues   map[string]*queueLoop
	complete chan *execution
	// claimTurns bounds the claim statements in flight across the worker's queues (see
	// claimConcurrency): a claim loop takes a turn before it counts its free slots.
	claimTurns chan struct{}

	claimCtx     context.Context // the claim loops' context, set by Start (for AddQueue)
	claimCancel  context.CancelFunc
	bgCancel     context.CancelFunc
	claimWG      sync.WaitGroup
	execWG       sync.WaitGroup
	bgWG         sync.WaitGroup
	completerWG  sync.WaitGroup
	completeDone chan struct{}
	runners      *runners

	// kinds are the kinds of the handlers, sorted: the only ones the worker claims.
	kinds []string
	// regMu orders the writes of the worker's row, so that the last one written names the
	// queues served last (AddQueue, RemoveQueue), and none lands after Stop removed it.
	regMu sync.Mutex
	// rowStale is set when a change of queues could not be recorded; the next heartbeat
	// writes the row again.
	rowStale atomic.Bool

	periodic      []queue.PeriodicParams // Config.Periodic, checked
	periodicSince time.Time              // the database's time at Start: slots after it fell due while this worker ran
	schedules     scheduleCache          // the periodic goroutine's
}

// lifecycle is where a Worker is between NewWorker and Stop.
type lifecycle int

const (
	stateNew      lifecycle = iota
	stateStarting           // Start is registering the worker and starting its goroutines
	stateStarted
	stateStopping
	stateStopped
)

type leaseKey struct{ id, gen int64 }

func keyOf(l queue.Lease) leaseKey { return leaseKey{l.JobID, l.Gen} }

type queueLoop struct {
	name string
	max  int
	wake chan struct{}
	// cursor is where the last claim ended in claim order and lookedBehind when the
	// queue was last claimed from the start of the order. Only the queue's claim loop
	// touches them.
	cursor       *store.ClaimCursor
	lookedBehind time.Time
	// starved is set, under Worker.mu, when the claim loop found no free slot; the next
	// freed slot wakes it. Freed slots do not wake it otherwise: a wake-up per finished
	// job would cost every job an empty claim besides its own.
	starved bool
	// floor is the last job of a kind this worker has no handler for that a look from
	// the start of the order found ahead of the jobs it could claim, and checkedFloor
	// when it was last looked for. Claims that would start from the start start after
	// the floor instead, except the look behind, so a queue whose head holds jobs of
	// other kinds is walked once per PollInterval, not by every claim. Only the claim
	// loop touches them.
	floor        *store.ClaimCursor
	checkedFloor time.Time
	// stop ends the claim loop after its current claim (RemoveQueue); done is closed
	// when it has ended.
	stop chan struct{}
	done chan struct{}
}

func newQueueLoop(name string, max int) *queueLoop {
	return &queueLoop{name: name, max: max, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
}

func (q *queueLoop) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// NewWorker validates the config and returns a worker that is not started yet.
func NewWorker(pool *pgxpool.Pool, cfg Config) (*Worker, error) {
	if pool == nil {
		return nil, errors.New("new worker: pool is nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	hooks, err := newHookSet(cfg.Hooks)
	if err != nil {
		return nil, err
	}
	w := &Worker{
		cfg: cfg, pool: pool, hooks: hooks,
		log:        cfg.Logger.With("worker", cfg.ID),
		execs:      map[leaseKey]*execution{},
		running:    map[string]int{},
		queues:     map[string]*queueLoop{},
		runners:    newRunners(runnerIdle),
		complete:   make(chan *execution, cfg.CompleteBatchSize),
		claimTurns: make(chan struct{}, claimConcurrency(pool)),
		kinds:      cfg.Handlers.Kinds(),
	}
	slices.Sort(w.kinds)
	if w.periodic, err = cfg.periodicParams(); err != nil {
		return nil, err
	}
	if len(cfg.InsertMiddleware) > 0 {
		w.inserter = NewInserter(cfg.InsertMiddleware...)
	}
	for name, q := range cfg.Queues {
		w.queues[name] = newQueueLoop(name, q.MaxWorkers)
	}
	return w, nil
}

// ID returns the worker's id, as stored in fenceq_workers and leased_by.
func (w *Worker) ID() string { return w.cfg.ID }

// Config returns the worker's config with defaults applied; Queues are the queues it
// serves now (see AddQueue).
func (w *Worker) Config() Config {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.cfg
	c.Queues = maps.Clone(w.cfg.Queues)
	return c
}

// Start registers the worker in fenceq_workers and starts claiming. It returns once the
// worker runs; call Stop to shut it down.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	if w.state != stateNew {
		w.mu.Unlock()
		return errors.New("start worker: already started")
	}
	w.state = stateStarting
	w.mu.Unlock()

	err := store.CheckSchema(ctx, w.pool)
	if err == nil {
		err = w.register(ctx)
	}
	if err != nil {
		w.mu.Lock()
		w.state = stateNew
		w.mu.Unlock()
		return fmt.Errorf("start worker: %w", err)
	}
	if w.periodicSince, err = w.upsertPeriodic(ctx); err != nil {
		w.mu.Lock()
		w.state = stateNew
		w.mu.Unlock()
		_ = store.DeregisterWorker(context.WithoutCancel(ctx), w.pool, w.cfg.ID)
		return fmt.Errorf("start worker: %w", err)
	}

	claimCtx, claimCancel := context.WithCancel(context.Background())
	bgCtx, bgCancel := context.WithCancel(context.Background())
	w.claimCancel, w.bgCancel = claimCancel, bgCancel

	w.completeDone = make(chan struct{})
	w.completerWG.Add(1)
	go w.runCompleter()

	w.bgWG.Add(2)
	go w.runHeartbeat(bgCtx)
	go w.runMaintenance(bgCtx)
	if !w.cfg.DisablePeriodic {
		w.bgWG.Add(1)
		go w.runPeriodic(bgCtx)
	}

	if !w.cfg.DisableListen {
		w.claimWG.Add(1)
		go func() {
			defer w.claimWG.Done()
			store.Listen(claimCtx, w.pool, store.ListenConfig{
				OnNotify: func(q string) {
					w.mu.Lock()
					ql := w.queues[q]
					w.mu.Unlock()
					if ql != nil {
						ql.poke()
					}
				},
				OnConnect: func() {
					w.mu.Lock()
					defer w.mu.Unlock()
					for _, ql := range w.queues {
						ql.poke()
					}
				},
				OnError: func(err error) { w.log.Warn("job wake-ups interrupted; polling meanwhile", "err", err) },
			})
		}()
	}
	w.mu.Lock()
	w.claimCtx = claimCtx
	for _, ql := range w.queues {
		w.claimWG.Add(1)
		go w.runQueue(claimCtx, ql)
	}
	w.state = stateStarted
	names := w.queueNamesLocked()
	w.mu.Unlock()
	w.log.Info("worker started", "queues", names, "kinds", w.kinds, "lease", w.cfg.LeaseDuration,
		"heartbeat", w.cfg.HeartbeatInterval)
	return nil
}

// Stop shuts the worker down gracefully: it stops claiming, lets running jobs finish
// until ctx is done, then cancels the rest (cause ErrShutdown) and gives their leases
// back with the fenced release, waits up to ShutdownGrace for their handlers to return,
// and deregisters. A handler that ignores its context can still not write: its lease is
// released. Stop returns an error if such handlers were still running at the end.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if w.state == stateStarting {
		w.mu.Unlock()
		return errors.New("stop worker: Start has not returned yet")
	}
	if w.state != stateStarted {
		w.mu.Unlock()
		return nil
	}
	w.state = stateStopping
	w.mu.Unlock()

	w.claimCancel()
	w.claimWG.Wait()

	done := make(chan struct{})
	go func() { w.execWG.Wait(); close(done) }()
	var result error
	select {
	case <-done:
	case <-ctx.Done():
		w.releaseAll()
		grace := time.NewTimer(w.cfg.ShutdownGrace)
		select {
		case <-done:
		case <-grace.C:
			result = fmt.Errorf("stop worker %s: handlers still running %s after cancellation (their leases were released)",
				w.cfg.ID, w.cfg.ShutdownGrace)
		}
		grace.Stop()
	}
	// Wait for the execution goroutines only when every handler returned.
	w.runners.stop(result == nil)
	close(w.completeDone)
	w.completerWG.Wait()
	w.bgCancel()
	w.bgWG.Wait()
	// A handler still running here ignored its cancellation; cancel whatever is left.
	w.mu.Lock()
	for _, e := range w.execs {
		e.cancel(ErrShutdown)
	}
	w.mu.Unlock()

	dctx, cancel := context.WithTimeout(context.Background(), w.cfg.WriteTimeout)
	defer cancel()
	w.regMu.Lock() // after any AddQueue or RemoveQueue writing the row
	if err := store.DeregisterWorker(dctx, w.pool, w.cfg.ID); err != nil {
		w.log.Warn("deregister worker", "err", err)
	}
	w.regMu.Unlock()
	w.mu.Lock()
	w.state = stateStopped
	w.mu.Unlock()
	w.log.Info("worker stopped")
	return result
}

// Run starts the worker, blocks until ctx is done, then stops it, giving running jobs
// shutdownTimeout to finish.
func (w *Worker) Run(ctx context.Context, shutdownTimeout time.Duration) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return w.Stop(sctx)
}

// releaseAll cancels every running job and releases its lease, fenced.
func (w *Worker) releaseAll() {
	w.mu.Lock()
	execs := make([]*execution, 0, len(w.execs))
	for _, e := range w.execs {
		execs = append(execs, e)
	}
	w.mu.Unlock()
	for _, e := range execs {
		if !e.markReleased() {
			continue
		}
		e.cancel(ErrShutdown)
		ctx, cancel := context.WithTimeout(context.Background(), w.cfg.WriteTimeout)
		err := w.fencedWrite(ctx, e, "release", func(ctx context.Context) error {
			return store.Release(ctx, w.pool, e.lease)
		})
		cancel()
		if err != nil {
			w.log.Warn("release lease on shutdown", "job_id", e.lease.JobID, "lease_gen", e.lease.Gen, "err", err)
		} else {
			w.log.Info("released lease on shutdown", "job_id", e.lease.JobID, "lease_gen", e.lease.Gen)
		}
	}
}

// RunningJobs returns the leases this worker holds now.
func (w *Worker) RunningJobs() []queue.Lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]queue.Lease, 0, len(w.execs))
	for _, e := range w.execs {
		out = append(out, e.lease)
	}
	return out
}

func (w *Worker) runQueue(ctx context.Context, ql *queueLoop) {
	defer w.claimWG.Done()
	defer close(ql.done)
	poll := time.NewTicker(w.cfg.PollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ql.stop:
			return
		default:
		}
		full := w.claimOnce(ctx, ql)
		if full && ctx.Err() == nil {
			continue // there may be more: claim again at once
		}
		select {
		case <-ctx.Done():
			return
		case <-ql.stop:
			return
		case <-ql.wake:
		case <-poll.C:
		}
	}
}

// claimConcurrency is how many claim statements a worker runs at once across its
// queues: half of the pool's connections, at least one. Every queue has a claim loop of
// its own, and a worker serving many small queues would otherwise fill the pool with
// claims: the completer and the heartbeat would wait behind them for a connection,
// slots would stay taken by jobs whose completions cannot be queued, and each freed
// slot would cost a claim of one job. A loop that waits for its turn counts its free
// slots once it has it, so the slots freed meanwhile go into one claim.
func claimConcurrency(pool *pgxpool.Pool) int {
	return max(1, int(pool.Config().MaxConns)/2)
}

// claimOnce claims up to the free slots of a queue and starts the jobs. It reports
// whether it filled the batch it asked for.
//
// One claim takes at most half of the queue's slots, so that under load the next claim
// runs while the completions of the previous batch are being written: a claim allowed
// to fill every slot would make claiming and completing alternate instead of overlap.
func (w *Worker) claimOnce(ctx context.Context, ql *queueLoop) bool {
	select {
	case w.claimTurns <- struct{}{}:
	case <-ctx.Done():
		return false
	case <-ql.stop:
		return false
	}
	defer func() { <-w.claimTurns }()
	w.mu.Lock()
	maxWorkers := ql.max
	free := maxWorkers - w.running[ql.name]
	ql.starved = free <= 0
	w.mu.Unlock()
	limit := min(free, w.cfg.ClaimBatchSize, (maxWorkers+1)/2)
	if limit <= 0 {
		return false
	}
	sent := time.Now()
	// Under a backlog (the last claim was full), claim after the position where the last
	// claim ended, so the claim does not walk the dead index entries of the jobs claimed
	// before it: a claim from the start reads every one of them until VACUUM removes
	// them, and none can be removed while an old transaction holds the horizon. Without
	// a backlog, claim after the floor (jobs of other kinds at the head), if any. Jobs
	// that become available behind the cursor or the floor are claimed from the start
	// of the order, which happens at least once per PollInterval and whenever there is
	// neither.
	after := ql.cursor
	if after == nil {
		after = ql.floor
	}
	behind := after == nil || sent.Sub(ql.lookedBehind) >= w.cfg.PollInterval
	if behind {
		after = nil
	}
	rows, err := store.Claim(ctx, w.pool, store.ClaimParams{
		Queue: ql.name, WorkerID: w.cfg.ID, Limit: limit, Lease: w.cfg.LeaseDuration, After: after, Kinds: w.kinds})
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("claim failed", "queue", ql.name, "err", err)
		}
		return false
	}
	if behind {
		ql.cursor, ql.lookedBehind = nil, sent
	}
	switch c := store.CursorAfter(rows); {
	case len(rows) < limit:
		// No backlog: the next claim starts from the beginning again. Jobs inserted
		// concurrently can commit after a later one was claimed, behind the cursor; a
		// cursor kept here would leave them waiting for the next look behind (up to
		// PollInterval).
		ql.cursor = nil
	case ql.cursor == nil || ql.cursor.Less(*c):
		ql.cursor = c
	}
	if behind && len(rows) < limit {
		w.findFloor(ctx, ql, rows, sent)
	}
	for _, row := range rows {
		w.startExecution(row, sent)
	}
	return len(rows) == limit
}

// findFloor looks, after a short claim from the start of the order, for jobs of kinds
// this worker has no handler for ahead of the first job it claimed (or anywhere, when it
// claimed none): the claim stepped over them one by one, and every claim from the start
// would again. The last of them becomes the queue's floor. It looks at most once per
// PollInterval, and a queue without such jobs keeps no floor, so the claims of a worker
// that knows every kind in its queues are what they were without it.
func (w *Worker) findFloor(ctx context.Context, ql *queueLoop, rows []*queue.JobRow, sent time.Time) {
	if sent.Sub(ql.checkedFloor) < w.cfg.PollInterval && ql.floor == nil {
		return
	}
	ql.checkedFloor = sent
	fctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
	floor, err := store.OtherKindAhead(fctx, w.pool, ql.name, w.kinds, store.CursorBefore(rows))
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("look for jobs of other kinds failed", "queue", ql.name, "err", err)
		}
		return
	}
	if floor != nil && ql.floor == nil {
		w.log.Info("jobs of kinds this worker has no handler for wait ahead in the queue; claiming after them",
			"queue", ql.name, "last_id", floor.ID)
	}
	ql.floor = floor
}

// queueNamesLocked returns the served queues, sorted. w.mu must be held.
func (w *Worker) queueNamesLocked() []string {
	names := make([]string, 0, len(w.queues))
	for n := range w.queues {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// register records this process in fenceq_workers (again, if its row was removed) with
// the queues it serves now and the kinds it claims.
func (w *Worker) register(ctx context.Context) error {
	w.regMu.Lock()
	defer w.regMu.Unlock()
	w.mu.Lock()
	names := w.queueNamesLocked()
	w.mu.Unlock()
	return w.registerQueues(ctx, names)
}

// registerQueues writes the worker's row with queues. w.regMu must be held.
func (w *Worker) registerQueues(ctx context.Context, queues []string) error {
	host, _ := os.Hostname()
	return store.RegisterWorker(ctx, w.pool, w.cfg.ID, host, os.Getpid(), queues, w.kinds)
}
