package fenceq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// runHeartbeat renews every lease the worker holds, in one statement per interval, and
// cancels the context of each job whose lease the database reports lost.
func (w *Worker) runHeartbeat(ctx context.Context) {
	defer w.bgWG.Done()
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.heartbeatOnce(ctx)
		}
	}
}

func (w *Worker) heartbeatOnce(ctx context.Context) {
	w.mu.Lock()
	execs := make(map[leaseKey]*execution, len(w.execs))
	leases := make([]queue.Lease, 0, len(w.execs))
	for k, e := range w.execs {
		if e.lostReported {
			continue // a heartbeat found it lost already: its handler is stopping
		}
		execs[k] = e
		leases = append(leases, e.lease)
	}
	w.mu.Unlock()

	sent := time.Now()
	hctx, cancel := context.WithTimeout(ctx, min(w.cfg.WriteTimeout, w.cfg.HeartbeatInterval))
	res, err := store.Heartbeat(hctx, w.pool, w.cfg.ID, leases, w.cfg.LeaseDuration)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.hooks.heartbeatFailed(ctx, err)
			w.log.Warn("heartbeat failed; jobs are cancelled if no renewal is confirmed before their local deadline",
				"leases", len(leases), "err", err)
		}
		return
	}
	// res.Finished needs nothing: the job's own write ended the lease, and its
	// execution is about to finish (or just did).
	for _, l := range res.Renewed {
		execs[keyOf(l)].extend(sent)
	}
	if len(res.Lost) > 0 {
		w.mu.Lock()
		for _, l := range res.Lost {
			execs[keyOf(l)].lostReported = true
		}
		w.mu.Unlock()
		for _, l := range res.Lost {
			e := execs[keyOf(l)]
			// The job stops at once; the hooks are told below, once the lost lease is
			// recorded, and before they hear that the attempt ended.
			e.holdFinish()
			e.cancel(queue.ErrLeaseLost)
		}
		ectx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
		alive, err := store.RecordLeasesLost(ectx, w.pool, w.cfg.ID, res.Lost)
		cancel()
		if err != nil {
			w.log.Warn("record lost leases", "err", err)
		}
		aliveSet := map[int64]bool{}
		for _, id := range alive {
			aliveSet[id] = true
		}
		for _, l := range res.Lost {
			e := execs[keyOf(l)]
			w.hooks.leaseLost(e.hookCtx(), e.row, aliveSet[l.JobID])
			e.releaseFinish()
			if aliveSet[l.JobID] {
				w.log.Error("lease expired while its holder was still running the job; job cancelled here",
					"job_id", l.JobID, "lease_gen", l.Gen, "kind", e.row.Kind)
			} else {
				w.log.Warn("lease lost; job cancelled here", "job_id", l.JobID, "lease_gen", l.Gen)
			}
		}
	}
	if stale := w.rowStale.Swap(false); !res.WorkerRegistered || stale {
		if !res.WorkerRegistered {
			w.log.Warn("worker row missing from fenceq_workers; registering again")
		}
		rctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
		if err := w.register(rctx); err != nil {
			w.rowStale.Store(true)
			w.log.Warn("register worker", "err", err)
		}
		cancel()
	}
}

func (w *Worker) enqueueCompletion(e *execution) {
	w.complete <- e
}

// runCompleter writes completions in batches: it takes what is waiting, up to
// CompleteBatchSize, and completes it in one fenced statement.
func (w *Worker) runCompleter() {
	defer w.completerWG.Done()
	batch := make([]*execution, 0, w.cfg.CompleteBatchSize)
	for {
		select {
		case e := <-w.complete:
			batch = append(batch[:0], e)
		case <-w.completeDone:
			// Stop closes completeDone once no handler can queue a completion any more:
			// every execution finished, or ShutdownGrace passed after the rest were
			// released (a released execution queues nothing).
			return
		}
	fill:
		for len(batch) < w.cfg.CompleteBatchSize {
			select {
			case e := <-w.complete:
				batch = append(batch, e)
			default:
				break fill
			}
		}
		w.flushCompletions(batch)
	}
}

