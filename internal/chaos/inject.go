package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/internal/faultproxy"
)

// ErrNoCluster means a PostgreSQL restart was asked for but the harness does not run
// the server: it cannot restart a server it does not own.
var ErrNoCluster = errors.New("the harness does not control the PostgreSQL server (run it with its own throwaway cluster: --own-cluster)")

// commitDropWait bounds how long an armed COMMIT-reply drop waits for a COMMIT.
const commitDropWait = 15 * time.Second

// holdWait bounds how long a fault waits for its target to hold a lease.
const holdWait = 5 * time.Second

// waitHolding waits until the worker's current process holds a lease, for at most
// within, and returns how many it holds then.
func (e *Env) waitHolding(ctx context.Context, w *Worker, within time.Duration) int64 {
	deadline := time.Now().Add(within)
	for {
		var n int64
		err := e.Pool.QueryRow(ctx, sqlHeldLeases, w.ID()).Scan(&n)
		if (err == nil && n > 0) || time.Now().After(deadline) || ctx.Err() != nil {
			return n
		}
		sleepCtx(ctx, 25*time.Millisecond)
	}
}

// holderWait bounds how long a fault that needs a lease of a particular job waits for
// any worker to hold one. On a loaded machine claims come late, and a fault fired on
// a worker that holds nothing would test an idle process; the workload's next wave
// brings new jobs of each kind well within it.
const holderWait = 2 * time.Minute

