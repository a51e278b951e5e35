package fenceq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// execution is one attempt of one job under one lease.
type execution struct {
	w       *Worker
	row     *queue.JobRow
	lease   queue.Lease
	handler *handlerEntry
	cancel  context.CancelCauseFunc
	// jctx is the context handed to middleware and the handler: a cancellable context
	// (cancelled by cancel), answering also for the execution and the worker's
	// Inserter (see jobContext).
	jctx  jobContext
	start time.Time
	// deadline cancels the job when no renewal is confirmed in time (monotonic clock).
	deadline *time.Timer
	// deadlineAt is when deadline fires, under mu (Job.LeaseDeadline).
	deadlineAt time.Time

	mu        sync.Mutex
	committed bool // the handler's fenced Commit completed the job
	released  bool // Stop released the lease; write nothing more
	finished  bool
	slotFree  bool // the queue slot was given back before finish (see freeSlot)
	// lostReported is set, under Worker.mu, once a heartbeat found the lease lost:
	// later heartbeats leave it out, so the loss is recorded and told once.
	lostReported bool
	// completing: the handler succeeded and its completion is being queued for the
	// completer; Stop leaves it to the completer instead of releasing the lease.
	completing bool
	// sealed is set when the handler has returned: output is final from then on, and
	// the completion reads it without the lock.
	sealed  bool
	output  []byte          // recorded by RecordOutput, written with the completion
	workCtx context.Context // the innermost context middleware handed on (hookCtx)
	// While lostHold is set, the heartbeat that found the lease lost has yet to call
	// the LeaseLost hooks; finish leaves the JobFinished hooks to it (pending), so that
	// they are told of the lost lease before the attempt's end.
	lostHold bool
	pending  *AttemptResult
}

func (e *execution) markReleased() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	// A job whose handler succeeded (completion queued or being queued) is left to the
	// completer: releasing it would throw the finished work away.
	if e.released || e.finished || e.slotFree || e.completing {
		return false
	}
	e.released = true
	return true
}

// beginCompletion marks a successful attempt's completion as being queued, unless Stop
// released the lease first; it reports whether the completion may be queued.
func (e *execution) beginCompletion() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.released {
		return false
	}
	e.completing = true
	return true
}

func (e *execution) flags() (committed, released bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.committed, e.released
}

// seal marks the handler returned (RecordOutput refuses from then on) and returns the
// flags.
func (e *execution) seal() (committed, released bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sealed = true
	return e.committed, e.released
}

// extend moves the local lease deadline to sent + lease - margin, where sent is the
// monotonic time the confirmed renewal (or the claim) was sent.
func (e *execution) extend(sent time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.finished { // finished since the heartbeat's snapshot: its timer stays stopped
		return
	}
	e.deadlineAt = sent.Add(e.w.cfg.LeaseDuration - e.w.cfg.LeaseMargin)
	e.deadline.Reset(time.Until(e.deadlineAt))
}

// leaseDeadline returns the local lease deadline as of now.
func (e *execution) leaseDeadline() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.deadlineAt
}

func (e *execution) commit(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var fnErr error
	return e.commitWith(ctx, func(ctx context.Context, how store.LeaseTx) error {
		err := store.WithLease(ctx, e.w.pool, e.lease, how, func(ctx context.Context, tx pgx.Tx) error {
			fnErr = fn(ctx, tx)
			return fnErr
		})
		if fnErr != nil {
			return &fnError{err}
		}
		return err
	})
}

// fnError marks the error of a commit whose function failed: the transaction rolled
// back, so there is no outcome to look for.
type fnError struct{ err error }

func (e *fnError) Error() string { return e.err.Error() }
func (e *fnError) Unwrap() error { return e.err }