func (w *Worker) flushCompletions(batch []*execution) {
	leases := make([]queue.Lease, len(batch))
	// outputs stays nil unless a job of the batch recorded output. The executions are
	// sealed (their handlers returned before they were queued), so output is final.
	var outputs [][]byte
	moving := true
	for i, e := range batch {
		leases[i] = e.lease
		moving = moving && store.MovesOutOnCompletion(e.row)
		if e.output != nil {
			if outputs == nil {
				outputs = make([][]byte, len(batch))
			}
			outputs[i] = e.output
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.WriteTimeout)
	complete := store.CompleteManyWithOutputs
	if moving {
		// No job of the batch keeps its unique key once completed: each one moves to
		// history, and the statement leaves out the arm that would update one in place.
		complete = store.CompleteManyMoving
	}
	lost, err := complete(ctx, w.pool, w.cfg.ID, leases, outputs)
	cancel()
	if err != nil {
		// Outcome unknown: settle each one on its own, looking before writing again. The
		// batch may have committed with only its reply lost: completing a job that it
		// completed would be rejected and recorded as a stale write.
		w.log.Warn("batched completion failed; completing one by one", "jobs", len(batch), "err", err)
		for _, e := range batch {
			lctx, cancel := context.WithTimeout(context.Background(), w.cfg.WriteTimeout)
			state, landed, lerr := store.Landed(lctx, w.pool, e.lease)
			cancel()
			if lerr == nil && landed && state == queue.StateCompleted {
				e.finish(OutcomeCompleted, nil)
				continue
			}
			werr := w.fencedWrite(context.Background(), e, "complete", func(ctx context.Context) error {
				return store.CompleteWithOutput(ctx, w.pool, e.lease, e.output)
			})
			switch {
			case werr == nil:
				e.finish(OutcomeCompleted, nil)
			case errors.Is(werr, queue.ErrLeaseLost):
				e.finish(OutcomeLeaseLost, werr)
			default:
				w.log.Error("could not complete job; the lease will expire and the job run again",
					"job_id", e.lease.JobID, "err", werr)
				e.finish(OutcomeUnknown, werr)
			}
		}
		return
	}
	var lostSet map[leaseKey]bool // nil (nothing lost) in the common case
	for _, l := range lost {
		if lostSet == nil {
			lostSet = make(map[leaseKey]bool, len(lost))
		}
		lostSet[keyOf(l)] = true
	}
	for _, e := range batch {
		if !lostSet[keyOf(e.lease)] {
			e.finish(OutcomeCompleted, nil)
			continue
		}
		w.hooks.staleWriteRejected(e.hookCtx(), e.row, "complete")
		w.log.Warn("completion rejected: lease lost", "job_id", e.lease.JobID, "lease_gen", e.lease.Gen)
		e.finish(OutcomeLeaseLost, fmt.Errorf("complete job %d at lease generation %d: %w", e.lease.JobID, e.lease.Gen, queue.ErrLeaseLost))
	}
}

// runMaintenance runs the reaper and the scheduler every ReaperInterval, the job
// counters' roll-up every CountersInterval (unless negative) and retention every
// PruneInterval. Every worker runs it; all its statements are safe to run concurrently
// (SKIP LOCKED and compare-and-set on the generation).
func (w *Worker) runMaintenance(ctx context.Context) {
	defer w.bgWG.Done()
	reap := time.NewTicker(w.cfg.ReaperInterval)
	defer reap.Stop()
	prune := time.NewTicker(w.cfg.PruneInterval)
	defer prune.Stop()
	var counters <-chan time.Time
	if w.cfg.CountersInterval > 0 {
		t := time.NewTicker(w.cfg.CountersInterval)
		defer t.Stop()
		counters = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-reap.C:
			w.reapOnce(ctx)
			w.extendHistory(ctx)
			if err := w.checkFlow(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn("flow limits check failed", "err", err)
			}
		case <-counters:
			w.rollupOnce(ctx)
		case <-prune.C:
			w.pruneOnce(ctx)
		}
	}
}