// holderWhere returns w when it comes to hold a lease that the count query sql finds
// within holdWait, else the first worker that comes to hold one within holderWait,
// else an error: the fault then does not fire, rather than fire on a worker whose
// lease it could not test.
func (e *Env) holderWhere(ctx context.Context, w *Worker, sql string) (*Worker, error) {
	if e.waitHoldingWhere(ctx, w, holdWait, sql) {
		return w, nil
	}
	deadline := time.Now().Add(holderWait)
	for {
		for _, o := range e.Workers {
			if e.waitHoldingWhere(ctx, o, 0, sql) {
				return o, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no worker held a lease of the jobs this fault needs within %s", holdWait+holderWait)
		}
		sleepCtx(ctx, 25*time.Millisecond)
	}
}

// Inject injects one fault now and returns its record: whether it provably fired, and
// the proof. It blocks for the fault's duration (a pause lasts f.For) and restores what
// it changed before returning, also when ctx ends early.
func (e *Env) Inject(ctx context.Context, f PlannedFault) (rec FaultRecord) {
	rec = FaultRecord{PlannedFault: f}
	start := time.Now()
	// A named result, so that this sets Took on the record returned (with an unnamed
	// one it would set a copy after the return value was taken).
	defer func() { rec.Took = time.Since(start) }()
	switch f.Type {
	case FaultPGRestart:
		rec.Target = "postgres"
		proof, err := e.restartPostgres(ctx)
		return e.settle(rec, proof, err)
	case FaultDBPartition:
		rec.Target = "the database host"
		proof, err := e.dbPartition(ctx, f.For)
		return e.settle(rec, proof, err)
	case FaultFailover:
		rec.Target = "the primary"
		proof, err := e.failover(ctx)
		return e.settle(rec, proof, err)
	}
	if f.Worker < 0 || f.Worker >= len(e.Workers) {
		return e.settle(rec, "", fmt.Errorf("no worker slot %d (have %d)", f.Worker, len(e.Workers)))
	}
	w := e.Workers[f.Worker]
	// Faults that take a worker away matter when it holds leases: wait (a little) for
	// it to hold one, so the fault tests the fence rather than an idle process.
	held := int64(-1)
	// need counts the leases of the kind the fault must find held; needs names them.
	var need, needs string
	switch f.Type {
	case FaultKill, FaultBlackhole:
		// Their effect is a lease revoked: take a worker that holds one.
		need, needs = sqlHeldLeases, "a lease"
	case FaultTerminate, FaultReset:
		held = e.waitHolding(ctx, w, holdWait)
	case FaultPause:
		// A lease that outlives the pause: a sleep job, whose holder freezes past its
		// lease and finds it revoked when it wakes (a job caught between its commit
		// and the reply would finish and leave nothing to revoke). Take the worker
		// holding one, this one if it does.
		need, needs = sqlHeldSleeping, "a sleep job"
	case FaultLinkDown:
		// A job that runs on through the cut lets the worker find its lease revoked
		// once the link is back: take the worker holding one, this one if it does.
		need, needs = sqlHeldStubborn, "a sleep job that ignores cancellation"
	}
	if need != "" {
		o, err := e.holderWhere(ctx, w, need)
		if err != nil {
			rec.Target = "a worker holding " + needs
			return e.settle(rec, "", err)
		}
		w, held = o, e.waitHolding(ctx, o, 0)
	}
	rec.Target = fmt.Sprintf("%s (%s, pid %d)", w.Name, w.ID(), w.Proc.Pid())
	if held >= 0 {
		rec.Target += fmt.Sprintf(", holding %d leases", held)
	}
	var proof string
	var err error
	switch f.Type {
	case FaultLinkDown:
		proof, rec.Effect, err = e.linkDown(ctx, w, f.For)
	case FaultCommitCut:
		proof, rec.Effect, err = e.commitCut(ctx, w, f.For)
	case FaultPause:
		proof, err = e.pause(ctx, w, f.For)
	case FaultKill:
		proof, err = e.kill(ctx, w)
	case FaultTerminate:
		proof, err = e.terminate(ctx, w)
	case FaultBlackhole:
		proof, err = e.blackhole(ctx, w, f.For)
	case FaultReset:
		if n := w.resetAll(); n > 0 {
			proof = fmt.Sprintf("%d connections reset (TCP RST)", n)
		} else {
			err = errors.New("the worker had no open connection to reset")
		}
	case FaultLatency:
		proof, err = e.latency(ctx, w, f.Latency, f.For)
	case FaultCommitDrop:
		proof, err = e.commitDrop(ctx, w)
	default:
		err = fmt.Errorf("unknown fault type %q", f.Type)
	}
	return e.settle(rec, proof, err)
}

func (e *Env) settle(rec FaultRecord, proof string, err error) FaultRecord {
	if err != nil {
		rec.Err = err.Error()
		e.log.Warn("fault did not fire", "fault", rec.Type, "target", rec.Target, "err", err)
		return rec
	}
	rec.Fired, rec.Proof = true, proof
	e.log.Info("fault fired", "fault", rec.Type, "target", rec.Target, "proof", proof, "effect", rec.Effect)
	return rec
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (e *Env) pause(ctx context.Context, w *Worker, d time.Duration) (string, error) {
	proof, err := w.Proc.Pause()
	defer func() { _ = w.Proc.Resume() }()
	if err != nil {
		return "", err
	}
	sleepCtx(ctx, d)
	if err := w.Proc.Resume(); err != nil {
		return "", fmt.Errorf("resume after the pause: %w", err)
	}
	return fmt.Sprintf("%s for %s, then SIGCONT", proof, d.Round(time.Millisecond)), nil
}

func (e *Env) kill(ctx context.Context, w *Worker) (string, error) {
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	status, err := w.Proc.Kill(kctx)
	if err != nil {
		return "", err
	}
	if err := w.Start(); err != nil {
		return "", fmt.Errorf("killed (%s) but not restarted: %w", status, err)
	}
	if err := w.WaitRegistered(ctx, 30*time.Second); err != nil {
		return "", fmt.Errorf("killed (%s) but the new process did not come up: %w", status, err)
	}
	return fmt.Sprintf("SIGKILL: %s; restarted as %s (pid %d)", status, w.ID(), w.Proc.Pid()), nil
}

func (e *Env) terminate(ctx context.Context, w *Worker) (string, error) {
	rows, err := e.Pool.Query(ctx, sqlTerminateApp, w.AppName)
	if err != nil {
		return "", fmt.Errorf("pg_terminate_backend: %w", err)
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		var ok bool
		if err := rows.Scan(&pid, &ok); err != nil {
			rows.Close()
			return "", fmt.Errorf("pg_terminate_backend: %w", err)
		}
		if ok {
			pids = append(pids, pid)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("pg_terminate_backend: %w", err)
	}
	if len(pids) == 0 {
		return "", fmt.Errorf("no session with application_name %s to terminate", w.AppName)
	}
	return fmt.Sprintf("pg_terminate_backend returned true for %d sessions (pids %v)", len(pids), pids), nil
}

// The proxy faults act on every proxy of the slot: with Failover, the one to the
// server that is the primary now.

func (w *Worker) resetAll() int {
	n := 0
	for _, p := range w.Proxies {
		n += p.ResetAll()
	}
	return n
}

func (w *Worker) sum(f func(*faultproxy.Proxy) int64) int64 {
	var n int64
	for _, p := range w.Proxies {
		n += f(p)
	}
	return n
}

func (e *Env) blackhole(ctx context.Context, w *Worker, d time.Duration) (string, error) {
	dropped := (*faultproxy.Proxy).Dropped
	before := w.sum(dropped)
	for _, p := range w.Proxies {
		p.SetBlackhole(true)
	}
	sleepCtx(ctx, d)
	for _, p := range w.Proxies {
		p.SetBlackhole(false)
	}
	n := w.resetAll() // the partition killed the connections it starved
	swallowed := w.sum(dropped) - before
	if swallowed == 0 {
		return "", fmt.Errorf("the proxy swallowed no byte in %s", d)
	}
	return fmt.Sprintf("%d bytes swallowed over %s, then %d connections reset", swallowed, d.Round(time.Millisecond), n), nil
}

func (e *Env) latency(ctx context.Context, w *Worker, l, d time.Duration) (string, error) {
	delayed := (*faultproxy.Proxy).Delayed
	before := w.sum(delayed)
	for _, p := range w.Proxies {
		p.SetLatency(l)
	}
	sleepCtx(ctx, d)
	for _, p := range w.Proxies {
		p.SetLatency(0)
	}
	n := w.sum(delayed) - before
	if n == 0 {
		return "", fmt.Errorf("no chunk crossed the proxy in %s", d)
	}
	return fmt.Sprintf("%d chunks delayed by %s over %s", n, l, d.Round(time.Millisecond)), nil
}

func (e *Env) commitDrop(ctx context.Context, w *Worker) (string, error) {
	before := make([]int, len(w.Proxies))
	for i, p := range w.Proxies {
		before[i] = len(p.CommitDrops())
		p.DropCommitReplies(1)
	}
	defer func() {
		for _, p := range w.Proxies {
			p.DropCommitReplies(0)
		}
	}()
	armed := time.Now()
	deadline := armed.Add(commitDropWait)
	if lim := e.waitLimit(); !lim.IsZero() && lim.Before(deadline) {
		deadline = lim
	}
	for {
		for i, p := range w.Proxies {
			if drops := p.CommitDrops(); len(drops) > before[i] {
				d := drops[len(drops)-1]
				return fmt.Sprintf("reply %q (%d bytes) to a COMMIT on connection %d dropped, connection reset",
					d.Tag, d.Bytes, d.ConnID), nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("no COMMIT crossed the proxy in the %s it stayed armed", time.Since(armed).Round(time.Millisecond))
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

func (e *Env) restartPostgres(ctx context.Context) (string, error) {
	if e.Cluster == nil {
		return "", ErrNoCluster
	}
	var before time.Time
	if err := e.Pool.QueryRow(ctx, sqlPostmasterStart).Scan(&before); err != nil {
		return "", fmt.Errorf("read the postmaster start time: %w", err)
	}
	if err := e.Cluster.Restart(ctx, "immediate"); err != nil {
		return "", fmt.Errorf("pg_ctl restart -m immediate: %w", err)
	}
	var after time.Time
	var err error
	for try := 0; try < 50; try++ {
		if err = e.Pool.QueryRow(ctx, sqlPostmasterStart).Scan(&after); err == nil {
			break
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	if err != nil {
		return "", fmt.Errorf("PostgreSQL did not answer after the restart: %w", err)
	}
	if !after.After(before) {
		return "", fmt.Errorf("postmaster start time %s did not change", after)
	}
	return fmt.Sprintf("pg_ctl restart -m immediate: postmaster start time %s → %s",
		before.Format("15:04:05.000"), after.Format("15:04:05.000")), nil
}

// Restore undoes every fault that may still be in force: resumes paused processes,
// lifts blackholes and latency, and disarms COMMIT-reply drops.
func (e *Env) Restore() {
	for _, w := range e.Workers {
		_ = w.Proc.Resume()
		for _, p := range w.Proxies {
			p.SetBlackhole(false)
			p.SetLatency(0)
			p.DropCommitReplies(0)
			p.HoldCommitReplies(0, nil)
			p.SetRefuse(false)
		}
	}
	if e.Net != nil {
		for _, h := range e.Net.Hosts {
			_ = h.SetLink(context.Background(), true)
		}
	}
}

// RunSchedule injects the planned faults one after another, each at its time from
// start, until the plan ends or ctx is done, and returns the records.
// A fault that starts late (the previous one ran long) still waits minGap after the
// previous one ended. A fault that would start after until (when the work stops), if not
// zero, is left out, unless no fault of its type has been tried yet: on a slow machine
// the faults before it can run long, and a run must still try each type it plans (the
// caller keeps the work going until the schedule returns). Waiting for a COMMIT to drop
// stops at until, or at the end of the fault's own lease-long wait when it started late.
func (e *Env) RunSchedule(ctx context.Context, start time.Time, plan []PlannedFault, minGap time.Duration, until time.Time) []FaultRecord {
	defer e.Restore()
	e.mu.Lock()
	e.until = until
	e.mu.Unlock()
	var out []FaultRecord
	var lastEnd time.Time
	tried := map[FaultType]bool{}
	for i, f := range plan {
		at := start.Add(f.At)
		if next := lastEnd.Add(minGap); at.Before(next) {
			at = next
		}
		if !until.IsZero() && at.After(until) {
			if tried[f.Type] {
				continue
			}
			e.log.Warn("fault starts after the planned end of the run, the first of its type: the work goes on until it has run",
				"fault", f.Type, "late_by", at.Sub(until).Round(time.Millisecond), "position", i+1)
			e.mu.Lock()
			e.until = at.Add(e.cfg.Lease * 2)
			e.mu.Unlock()
		}
		tried[f.Type] = true
		if wait := time.Until(at); wait > 0 {
			sleepCtx(ctx, wait)
		}
		if ctx.Err() != nil {
			break
		}
		rec := e.Inject(ctx, f)
		lastEnd = time.Now()
		rec.Started = time.Since(start) - rec.Took
		out = append(out, rec)
	}
	return out
}

func (e *Env) waitLimit() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.until
}
