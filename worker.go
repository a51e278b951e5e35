package fenceq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
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

	mu      sync.Mutex
	execs   map[leaseKey]*execution // by (job id, generation): a job revoked here may be re-claimed here
	running map[string]int          // per queue: handlers running or settling (a success frees its slot once its completion is queued)
	state   lifecycle
	queues  map[string]*queueState
	// order is the queues sorted by name: the claim loop's round robin.
	order    []*queueState
	complete chan *execution

	// claimWake wakes the claim loop (a queue became dirty).
	claimWake chan struct{}
	// inRound holds a value while the claim loop runs a round, from choosing its queues
	// to starting the jobs claimed; RemoveQueue puts one in to wait for a round that
	// may claim from the queue it removed.
	inRound chan struct{}
	// rotate is where the claim loop's next round starts in order, so that when a
	// round cannot take every dirty queue (ClaimBatchSize) the next takes the rest
	// first. Guarded by mu.
	rotate int
	// wantFloor are the queues waiting for findFloors, and floorsChecked when it last
	// looked. Only the claim loop touches them.
	wantFloor     []*queueState
	floorsChecked time.Time
	// flowOn is set while any flow limit exists (Config.FlowLimits, or found by the
	// maintenance pass): only then does a claim round also claim jobs under limits.
	// flowCursor is where the last flow claim's walk over the keys stopped, and
	// flowIdleAt when a flow claim last found nothing (the next waits a PollInterval
	// unless a wake-up comes first).
	flowOn atomic.Bool
	// limited are this worker's queues that have a limit (fenceq_queues.max_running),
	// as the maintenance pass last read them: claimed one by one under the queue's lock
	// (store.ClaimInQueueLimit). Guarded by mu.
	limited map[string]bool
	// topID is the highest id of a job this worker has started (guarded by mu), and
	// historyTo the first id history's partitions did not hold when the maintenance
	// pass last made them (only that pass touches it; math.MaxInt64 where history is
	// not partitioned).
	topID      int64
	historyTo  int64
	flowCursor *store.FlowCursor
	flowIdleAt time.Time
	flowKick   bool

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

// queueState is what the claim loop keeps of one served queue.
type queueState struct {
	name string
	// max, dirty and starved are guarded by Worker.mu.
	max int
	// dirty asks the claim loop to claim from the queue in its next round: a job was
	// announced in it, a freed slot ended its starvation, its last claim was full, its
	// concurrency changed, or it was just added. Every queue is claimed on each poll
	// tick besides.
	dirty bool
	// starved is set when the claim loop found no free slot; the next freed slot makes
	// the queue dirty and wakes the loop. Freed slots do not otherwise: a wake-up per
	// finished job would cost every job an empty claim besides its own.
	starved bool
	// cursor is where the last claim ended in claim order and lookedBehind when the
	// queue was last claimed from the start of the order. Only the claim loop touches
	// them.
	cursor       *store.ClaimCursor
	lookedBehind time.Time
	// floor is the last job of a kind this worker has no handler for that a look from
	// the start of the order found ahead of the jobs it could claim, and checkedFloor
	// when it was last looked for. Claims that would start from the start start after
	// the floor instead, except the look behind, so a queue whose head holds jobs of
	// other kinds is walked once per PollInterval, not by every claim. floorBefore is
	// set, when a short claim from the start wants the floor looked for, to the first
	// job it claimed (nil for none); floorWanted says so. Only the claim loop touches
	// them.
	floor        *store.ClaimCursor
	checkedFloor time.Time
	floorWanted  bool
	floorBefore  *store.ClaimCursor
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
		log:       cfg.Logger.With("worker", cfg.ID),
		execs:     map[leaseKey]*execution{},
		running:   map[string]int{},
		queues:    map[string]*queueState{},
		runners:   newRunners(runnerIdle),
		complete:  make(chan *execution, cfg.CompleteBatchSize),
		claimWake: make(chan struct{}, 1),
		inRound:   make(chan struct{}, 1),
		kinds:     cfg.Handlers.Kinds(),
	}
	slices.Sort(w.kinds)
	if w.periodic, err = cfg.periodicParams(); err != nil {
		return nil, err
	}
	if len(cfg.InsertMiddleware) > 0 {
		w.inserter = NewInserter(cfg.InsertMiddleware...)
	}
	for name, q := range cfg.Queues {
		w.queues[name] = &queueState{name: name, max: q.MaxWorkers}
	}
	w.reorderLocked()
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
	if err == nil {
		err = w.setFlowLimits(ctx)
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
					qs := w.queues[q]
					if qs != nil {
						qs.dirty = true
					}
					w.mu.Unlock()
					if qs != nil {
						w.kickFlow()
						w.wakeClaims()
					}
				},
				OnConnect: func() {
					w.mu.Lock()
					for _, qs := range w.queues {
						qs.dirty = true
					}
					w.mu.Unlock()
					w.wakeClaims()
				},
				OnError: func(err error) { w.log.Warn("job wake-ups interrupted; polling meanwhile", "err", err) },
			})
		}()
	}
	w.claimWG.Add(1)
	go w.runClaims(claimCtx)
	w.mu.Lock()
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