// reapOnce revokes expired leases and promotes due jobs now. The worker does this every
// ReaperInterval.
func (w *Worker) reapOnce(ctx context.Context) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
		revs, err := store.Reap(rctx, w.pool, store.ReapParams{Limit: w.cfg.ReapBatchSize, HolderFresh: w.cfg.HolderFreshness})
		cancel()
		if err != nil {
			w.log.Warn("reaper failed", "err", err)
			break
		}
		for _, r := range revs {
			w.hooks.leaseRevoked(ctx, r)
			if r.HolderAlive {
				w.log.Error("lease expired while its holder process was alive; revoked",
					"job_id", r.JobID, "lease_gen", r.Gen, "holder", r.Holder, "kind", r.Kind, "now", r.State)
			} else {
				w.log.Warn("lease expired; revoked", "job_id", r.JobID, "lease_gen", r.Gen,
					"holder", r.Holder, "kind", r.Kind, "now", r.State)
			}
		}
		if len(revs) < w.cfg.ReapBatchSize {
			break
		}
	}
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
		n, err := store.PromoteDue(pctx, w.pool, w.cfg.ReapBatchSize)
		cancel()
		if err != nil {
			w.log.Warn("scheduler failed", "err", err)
			break
		}
		if n < int64(w.cfg.ReapBatchSize) {
			break
		}
	}
}

// History's partitions are made historyAhead ids past the last id taken, once the
// jobs a worker starts come within historyMargin of the first id they do not hold: a
// worker that keeps up makes them about once per historyAhead - historyMargin jobs, and
// one that runs no jobs never asks. A job whose id they do not hold still finishes, into
// the default partition (migration 000023).
const (
	historyAhead  = 4_000_000
	historyMargin = 2_000_000
)

// extendHistory makes history's partitions ahead of the jobs this worker runs
// (store.ExtendHistory) when the highest id it has started comes within historyMargin
// of the first id they do not hold.
func (w *Worker) extendHistory(ctx context.Context) {
	w.mu.Lock()
	top := w.topID
	w.mu.Unlock()
	if top == 0 || top+historyMargin < w.historyTo {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
	defer cancel()
	to, partitioned, err := store.ExtendHistory(hctx, w.pool, historyAhead)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			w.log.Warn("making history partitions failed", "err", err)
		}
	case !partitioned:
		w.historyTo = math.MaxInt64
	default:
		w.historyTo = to
	}
}

// rollupOnce adds the jobs finished since the last roll-up to the job counters the
// dashboard reads (store.RollupCounts). Every worker tries every CountersInterval; one
// at a time counts, the others skip.
func (w *Worker) rollupOnce(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
	defer cancel()
	if _, err := store.RollupCounts(rctx, w.pool); err != nil && ctx.Err() == nil {
		w.log.Warn("job counter roll-up failed", "err", err)
	}
}

// pruneOnce runs retention now: finished jobs, old lease events and stale worker rows.
// First it moves to history the finished jobs still in the hot set (on Citus every job
// is finished in place; see store.MoveFinished).
func (w *Worker) pruneOnce(ctx context.Context) {
	for ctx.Err() == nil {
		mctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
		n, err := store.MoveFinished(mctx, w.pool, w.cfg.PruneBatchSize)
		cancel()
		if err != nil {
			w.log.Warn("moving finished jobs to history failed", "err", err)
			break
		}
		if n < int64(w.cfg.PruneBatchSize) {
			break
		}
	}
	if w.cfg.RetentionPeriod > 0 {
		pruned := int64(0)
		for ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
			n, err := store.PruneFinished(pctx, w.pool, w.cfg.RetentionPeriod, w.cfg.PruneBatchSize)
			cancel()
			if err != nil {
				w.log.Warn("retention failed", "err", err)
				break
			}
			pruned += n
			if n < int64(w.cfg.PruneBatchSize) {
				break
			}
		}
		// Retention may have emptied a partition of history: dropping it returns its
		// space at once, where the deleted rows' space waits for vacuum.
		if pruned > 0 && ctx.Err() == nil {
			dctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
			if _, err := store.DropEmptiedHistory(dctx, w.pool); err != nil && ctx.Err() == nil {
				w.log.Warn("dropping emptied history partitions failed", "err", err)
			}
			cancel()
		}
	}
	pctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
	defer cancel()
	if _, err := store.PruneLeaseEvents(pctx, w.pool, w.cfg.LeaseEventRetention, w.cfg.PruneBatchSize); err != nil {
		w.log.Warn("lease event retention failed", "err", err)
	}
	if _, err := store.DeleteStaleWorkers(pctx, w.pool, w.cfg.StaleWorkerAge); err != nil {
		w.log.Warn("stale worker cleanup failed", "err", err)
	}
}