// commitWith runs one fenced commit of the job through run, which gets the LeaseTx to
// pass on, and settles its outcome: a lost lease is reported to the hooks, and an
// error that may hide a commit that landed (a lost reply) is looked up.
func (e *execution) commitWith(ctx context.Context, run func(ctx context.Context, how store.LeaseTx) error) error {
	w := e.w
	if _, released := e.flags(); released {
		return fmt.Errorf("commit job %d: lease released on shutdown: %w", e.lease.JobID, queue.ErrLeaseLost)
	}
	err := run(ctx, store.LeaseTx{Complete: true, Output: e.recordedOutput, MovesOut: store.MovesOutOnCompletion(e.row)})
	var fe *fnError
	switch {
	case err == nil:
	case errors.Is(err, queue.ErrLeaseLost):
		w.hooks.staleWriteRejected(e.hookCtx(), e.row, "commit")
		w.log.Warn("fenced commit rejected: lease lost", "job_id", e.lease.JobID, "lease_gen", e.lease.Gen, "kind", e.row.Kind)
		return err
	case errors.As(err, &fe):
		return fe.err
	default:
		// The outcome of COMMIT may be unknown (connection lost): look before retrying.
		state, landed, lerr := w.landedWithin(e.lease)
		if lerr != nil || !landed || state != queue.StateCompleted {
			return err
		}
		w.log.Info("fenced commit landed although its reply was lost", "job_id", e.lease.JobID)
	}
	e.mu.Lock()
	e.committed = true
	e.mu.Unlock()
	return nil
}

// landedWithin asks whether a write under the lease landed (the landed check), asking
// again while the database cannot answer — a primary failing over, a partition
// healing — for up to WriteTimeout. A COMMIT whose reply was lost is settled by
// looking, never by writing again, so it must not be given up on at the first refused
// connection.
func (w *Worker) landedWithin(l queue.Lease) (queue.State, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.WriteTimeout)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		state, landed, err := store.Landed(ctx, w.pool, l)
		if err == nil || errors.Is(err, queue.ErrNotFound) {
			return state, landed, err
		}
		select {
		case <-ctx.Done():
			return state, landed, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

func (w *Worker) startExecution(row *queue.JobRow, sent time.Time) {
	// Not a child of a worker-wide context: registering every job with one parent would
	// take the parent's lock and a map entry per job at start and at finish; Stop
	// cancels the jobs it has to one by one.
	e := w.newExecution(context.Background(), row, sent)
	w.runners.run(e.run)
}

// newExecution tracks a claimed job under its lease: its context (a child of parent),
// its local lease deadline, its queue slot. sent is the monotonic time the claim was
// sent.
func (w *Worker) newExecution(parent context.Context, row *queue.JobRow, sent time.Time) *execution {
	h := w.cfg.Handlers.m[row.Kind]
	e := &execution{w: w, row: row, lease: store.LeaseOf(row), handler: h, start: time.Now()}
	ctx, cancel := context.WithCancelCause(parent)
	e.cancel, e.jctx = cancel, jobContext{Context: ctx, e: e}
	e.deadlineAt = sent.Add(w.cfg.LeaseDuration - w.cfg.LeaseMargin)
	e.deadline = time.AfterFunc(time.Until(e.deadlineAt), func() {
		e.cancel(ErrLeaseDeadline)
	})
	w.mu.Lock()
	w.execs[keyOf(e.lease)] = e
	w.running[row.Queue]++
	w.topID = max(w.topID, row.ID)
	w.mu.Unlock()
	w.execWG.Add(1)
	w.hooks.jobStarted(&e.jctx, row)
	return e
}

func (e *execution) run() {
	trace, cause, err := e.call()
	e.settle(err, trace, cause)
}

// call runs the job's handler. It returns the handler's error, the stack trace of a
// panic, and why the handler's context ended, if it did.
func (e *execution) call() (trace string, cause, err error) {
	if e.handler == nil {
		return "", nil, fmt.Errorf("no handler registered for kind %q on worker %s", e.row.Kind, e.w.cfg.ID)
	}
	ctx := context.Context(&e.jctx)
	if t := e.handler.opts.Timeout; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, t, ErrJobTimeout)
		defer cancel()
	}
	err = func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				trace = string(debug.Stack())
				err = &PanicError{Value: r, Stack: trace}
			}
		}()
		return e.work(ctx)
	}()
	return trace, context.Cause(ctx), err
}