// wakeClaims wakes the claim loop if it waits.
func (w *Worker) wakeClaims() {
	select {
	case w.claimWake <- struct{}{}:
	default:
	}
}

// reorderLocked rebuilds order from queues. w.mu must be held.
func (w *Worker) reorderLocked() {
	order := make([]*queueState, 0, len(w.queues))
	for _, qs := range w.queues {
		order = append(order, qs)
	}
	slices.SortFunc(order, func(a, b *queueState) int { return strings.Compare(a.name, b.name) })
	w.order = order
}

// runClaims is the worker's claim loop: one goroutine claims for every queue the worker
// serves, with one statement per round whatever the number of queues. A round claims
// from the dirty queues, and from every queue on each PollInterval tick, so that a lost
// wake-up delays work by at most PollInterval; a round after which there may be more to
// claim is followed by another at once.
func (w *Worker) runClaims(ctx context.Context) {
	defer w.claimWG.Done()
	poll := time.NewTicker(w.cfg.PollInterval)
	defer poll.Stop()
	all := true
	for {
		select {
		case <-poll.C: // a tick that fell due during a backlog
			all = true
		default:
		}
		again := w.claimRound(ctx, all)
		all = false
		if ctx.Err() != nil {
			return
		}
		if again {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-w.claimWake:
		case <-poll.C:
			all = true
		}
	}
}

// rotateAfter returns the position in order after qs (its name's place when it has
// left). w.mu must be held.
func (w *Worker) rotateAfter(qs *queueState) int {
	i, _ := slices.BinarySearchFunc(w.order, qs.name, func(e *queueState, name string) int {
		return strings.Compare(e.name, name)
	})
	if i < len(w.order) && w.order[i] == qs {
		i++
	}
	return i
}

// claimPick is a queue of a claim round and the most jobs to claim from it.
type claimPick struct {
	qs     *queueState
	limit  int
	behind bool // claimed from the start of the order
}