// runPeriodic runs a scheduling pass every PeriodicInterval, and earlier when a slot
// falls due sooner. The wait is computed from the database's time the pass read and
// slept on the monotonic clock: no decision uses the worker's wall clock.
func (w *Worker) runPeriodic(ctx context.Context) {
	defer w.bgWG.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wait, err := w.periodicPass(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("periodic scheduling pass failed; trying again", "in", w.cfg.PeriodicInterval, "err", err)
			wait = w.cfg.PeriodicInterval
		}
		t.Reset(min(max(wait, minPeriodicWait), w.cfg.PeriodicInterval))
	}
}

// minPeriodicWait keeps a pass that found a slot due in a moment from spinning; a
// slot woken for is due by the time the next pass reads the database's clock, or this
// much later.
const minPeriodicWait = 2 * time.Millisecond

// skippedSlots are the slots of one schedule a pass skipped for no overlap.
type skippedSlots struct {
	name string
	o    store.PeriodicOutcome
}

// periodicPass runs one scheduling pass (see planPass) in one transaction and returns
// how long until the next slot of any schedule is due.
func (w *Worker) periodicPass(ctx context.Context) (time.Duration, error) {
	// The lock may be held by a pass whose worker paused; the server disconnects such
	// a session after PeriodicGrace/2 idle in its transaction.
	pctx, cancel := context.WithTimeout(ctx, w.cfg.PeriodicGrace+w.cfg.WriteTimeout)
	defer cancel()
	tx, err := w.pool.Begin(pctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	hb, err := store.LockPeriodicClock(pctx, tx, w.cfg.PeriodicGrace/2)
	if err != nil {
		return 0, err
	}
	now, due, err := store.ReadDuePeriodic(pctx, tx)
	if err != nil {
		return 0, err
	}
	plan := planPass(now, hb, w.periodicSince, w.cfg.PeriodicGrace, due, w.schedules.parse)
	enqueued := make(map[string]int, len(plan.enqueues))
	var skipped []skippedSlots
	for _, e := range plan.enqueues {
		o, err := store.EnqueuePeriodic(pctx, tx, e)
		if err != nil {
			return 0, err
		}
		if !o.Matched {
			// Removed, paused or redefined since it was read: the next pass reads it again.
			w.log.Debug("periodic schedule changed during the pass; nothing enqueued", "name", e.Name)
			continue
		}
		enqueued[e.Name] += int(o.Inserted)
		if o.Skipped > 0 {
			skipped = append(skipped, skippedSlots{name: e.Name, o: o})
		}
	}
	for _, j := range plan.onStart {
		ok, err := store.EnqueueOnStart(pctx, tx, j.name, []byte(j.meta))
		if err != nil {
			return 0, err
		}
		if ok {
			enqueued[j.name]++
		}
	}
	if err := store.TouchPeriodicClock(pctx, tx, now); err != nil {
		return 0, err
	}
	if err := tx.Commit(pctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	for name, n := range enqueued {
		if n > 0 {
			w.hooks.periodicEnqueued(pctx, name, n)
		}
	}
	for _, sk := range skipped {
		if sk.o.Unfinished != 0 {
			w.log.Info("periodic slot skipped: a job of the schedule is unfinished (no overlap)", "name", sk.name,
				"slots", sk.o.Skipped, "newest", sk.o.SkippedSlot, "unfinished_job", sk.o.Unfinished)
		} else {
			w.log.Info("periodic slots skipped: they would overlap the job just enqueued (no overlap)", "name", sk.name,
				"slots", sk.o.Skipped, "newest", sk.o.SkippedSlot)
		}
		w.hooks.periodicSkipped(pctx, sk.name, int(sk.o.Skipped))
	}
	for name, err := range plan.broken {
		w.log.Error("periodic schedule cannot be parsed; it enqueues nothing", "name", name, "err", err)
	}
	for name, p := range plan.passedOver {
		msg := "periodic slots fell due while every worker was down; passed over by the schedule's missed policy"
		if p.capped {
			msg = "periodic slots past the catch-up bound; passed over by the schedule's missed policy"
		}
		w.log.Warn(msg, "name", name, "newest", p.newest, "grace", w.cfg.PeriodicGrace)
	}
	// A clock never touched (hb nil) means this is the database's first pass: nothing
	// resumed, as nothing ran before.
	if hb != nil && now.Sub(*hb) > w.cfg.PeriodicGrace {
		w.log.Info("periodic scheduling resumed after every worker was down", "last_pass", *hb)
	}
	if plan.nextDue.IsZero() {
		return w.cfg.PeriodicInterval, nil
	}
	return plan.nextDue.Sub(now), nil
}