// settle writes the attempt's outcome under the lease. cause is why the handler's
// context ended, if it did.
func (e *execution) settle(err error, trace string, cause error) {
	w := e.w
	committed, released := e.seal()
	// Built only when something is logged: the common path (success) logs nothing.
	log := func() *slog.Logger {
		return w.log.With("job_id", e.lease.JobID, "lease_gen", e.lease.Gen, "kind", e.row.Kind, "queue", e.row.Queue)
	}

	switch {
	case committed:
		if err != nil {
			log().Warn("handler returned an error after its fenced commit; the job stays completed", "err", err)
		}
		e.finish(OutcomeCompleted, nil)
		return
	case released:
		e.finish(OutcomeReleased, nil)
		return
	case errors.Is(cause, queue.ErrLeaseLost) || errors.Is(err, queue.ErrLeaseLost):
		// Any write would be rejected; the job belongs to someone else now.
		log().Warn("job stopped: lease lost", "err", err)
		lost := err
		if !errors.Is(err, queue.ErrLeaseLost) {
			lost = cause
		}
		e.finish(OutcomeLeaseLost, lost)
		return
	case err == nil:
		// The handler is done: once the completion is queued (the queue is bounded, so a
		// slow completer holds the slots back), its slot may run the next job while the
		// completion waits for its batch. The lease stays tracked (and heartbeated) until
		// finish.
		if !e.beginCompletion() {
			e.finish(OutcomeReleased, nil) // Stop released the lease as the handler returned
			return
		}
		w.enqueueCompletion(e)
		e.freeSlot()
		return
	}
	e.settleFailure(err, trace, cause, log)
}

// settleFailure is settle for a handler that returned an error (or a snooze, wait or
// cancel request) under a lease it still holds: it records the outcome with a fenced
// write. It is apart from settle so that the targets of its errors.As calls, which
// escape, are allocated only when a handler fails.
func (e *execution) settleFailure(err error, trace string, cause error, log func() *slog.Logger) {
	w := e.w
	var snooze *snoozeError
	var wait *waitError
	var cancelE *cancelError
	var discard *discardError
	var panicE *PanicError
	if errors.As(err, &wait) && wait.bad != nil {
		// An invalid wait request fails the attempt like any other error.
		err = wait.bad
	}
	var outcome Outcome
	werr := w.fencedWrite(context.Background(), e, "settle", func(ctx context.Context) error {
		switch {
		case errors.As(err, &snooze):
			outcome = OutcomeSnoozed
			return store.Snooze(ctx, w.pool, e.lease, snooze.d)
		case errors.As(err, &wait):
			outcome = OutcomeWaiting
			_, werr := store.Wait(ctx, w.pool, e.lease, wait.p)
			return werr
		case errors.As(err, &cancelE):
			outcome = OutcomeCancelled
			return store.Cancel(ctx, w.pool, e.lease, err.Error())
		default:
			backoff, sinceAttempted := e.retryAfter()
			msg := err.Error()
			if cause != nil && !errors.Is(err, cause) {
				msg = fmt.Sprintf("%s (context: %v)", msg, cause)
			}
			state, ferr := store.Fail(ctx, w.pool, e.lease, store.FailParams{
				Err: msg, Trace: trace, Backoff: backoff, SinceAttempted: sinceAttempted,
				Discard: errors.As(err, &discard),
			})
			outcome = OutcomeRetried
			if state == queue.StateDiscarded {
				outcome = OutcomeDiscarded
			}
			return ferr
		}
	})
	res := err
	switch {
	case errors.Is(werr, queue.ErrLeaseLost):
		outcome, res = OutcomeLeaseLost, werr
	case werr != nil:
		log().Error("could not record the job's outcome; the lease will expire and the job run again", "err", werr)
		outcome, res = OutcomeUnknown, werr
	case outcome == OutcomeWaiting:
		log().Debug("job waits", "wait", err.Error())
	case errors.As(err, &panicE):
		log().Error("handler panicked", "panic", fmt.Sprint(panicE.Value), "outcome", outcome)
	default:
		log().Info("job attempt failed", "err", err, "attempt", e.row.Attempt, "outcome", outcome)
	}
	e.finish(outcome, res)
}