// claimRound claims, in one statement, from the queues that are dirty (every queue when
// all is set) up to their free slots, and starts the jobs. It reports whether another
// round should follow at once: a queue's claim came back full (there may be more), or
// the statement stopped at ClaimBatchSize before some queues.
//
// A queue's claim takes at most its free slots, at most ClaimBatchSize and at most half
// of its MaxWorkers, so that under load the next claim runs while the completions of
// the previous batch are being written: a claim allowed to fill every slot would make
// claiming and completing alternate instead of overlap. The statement lists every
// dirty queue with a free slot, however many, and takes at most ClaimBatchSize jobs in
// all, visiting the queues from after the last one the previous round took jobs from,
// so that no queue waits behind the others. Capping the jobs rather than the sum of the
// queues' limits keeps an idle poll one statement whatever the number of queues. A
// queue without a free slot is left out and marked starved: its next freed slot makes
// it dirty again.
func (w *Worker) claimRound(ctx context.Context, all bool) bool {
	select {
	case w.inRound <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-w.inRound }()

	var picks []claimPick
	w.mu.Lock()
	n := len(w.order)
	start := 0
	if n > 0 {
		start = w.rotate % n
	}
	if all {
		for _, qs := range w.order {
			qs.dirty = true
		}
	}
	for i := range n {
		k := (start + i) % n
		qs := w.order[k]
		if !qs.dirty {
			continue
		}
		qs.dirty = false
		free := qs.max - w.running[qs.name]
		qs.starved = free <= 0
		if free <= 0 {
			continue
		}
		picks = append(picks, claimPick{qs: qs, limit: min(free, w.cfg.ClaimBatchSize, (qs.max+1)/2)})
	}
	w.mu.Unlock()
	if len(picks) == 0 {
		return false
	}

	sent := time.Now()
	var limitedRows []*queue.JobRow
	picks, limitedRows = w.claimLimited(ctx, picks)
	claims := make([]store.QueueClaim, len(picks))
	for i := range picks {
		p := &picks[i]
		qs := p.qs
		// Under a backlog (the last claim was full), claim after the position where the
		// last claim ended, so the claim does not walk the dead index entries of the
		// jobs claimed before it: a claim from the start reads every one of them until
		// VACUUM removes them, and none can be removed while an old transaction holds
		// the horizon. Without a backlog, claim after the floor (jobs of other kinds at
		// the head), if any. Jobs that become available behind the cursor or the floor
		// are claimed from the start of the order, which happens at least once per
		// PollInterval and whenever there is neither.
		after := qs.cursor
		if after == nil {
			after = qs.floor
		}
		p.behind = after == nil || sent.Sub(qs.lookedBehind) >= w.cfg.PollInterval
		if p.behind {
			after = nil
		}
		claims[i] = store.QueueClaim{Name: qs.name, Limit: p.limit, After: after}
	}
	rows, err := store.ClaimMany(ctx, w.pool, store.ClaimManyParams{
		WorkerID: w.cfg.ID, Lease: w.cfg.LeaseDuration, Kinds: w.kinds, Queues: claims, Max: w.cfg.ClaimBatchSize})
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("claim failed", "queues", len(claims), "err", err)
		}
		return false
	}
	byQueue := make(map[string][]*queue.JobRow, len(picks))
	for _, r := range rows {
		byQueue[r.Queue] = append(byQueue[r.Queue], r)
	}
	// A statement that took ClaimBatchSize jobs may have stopped before some queues: a
	// queue that got fewer than its limit is then claimed again in the next round, as
	// if it had come back full, and one that got none keeps its state as it was. The
	// next round starts after the last queue that got jobs.
	capped := len(rows) >= w.cfg.ClaimBatchSize
	again := false
	last := -1
	for i, p := range picks {
		qs, got := p.qs, byQueue[p.qs.name]
		if len(got) > 0 {
			last = i
		}
		if capped && len(got) < p.limit {
			again = true
			w.mu.Lock()
			qs.dirty = true
			w.mu.Unlock()
			if len(got) == 0 {
				continue
			}
			if p.behind {
				qs.cursor, qs.lookedBehind = nil, sent
			}
			if c := store.CursorAfter(got); qs.cursor == nil || qs.cursor.Less(*c) {
				qs.cursor = c
			}
			continue
		}
		if p.behind {
			qs.cursor, qs.lookedBehind = nil, sent
		}
		switch c := store.CursorAfter(got); {
		case len(got) < p.limit:
			// No backlog: the next claim starts from the beginning again. Jobs inserted
			// concurrently can commit after a later one was claimed, behind the cursor;
			// a cursor kept here would leave them waiting for the next look behind (up
			// to PollInterval).
			qs.cursor = nil
		case qs.cursor == nil || qs.cursor.Less(*c):
			qs.cursor = c
		}
		if p.behind && len(got) < p.limit && !qs.floorWanted &&
			(sent.Sub(qs.checkedFloor) >= w.cfg.PollInterval || qs.floor != nil) {
			qs.floorWanted = true
			w.wantFloor = append(w.wantFloor, qs)
		}
		if qs.floorWanted && p.behind && len(got) < p.limit {
			qs.floorBefore = store.CursorBefore(got)
		}
		if len(got) == p.limit {
			again = true
			w.mu.Lock()
			qs.dirty = true
			w.mu.Unlock()
		}
	}
	if last >= 0 {
		w.mu.Lock()
		w.rotate = w.rotateAfter(picks[last].qs)
		w.mu.Unlock()
	}
	if w.claimFlow(ctx, picks, byQueue, sent, &rows) {
		again = true
	}
	if len(limitedRows) > 0 {
		again = true
		rows = append(rows, limitedRows...)
	}
	for _, r := range rows {
		w.startExecution(r, sent)
	}
	w.findFloors(ctx, sent)
	return again
}

// claimFlow claims jobs under flow limits into the slots the ordinary claim of this
// round left free, appending them to rows; it reports whether it filled them (there may
// be more). It runs only while a flow limit exists, and after a flow claim that found
// nothing, not again within PollInterval unless a wake-up (a new job, a freed slot)
// came since.
func (w *Worker) claimFlow(ctx context.Context, picks []claimPick, byQueue map[string][]*queue.JobRow,
	sent time.Time, rows *[]*queue.JobRow) bool {
	if !w.flowOn.Load() {
		return false
	}
	w.mu.Lock()
	kicked := w.flowKick
	w.flowKick = false
	w.mu.Unlock()
	if !kicked && sent.Sub(w.flowIdleAt) < w.cfg.PollInterval {
		return false
	}
	claims := make([]store.QueueClaim, 0, len(picks))
	want := 0
	for _, p := range picks {
		if free := p.limit - len(byQueue[p.qs.name]); free > 0 {
			claims = append(claims, store.QueueClaim{Name: p.qs.name, Limit: free})
			want += free
		}
	}
	if want == 0 {
		return false
	}
	got, cursor, err := store.ClaimFlow(ctx, w.pool, store.ClaimFlowParams{WorkerID: w.cfg.ID, Lease: w.cfg.LeaseDuration,
		Kinds: w.kinds, Queues: claims, Max: min(want, w.cfg.ClaimBatchSize), After: w.flowCursor})
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("claim under flow limits failed", "queues", len(claims), "err", err)
		}
		return false
	}
	w.flowCursor = cursor
	if len(got) == 0 {
		w.flowIdleAt = sent
		return false
	}
	w.mu.Lock()
	for _, j := range got {
		if qs := w.queues[j.Queue]; qs != nil {
			qs.dirty = true
		}
	}
	w.mu.Unlock()
	*rows = append(*rows, got...)
	return true
}

