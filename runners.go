package fenceq

import (
	"sync"
	"time"
)

// runnerIdle is how long a goroutine that finished an execution stays parked waiting
// for the next one before it exits (it exits within twice that).
const runnerIdle = 2 * time.Second

// runners reuses goroutines across executions. A goroutine that finished one parks for
// up to runnerIdle waiting for the next instead of exiting, so the stack it grew
// (argument decoding, pgx calls) serves the next job instead of being grown again for
// every job.
//
// Parked runners wait on a channel of their own, kept on a stack, most recently parked
// on top: handing a job over takes the top one. No select over shared channels (work,
// quit, a timer each) is involved, so handing over a job takes no channel locks besides
// the runner's own. One timer retires the runners that have been parked longer than
// runnerIdle, which are at the bottom of the stack.
type runners struct {
	idleFor time.Duration // runnerIdle, shorter in tests

	mu     sync.Mutex
	parked []*runner // by parking time, oldest first
	closed bool
	sweep  *time.Timer // armed while runners are parked
	armed  bool
	wg     sync.WaitGroup
}

type runner struct {
	next     chan func() // one slot: run and stop never block; nil means exit
	parkedAt time.Time
}

func newRunners(idleFor time.Duration) *runners {
	r := &runners{idleFor: idleFor}
	r.sweep = time.AfterFunc(time.Hour, r.retire)
	r.sweep.Stop()
	return r
}

// run hands f to the most recently parked goroutine, or starts one.
func (r *runners) run(f func()) {
	r.mu.Lock()
	if n := len(r.parked); n > 0 && !r.closed {
		rn := r.parked[n-1]
		r.parked[n-1] = nil
		r.parked = r.parked[:n-1]
		r.mu.Unlock()
		rn.next <- f
		return
	}
	r.mu.Unlock()
	r.wg.Add(1)
	go r.loop(&runner{next: make(chan func(), 1)}, f)
}

func (r *runners) loop(rn *runner, f func()) {
	defer r.wg.Done()
	for f != nil {
		f()
		f = r.park(rn)
	}
}

// idleStackReserve is stack space a parked runner keeps in use. The garbage collector
// halves the stack of a goroutine that uses less than a quarter of it, so a runner
// parked in a shallow frame would lose its stack at every collection and grow it back
// at its next job (decoding the arguments alone takes a few KiB). Parked in a frame of
// this size, a runner keeps the 8 KiB stack its jobs need.
const idleStackReserve = 2048

// park waits for the runner's next execution; nil means exit. Not inlined, so that its
// frame (with the reserve) exists only while the runner is parked.
//
//go:noinline
func (r *runners) park(rn *runner) func() {
	var reserve [idleStackReserve]byte
	reserve[len(reserve)-1] = 1 // used, so the compiler keeps it in the frame
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	rn.parkedAt = time.Now()
	r.parked = append(r.parked, rn)
	if !r.armed {
		r.armed = true
		r.sweep.Reset(r.idleFor)
	}
	r.mu.Unlock()
	f := <-rn.next
	if reserve[len(reserve)-1] != 1 {
		return nil
	}
	return f
}

// retire ends the runners parked for longer than idleFor and re-arms the sweep while
// any stay parked.
func (r *runners) retire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = false
	if r.closed {
		return
	}
	n := 0
	for n < len(r.parked) && time.Since(r.parked[n].parkedAt) >= r.idleFor {
		r.parked[n].next <- nil
		n++
	}
	kept := copy(r.parked, r.parked[n:])
	clear(r.parked[kept:])
	r.parked = r.parked[:kept]
	if kept > 0 {
		r.armed = true
		r.sweep.Reset(r.idleFor)
	}
}

// stop ends the parked goroutines and makes busy ones exit after their execution; with
// wait, it also waits for the busy ones to finish.
func (r *runners) stop(wait bool) {
	r.mu.Lock()
	r.closed = true
	r.sweep.Stop()
	for _, rn := range r.parked {
		rn.next <- nil
	}
	r.parked = nil
	r.mu.Unlock()
	if wait {
		r.wg.Wait()
	}
}