// fencedWrite runs one lease write with a timeout, retrying transient failures. Before a
// retry it checks whether the previous try landed (its reply may have been lost), so a
// write is never applied twice and a landed write is not reported as a stale one.
func (w *Worker) fencedWrite(ctx context.Context, e *execution, op string, write func(ctx context.Context) error) error {
	var err error
	for try := 0; try < 3; try++ {
		if try > 0 {
			select {
			case <-time.After(time.Duration(try) * 200 * time.Millisecond):
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			}
			lctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
			_, landed, lerr := store.Landed(lctx, w.pool, e.lease)
			cancel()
			if lerr == nil && landed {
				return nil
			}
		}
		wctx, cancel := context.WithTimeout(ctx, w.cfg.WriteTimeout)
		err = write(wctx)
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, queue.ErrLeaseLost) {
			w.hooks.staleWriteRejected(e.hookCtx(), e.row, op)
			return err
		}
		w.log.Warn("lease write failed; retrying", "op", op, "job_id", e.lease.JobID, "err", err)
	}
	return err
}

// finish ends the execution: the lease is no longer tracked and the slot is free. err
// is the error behind the outcome (AttemptResult.Err).
func (e *execution) finish(outcome Outcome, err error) {
	w := e.w
	e.mu.Lock()
	if e.finished {
		e.mu.Unlock()
		return
	}
	e.finished = true
	e.mu.Unlock()
	e.deadline.Stop()
	e.cancel(nil)
	w.mu.Lock()
	delete(w.execs, keyOf(e.lease))
	w.mu.Unlock()
	e.freeSlot()
	if e.row.FlowKey != nil {
		// The write that ended the lease freed its flow slot: the next job of its key
		// can be claimed now, by this worker among others.
		w.mu.Lock()
		if qs := w.queues[e.row.Queue]; qs != nil {
			qs.dirty = true
		}
		w.mu.Unlock()
		w.kickFlow()
		w.wakeClaims()
	}
	if len(w.hooks.finished) > 0 {
		e.finishedHooks(AttemptResult{Outcome: outcome, Err: err, Duration: time.Since(e.start)})
	}
	w.execWG.Done()
}

// finishedHooks calls the JobFinished hooks, or leaves them to the heartbeat that holds
// them back (holdFinish) until it has called the LeaseLost hooks.
func (e *execution) finishedHooks(res AttemptResult) {
	e.mu.Lock()
	if e.lostHold {
		held := res // copied to the heap only here, not on every call
		e.pending = &held
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	e.w.hooks.jobFinished(e.hookCtx(), e.row, res)
}

// holdFinish holds back the JobFinished hooks of the execution until releaseFinish.
func (e *execution) holdFinish() {
	e.mu.Lock()
	e.lostHold = true
	e.mu.Unlock()
}

// releaseFinish calls the JobFinished hooks that holdFinish held back, if the execution
// finished meanwhile.
func (e *execution) releaseFinish() {
	e.mu.Lock()
	e.lostHold = false
	res := e.pending
	e.pending = nil
	e.mu.Unlock()
	if res != nil {
		e.w.hooks.jobFinished(e.hookCtx(), e.row, *res)
	}
}

// freeSlot gives the execution's queue slot back, once, and has the claim loop claim
// from the queue if the queue waits for a slot. A job whose handler succeeded gives it back as soon as
// its completion is queued for the next batch, not when the batch is written: slots
// held until the write would limit each claim to the slots the last batch freed, so
// claims would come back smaller than allowed and completions in more statements. The
// slot is given back after the completion is queued, so pending completions stay
// bounded by the completion channel (CompleteBatchSize) plus the batch being written.
func (e *execution) freeSlot() {
	w := e.w
	e.mu.Lock()
	if e.slotFree {
		e.mu.Unlock()
		return
	}
	e.slotFree = true
	e.mu.Unlock()
	w.mu.Lock()
	w.running[e.row.Queue]--
	qs := w.queues[e.row.Queue]
	wake := qs != nil && qs.starved
	if wake {
		qs.starved, qs.dirty = false, true
	}
	w.mu.Unlock()
	if wake {
		w.wakeClaims()
	}
}