// claimLimited claims from the picks whose queue has a limit, each in a transaction of
// its own under the queue's lock, and returns the other picks and the jobs claimed. A
// queue that gave jobs is claimed again in the next round.
func (w *Worker) claimLimited(ctx context.Context, picks []claimPick) ([]claimPick, []*queue.JobRow) {
	w.mu.Lock()
	limited := w.limited
	w.mu.Unlock()
	if len(limited) == 0 {
		return picks, nil
	}
	var rest []claimPick
	var rows []*queue.JobRow
	for _, p := range picks {
		if !limited[p.qs.name] {
			rest = append(rest, p)
			continue
		}
		got, err := store.ClaimInQueueLimit(ctx, w.pool, store.ClaimInQueueLimitParams{Queue: p.qs.name,
			WorkerID: w.cfg.ID, Lease: w.cfg.LeaseDuration, Kinds: w.kinds, Limit: p.limit, Flow: w.flowOn.Load()})
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("claim from a limited queue failed", "queue", p.qs.name, "err", err)
			}
			continue
		}
		if len(got) > 0 {
			w.mu.Lock()
			p.qs.dirty = true
			w.mu.Unlock()
		}
		rows = append(rows, got...)
	}
	return rest, rows
}

// kickFlow makes the next claim round claim jobs under flow limits even if the last
// flow claim found nothing: a job was enqueued, or a slot was freed.
func (w *Worker) kickFlow() {
	if w.flowOn.Load() {
		w.mu.Lock()
		w.flowKick = true
		w.mu.Unlock()
	}
}

// setFlowLimits sets Config.FlowLimits in the database and turns flow claims on when
// any limit exists.
func (w *Worker) setFlowLimits(ctx context.Context) error {
	for _, l := range w.cfg.FlowLimits {
		if err := store.SetFlowLimit(ctx, w.pool, l); err != nil {
			return err
		}
	}
	return w.checkFlow(ctx)
}

// checkFlow turns flow claims on while any flow limit exists, and off when none does,
// and reads which of the worker's queues have a limit.
func (w *Worker) checkFlow(ctx context.Context) error {
	w.mu.Lock()
	names := w.queueNamesLocked()
	w.mu.Unlock()
	limits, err := store.LimitedQueues(ctx, w.pool, names)
	if err != nil {
		return err
	}
	limited := make(map[string]bool, len(limits))
	for name := range limits {
		limited[name] = true
	}
	w.mu.Lock()
	w.limited = limited
	w.mu.Unlock()
	var on bool
	if err := w.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM fenceq_flow_limits)`).Scan(&on); err != nil {
		return fmt.Errorf("look for flow limits: %w", err)
	}
	if on && !w.flowOn.Load() {
		w.kickFlow()
	}
	w.flowOn.Store(on)
	return nil
}

// findFloors looks, for the queues whose claim from the start of the order came back
// short, for jobs of kinds this worker has no handler for ahead of the first job the
// claim took (anywhere, when it took none): the claim stepped over them one by one, and
// every claim from the start would again. The last of them becomes the queue's floor.
// One statement looks in every such queue, at most once per PollInterval, and a queue
// without such jobs keeps no floor, so the claims of a worker that knows every kind in
// its queues are what they were without it.
func (w *Worker) findFloors(ctx context.Context, now time.Time) {
	if len(w.wantFloor) == 0 || now.Sub(w.floorsChecked) < w.cfg.PollInterval {
		return
	}
	w.floorsChecked = now
	want := w.wantFloor
	w.wantFloor = nil
	look := make([]store.QueueBefore, len(want))
	for i, qs := range want {
		qs.floorWanted, qs.checkedFloor = false, now
		look[i] = store.QueueBefore{Name: qs.name, Before: qs.floorBefore}
	}
	fctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
	floors, err := store.OtherKindsAhead(fctx, w.pool, w.kinds, look)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("look for jobs of other kinds failed", "queues", len(look), "err", err)
		}
		return
	}
	for i, qs := range want {
		if floors[i] != nil && qs.floor == nil {
			w.log.Info("jobs of kinds this worker has no handler for wait ahead in the queue; claiming after them",
				"queue", qs.name, "last_id", floors[i].ID)
		}
		qs.floor = floors[i]
	}
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
