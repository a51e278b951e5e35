package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/jobs/invoice"
)

// gate blocks callers while closed.
type gate struct {
	mu     sync.Mutex
	closed chan struct{} // nil while open
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// wait returns at once while the gate is open; else when it opens or ctx ends.
func (g *gate) wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.closed
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// pauser freezes the worker that makes the first tax call of the run, the way a
// stop-the-world pause (GC, SIGSTOP, a VM migration) does: its database access stops
// (db gate: no heartbeat, claim or write gets through) and its handlers' tax calls
// block (cpu gate). It stays frozen for at least 1.5 leases and until another worker's
// reaper revoked its lease. Then its database access comes back first, its heartbeat
// finds the lease gone (the expired_holder_alive alert), and finally the frozen handler
// resumes and tries its commit, which the database must reject.
type pauser struct {
	r       *demoRun
	ctx     context.Context
	db, cpu []*gate
	started atomic.Bool
	done    chan struct{}

	mu   sync.Mutex
	info *PauseReport
}

// PauseReport tells what happened to the frozen worker.
type PauseReport struct {
	Worker     string `json:"worker"`
	CustomerID int64  `json:"customer_id"`
	JobID      int64  `json:"job_id"`
	Gen        int64  `json:"lease_gen"`
	Frozen     string `json:"frozen_for"`
	// Revoked is true when another worker's reaper revoked the lease during the pause.
	Revoked bool `json:"revoked"`
	// Noticed is true when the resumed worker's heartbeat recorded the lost lease.
	Noticed bool `json:"holder_noticed"`
	// TakenBy is the worker whose fenced commit wrote the invoice.
	TakenBy string `json:"invoice_written_by"`
	// StaleWrites counts the rejected writes of the frozen lease.
	StaleWrites int64 `json:"stale_writes_of_frozen_lease"`
}

func newPauser(r *demoRun, ctx context.Context) *pauser {
	p := &pauser{r: r, ctx: ctx, done: make(chan struct{})}
	for range r.cfg.Workers {
		p.db = append(p.db, &gate{})
		p.cpu = append(p.cpu, &gate{})
	}
	return p
}

func (p *pauser) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// hook is worker i's tax hook. It runs after the simulated latency, before the answer.
func (p *pauser) hook(i int, worker string) func(context.Context, invoice.TaxCall) error {
	return func(_ context.Context, call invoice.TaxCall) error {
		// A frozen process runs nothing: its other handlers stop here too. The job's own
		// context is ignored on purpose, as a frozen thread ignores everything.
		if err := p.cpu[i].wait(p.ctx); err != nil {
			return err
		}
		if !p.started.CompareAndSwap(false, true) {
			return nil
		}
		p.freeze(i, worker, call)
		return nil
	}
}

func (p *pauser) freeze(i int, worker string, call invoice.TaxCall) {
	defer close(p.done)
	r := p.r
	ctx := p.ctx
	key := invoice.UniqueKey(call.Request.CustomerID, call.Request.Period)
	info := &PauseReport{Worker: worker, CustomerID: call.Request.CustomerID}
	var state, holder string
	if err := r.pool.QueryRow(ctx, sqlJobHolder, key, invoice.Kind).Scan(&info.JobID, &state, &holder, &info.Gen); err != nil {
		r.pr.say("cannot find the job of customer %d: %v; no pause", call.Request.CustomerID, err)
		return
	}
	p.db[i].close()
	p.cpu[i].close()
	defer p.db[i].open()
	defer p.cpu[i].open()
	start := time.Now()
	r.pr.say("%s freezes inside the tax call of customer %d (job %d, lease generation %d): no heartbeat, no database access",
		worker, info.CustomerID, info.JobID, info.Gen)

	minEnd := start.Add(r.cfg.Lease * 3 / 2)
	deadline := start.Add(10*r.cfg.Lease + 5*time.Second)
	for ctx.Err() == nil {
		var id, gen int64
		if err := r.pool.QueryRow(ctx, sqlJobHolder, key, invoice.Kind).Scan(&id, &state, &holder, &gen); err != nil {
			if ctx.Err() == nil {
				r.pr.say("pause: read job %d: %v", info.JobID, err)
			}
			break
		}
		info.Revoked = gen > info.Gen
		if (info.Revoked && time.Now().After(minEnd)) || time.Now().After(deadline) {
			break
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	info.Frozen = time.Since(start).Round(100 * time.Millisecond).String()
	p.db[i].open()
	if info.Revoked {
		now := state
		if holder != "" && state == "running" {
			now += " on " + holder
		}
		r.pr.say("%s resumes after %s; meanwhile the reaper revoked its lease (job %d is %s now)", worker, info.Frozen, info.JobID, now)
	} else {
		r.pr.say("%s resumes after %s; its lease was NOT revoked", worker, info.Frozen)
	}
	// A resumed process's heartbeat often runs before its handler threads: let it notice.
	noticeBy := time.Now().Add(8 * r.heartbeat())
	for ctx.Err() == nil && time.Now().Before(noticeBy) {
		if err := r.pool.QueryRow(ctx, sqlHolderNoticed, info.JobID, worker).Scan(&info.Noticed); err != nil || info.Noticed {
			break
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	r.pr.say("%s's handler resumes and commits the invoice under its old lease generation %d", worker, info.Gen)
	p.mu.Lock()
	p.info = info
	p.mu.Unlock()
}

// report completes the pause's story once the run is over.
func (p *pauser) report(ctx context.Context) (*PauseReport, error) {
	p.mu.Lock()
	info := p.info
	p.mu.Unlock()
	if info == nil {
		return nil, nil
	}
	err := p.r.pool.QueryRow(ctx, sqlInvoiceWriter, info.CustomerID, p.r.period).Scan(&info.TakenBy)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("demo: read invoice of customer %d: %w", info.CustomerID, err)
	}
	if err := p.r.pool.QueryRow(ctx, sqlStaleWritesOf, info.JobID, info.Gen).Scan(&info.StaleWrites); err != nil {
		return nil, fmt.Errorf("demo: count stale writes of job %d: %w", info.JobID, err)
	}
	return info, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
