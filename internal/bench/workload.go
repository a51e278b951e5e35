package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Job kinds of the benchmark, the same on every side.
const (
	kindNoop   = "bench_noop"
	kindFenced = "bench_fenced"
)

// benchArgs are the args of every benchmark job: a sequence number, unique per run,
// and the padding of Config.ArgsBytes.
type benchArgs struct {
	Seq int64  `json:"seq"`
	Pad string `json:"pad,omitempty"`
}

// queuesPhrase describes the queues of a side for the report.
func queuesPhrase(c Config) string {
	if len(c.queueNames) <= 1 {
		return "queue default"
	}
	return fmt.Sprintf("%d queues (jobs round robin), each", len(c.queueNames))
}

// pause is what a handler does besides reporting its start: it sleeps Config.JobSleep,
// or until its context ends.
func pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// hooks are what a system's handlers report to the workload driving them.
type hooks struct {
	// started is called when a handler begins working the job with this seq.
	started func(seq int64)
	// returned, when set, is called when that handler returns.
	returned func()
	// done is called with n after n jobs' completions were written.
	done func(n int)
}

// handlerReturned calls returned when it is set.
func (h hooks) handlerReturned() {
	if h.returned != nil {
		h.returned()
	}
}

// system is one side of the comparison.
type system interface {
	name() string
	// describe says how the side is configured, for the report.
	describe() string
	// jobTable is the (unqualified) table the side keeps its jobs in.
	jobTable() string
	// setup creates the side's tables in the run's schema (its own migrations).
	setup(ctx context.Context, e *env) error
	// insertBatch inserts jobs with these seqs in one bulk (COPY) insert.
	insertBatch(ctx context.Context, e *env, kind string, seqs []int64) error
	// insertOne inserts one job with a single-row insert.
	insertOne(ctx context.Context, e *env, kind string, seq int64) error
	// retain inserts the finished jobs with sequence numbers from..to (stored negated).
	retain(ctx context.Context, e *env, from, to int64) error
	// start starts working jobs; stop shuts down gracefully.
	start(ctx context.Context, e *env, h hooks) (stop func(context.Context) error, err error)
	// verify returns (jobs inserted by the run, completed, completed at the first attempt).
	verify(ctx context.Context, e *env) (total, completed, once int64, err error)
}

const insertBatchSize = 5000

// prefill inserts n jobs with seqs from..from+n-1 in COPY batches.
func prefill(ctx context.Context, e *env, s system, kind string, from, n int64, label string) error {
	seqs := make([]int64, 0, insertBatchSize)
	last := time.Now()
	for i := int64(0); i < n; i += insertBatchSize {
		seqs = seqs[:0]
		for j := i; j < min(n, i+insertBatchSize); j++ {
			seqs = append(seqs, from+j)
		}
		if err := s.insertBatch(ctx, e, kind, seqs); err != nil {
			return fmt.Errorf("insert jobs %d–%d: %w", from+i, from+i+int64(len(seqs))-1, err)
		}
		if time.Since(last) > time.Second {
			progressf(e.cfg.Progress, "  %s: %s %d/%d jobs inserted\n", s.name(), label, i+int64(len(seqs)), n)
			last = time.Now()
		}
	}
	return nil
}

// retainChunk is how many finished jobs one statement of retainFinished inserts: one
// transaction of ten million rows would hold its locks and snapshot for minutes and say
// nothing meanwhile.
const retainChunk = 1_000_000

// retainFinished inserts n finished jobs, a chunk per statement, with progress.
func retainFinished(ctx context.Context, e *env, s system, n int64) error {
	t0 := time.Now()
	for from := int64(1); from <= n; from += retainChunk {
		to := min(n, from+retainChunk-1)
		if err := s.retain(ctx, e, from, to); err != nil {
			return fmt.Errorf("retain finished jobs %d–%d: %w", from, to, err)
		}
		if n > retainChunk {
			progressf(e.cfg.Progress, "  %s: %d/%d finished jobs retained (%s)\n", s.name(), to, n,
				time.Since(t0).Round(time.Second))
		}
	}
	return nil
}

// runOnce runs the workload once on one side in a fresh schema.
func runOnce(ctx context.Context, cfg Config, s system, idx int) (*RunResult, error) {
	e, err := newEnv(ctx, cfg, s.name())
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := s.setup(ctx, e); err != nil {
		return nil, fmt.Errorf("set up %s: %w", s.name(), err)
	}
	if cfg.Workload == WorkloadFenced {
		if _, err := e.admin.Exec(ctx, sqlCreateFencedTables); err != nil {
			return nil, fmt.Errorf("create result tables: %w", err)
		}
	}
	if cfg.Retained > 0 {
		if err := retainFinished(ctx, e, s, int64(cfg.Retained)); err != nil {
			return nil, err
		}
	}
	w := workloads[cfg.Workload]
	if w.prepare != nil {
		if err := w.prepare(ctx, e, s); err != nil {
			return nil, err
		}
	}
	// Start measuring from an analyzed table, as autovacuum would leave it, and a fresh
	// pool whose backends owe no statistics from the preparation.
	if _, err := e.admin.Exec(ctx, "VACUUM ANALYZE "+s.jobTable()); err != nil {
		return nil, fmt.Errorf("analyze %s: %w", s.jobTable(), err)
	}
	if err := e.reopenPool(ctx); err != nil {
		return nil, err
	}
	if cfg.Checkpoint {
		if _, err := e.admin.Exec(ctx, sqlCheckpoint); err != nil {
			progressf(cfg.Progress, "  checkpoint before the run failed (%v); measuring anyway\n", err)
		}
	}
	before, err := settledSample(ctx, e.admin, s.jobTable())
	if err != nil {
		return nil, err
	}
	var idle *idleXact
	if cfg.IdleXact > 0 {
		if idle, err = startIdleXact(ctx, e.url, cfg.IdleXact); err != nil {
			return nil, err
		}
	}
	cpu0, cpuOK := processCPU()
	alloc0 := readAllocs()
	res, err := w.measure(ctx, e, s)
	alloc1 := readAllocs()
	cpu1, _ := processCPU()
	idle.end()
	if err != nil {
		return nil, err
	}
	if cpuOK && res.jobs > 0 {
		res.m[MetricClientCPUPerJob] = float64((cpu1 - cpu0).Microseconds()) / float64(res.jobs)
	}
	if res.jobs > 0 {
		res.m[MetricAllocsPerJob] = float64(alloc1.objects-alloc0.objects) / float64(res.jobs)
		res.m[MetricAllocBytesPerJob] = float64(alloc1.bytes-alloc0.bytes) / float64(res.jobs)
	}
	if e.trace != nil {
		e.trace.write(cfg.Progress, fmt.Sprintf("%s run %d", s.name(), idx), 8)
	}
	e.closePool()
	after, err := settledSample(ctx, e.admin, s.jobTable())
	if err != nil {
		return nil, err
	}
	fig, err := diff(ctx, e.admin, before, after)
	if err != nil {
		return nil, err
	}
	fig.metrics(res.jobs, res.m)

	total, completed, once, err := s.verify(ctx, e)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if err := res.check(total, completed, once); err != nil {
		return nil, fmt.Errorf("%s: %w", s.name(), err)
	}
	if cfg.Workload == WorkloadFenced {
		var results, outbox int64
		if err := e.admin.QueryRow(ctx, sqlCountFenced).Scan(&results, &outbox); err != nil {
			return nil, fmt.Errorf("count result rows: %w", err)
		}
		if results != completed || outbox != completed {
			return nil, fmt.Errorf("%s: %w: %d completed jobs but %d result rows and %d outbox rows",
				s.name(), errVerify, completed, results, outbox)
		}
	}
	return &RunResult{System: s.name(), Run: idx, Metrics: res.m, Schema: e.schema}, nil
}

// measured is what a workload's measured phase produced.
type measured struct {
	m         map[string]float64
	jobs      int64 // the jobs the per-job statistics are divided by
	inserted  int64 // jobs the run inserted (all of them, prepared or measured)
	completed int64 // completions the handlers reported
	all       bool  // every inserted job must be completed
}

// check holds the benchmark to its invariants: every job it counts as worked was
// completed exactly once, at its first attempt; in drain-like workloads all were.
func (r measured) check(total, completed, once int64) error {
	if total != r.inserted {
		return fmt.Errorf("%w: %d jobs inserted, %d rows found", errVerify, r.inserted, total)
	}
	if completed != r.completed {
		return fmt.Errorf("%w: handlers reported %d completions, %d rows completed", errVerify, r.completed, completed)
	}
	if once != completed {
		return fmt.Errorf("%w: %d of %d completed jobs took more than one attempt", errVerify, completed-once, completed)
	}
	if r.all && completed != total {
		return fmt.Errorf("%w: %d of %d jobs completed", errVerify, completed, total)
	}
	return nil
}

type workload struct {
	// prepare inserts what must exist before the measured phase (not measured).
	prepare func(ctx context.Context, e *env, s system) error
	measure func(ctx context.Context, e *env, s system) (measured, error)
}

var workloads = map[string]workload{
	WorkloadInsert: {measure: measureInsert},
	WorkloadDrain: {
		prepare: func(ctx context.Context, e *env, s system) error {
			return prefill(ctx, e, s, kindNoop, 0, int64(e.cfg.Jobs), "drain")
		},
		measure: func(ctx context.Context, e *env, s system) (measured, error) {
			return measureDrain(ctx, e, s)
		},
	},
	WorkloadFenced: {
		prepare: func(ctx context.Context, e *env, s system) error {
			return prefill(ctx, e, s, kindFenced, 0, int64(e.cfg.Jobs), "fenced")
		},
		measure: func(ctx context.Context, e *env, s system) (measured, error) {
			return measureDrain(ctx, e, s)
		},
	},
	WorkloadSteady: {
		prepare: func(ctx context.Context, e *env, s system) error {
			return prefill(ctx, e, s, kindNoop, 0, steadyBacklog(e.cfg), "steady backlog")
		},
		measure: measureSteady,
	},
	WorkloadLatency: {measure: measureLatency},
}

// counter counts completions and remembers when the last one arrived.
type counter struct {
	n    atomic.Int64
	last atomic.Int64 // monotonic ns since base
	base time.Time
}

func newCounter() *counter { return &counter{base: time.Now()} }

func (c *counter) done(n int) {
	c.n.Add(int64(n))
	c.last.Store(int64(time.Since(c.base)))
}

// waitFor waits until the counter reaches want, printing progress each second. It
// gives up after limit.
func (c *counter) waitFor(ctx context.Context, e *env, label string, want int64, limit time.Duration) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start, lastPrint, lastN := time.Now(), time.Now(), int64(0)
	for {
		n := c.n.Load()
		if n >= want {
			return nil
		}
		if time.Since(start) > limit {
			return fmt.Errorf("%s: only %d of %d jobs completed after %s", label, n, want, limit)
		}
		if d := time.Since(lastPrint); d >= time.Second {
			progressf(e.cfg.Progress, "  %s: %d/%d jobs (%.0f jobs/s)\n", label, n, want, float64(n-lastN)/d.Seconds())
			lastPrint, lastN = time.Now(), n
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func drainLimit(n int) time.Duration { return time.Minute + time.Duration(n)*time.Millisecond }

func measureDrain(ctx context.Context, e *env, s system) (measured, error) {
	n := int64(e.cfg.Jobs)
	c := newCounter()
	mem := startMemWatch(e.cfg.JobSleep > 0)
	t0 := time.Since(c.base)
	stop, err := s.start(ctx, e, hooks{started: func(int64) { mem.started.Add(1) }, returned: func() { mem.returned.Add(1) }, done: c.done})
	if err != nil {
		mem.end(map[string]float64{})
		return measured{}, fmt.Errorf("start %s: %w", s.name(), err)
	}
	werr := c.waitFor(ctx, e, s.name(), n, drainLimit(e.cfg.Jobs)+time.Duration(n/int64(e.cfg.totalSlots())+1)*e.cfg.JobSleep)
	elapsed := time.Duration(c.last.Load()) - t0
	m := map[string]float64{}
	mem.end(m)
	serr := stopSystem(s, stop)
	if werr != nil {
		// The side's own error (a claimer that failed, a verification) says why.
		return measured{}, errors.Join(werr, serr)
	}
	if serr != nil {
		return measured{}, serr
	}
	got := c.n.Load()
	m[MetricJobsPerSec] = float64(got) / elapsed.Seconds()
	m[MetricJobs] = float64(got)
	m[MetricSeconds] = elapsed.Seconds()
	return measured{m: m, jobs: got, inserted: n, completed: got, all: true}, nil
}

func stopSystem(s system, stop func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := stop(ctx); err != nil {
		return fmt.Errorf("stop %s: %w", s.name(), err)
	}
	return nil
}

// steadyBacklog is how many jobs steady keeps waiting: enough that workers never
// starve, few enough that claims walk a realistic index.
func steadyBacklog(cfg Config) int64 { return int64(max(10*cfg.Workers, 10_000)) }

func measureSteady(ctx context.Context, e *env, s system) (measured, error) {
	backlog := steadyBacklog(e.cfg)
	c := newCounter()
	var inserted atomic.Int64
	inserted.Store(backlog)
	stop, err := s.start(ctx, e, hooks{started: func(int64) {}, done: c.done})
	if err != nil {
		return measured{}, fmt.Errorf("start %s: %w", s.name(), err)
	}
	t0 := time.Now()
	ictx, icancel := context.WithCancel(ctx)
	ierr := make(chan error, 1)
	go func() {
		// Keep the backlog topped up with COPY batches, as River's own benchmark does.
		seqs := make([]int64, insertBatchSize)
		for ictx.Err() == nil {
			if inserted.Load()-c.n.Load() >= backlog {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			from := inserted.Load()
			for i := range seqs {
				seqs[i] = from + int64(i)
			}
			// The batch runs to its end even when the phase ends meanwhile: a COPY cut off
			// by its context may still have committed, and then the count would be wrong.
			if err := s.insertBatch(ctx, e, kindNoop, seqs); err != nil {
				ierr <- err
				return
			}
			inserted.Add(insertBatchSize)
		}
		ierr <- nil
	}()
	var insertedAtStart = inserted.Load()
	tick := time.NewTicker(time.Second)
	lastN := int64(0)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			n := c.n.Load()
			progressf(e.cfg.Progress, "  %s: %s, %d worked (%d/s), %d inserted\n", s.name(),
				time.Since(t0).Round(time.Second), n, n-lastN, inserted.Load()-insertedAtStart)
			lastN = n
			if time.Since(t0) >= e.cfg.Duration {
				break loop
			}
		}
	}
	tick.Stop()
	worked := c.n.Load()
	elapsed := time.Since(t0)
	icancel()
	if err := <-ierr; err != nil {
		_ = stopSystem(s, stop)
		return measured{}, fmt.Errorf("insert while working: %w", err)
	}
	// Read once the inserter returned: the batch in flight at the end of the phase
	// counts, so a short phase on a slow machine does not report nothing inserted for a
	// batch that was being copied all along (at most one batch more than the window saw).
	ins := inserted.Load() - insertedAtStart
	if err := stopSystem(s, stop); err != nil {
		return measured{}, err
	}
	if ctx.Err() != nil {
		return measured{}, ctx.Err()
	}
	return measured{
		m: map[string]float64{
			MetricJobsPerSec:     float64(worked) / elapsed.Seconds(),
			MetricInsertedPerSec: float64(ins) / elapsed.Seconds(),
			MetricJobs:           float64(worked),
			MetricSeconds:        elapsed.Seconds(),
		},
		jobs: worked, inserted: inserted.Load(), completed: c.n.Load(),
	}, nil
}

func measureInsert(ctx context.Context, e *env, s system) (measured, error) {
	n := int64(e.cfg.Jobs)
	t0 := time.Now()
	if err := prefill(ctx, e, s, kindNoop, 0, n, "COPY insert"); err != nil {
		return measured{}, err
	}
	copyDur := time.Since(t0)

	// Single-row inserts from as many goroutines as the pool has connections.
	single := max(n/10, 1)
	var next atomic.Int64
	next.Store(n)
	var wg sync.WaitGroup
	errs := make(chan error, e.cfg.Conns)
	t1 := time.Now()
	for range e.cfg.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seq := next.Add(1) - 1
				if seq >= n+single {
					return
				}
				if err := s.insertOne(ctx, e, kindNoop, seq); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	singleDur := time.Since(t1)
	close(errs)
	if err := <-errs; err != nil {
		return measured{}, fmt.Errorf("single-row insert: %w", err)
	}
	return measured{
		m: map[string]float64{
			MetricCopyPerSec:   float64(n) / copyDur.Seconds(),
			MetricSinglePerSec: float64(single) / singleDur.Seconds(),
			MetricJobs:         float64(n + single),
			MetricSeconds:      (copyDur + singleDur).Seconds(),
		},
		jobs: n + single, inserted: n + single,
	}, nil
}

// latencySenders is how many goroutines share the arrivals of the latency workload, so
// that one slow insert does not delay the ones behind it.
const latencySenders = 4

func measureLatency(ctx context.Context, e *env, s system) (measured, error) {
	rate := e.cfg.Rate
	n := int64(math.Round(e.cfg.Duration.Seconds() * float64(rate)))
	if n < 1 {
		n = 1
	}
	base := time.Now()
	sent := make([]atomic.Int64, n)    // ns since base, before the insert was sent
	acked := make([]atomic.Int64, n)   // ns since base, when the insert returned (committed)
	started := make([]atomic.Int64, n) // ns since base, when the handler began
	var dup atomic.Int64
	c := newCounter()
	stop, err := s.start(ctx, e, hooks{
		started: func(seq int64) {
			if seq < 0 || seq >= n {
				return
			}
			if !started[seq].CompareAndSwap(0, int64(time.Since(base))) {
				dup.Add(1)
			}
		},
		done: c.done,
	})
	if err != nil {
		return measured{}, fmt.Errorf("start %s: %w", s.name(), err)
	}
	// Let the side settle (listeners connected, first poll done) before arrivals begin.
	time.Sleep(500 * time.Millisecond)
	interval := time.Second / time.Duration(rate)
	t0 := time.Since(base)
	var wg sync.WaitGroup
	errs := make(chan error, latencySenders)
	for k := range int64(latencySenders) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := k; seq < n; seq += latencySenders {
				at := t0 + time.Duration(seq)*interval
				if d := at - time.Since(base); d > 0 {
					time.Sleep(d)
				}
				sent[seq].Store(int64(time.Since(base)))
				if err := s.insertOne(ctx, e, kindNoop, seq); err != nil {
					errs <- err
					return
				}
				acked[seq].Store(int64(time.Since(base)))
			}
		}()
	}
	wg.Wait()
	close(errs)
	sendDur := time.Since(base) - t0
	werr := c.waitFor(ctx, e, s.name(), n, 30*time.Second)
	serr := stopSystem(s, stop)
	if err := <-errs; err != nil {
		return measured{}, fmt.Errorf("enqueue: %w", err)
	}
	if werr != nil {
		// The side's own error (a claimer that failed, a verification) says why.
		return measured{}, errors.Join(werr, serr)
	}
	if serr != nil {
		return measured{}, serr
	}
	if d := dup.Load(); d > 0 {
		return measured{}, fmt.Errorf("%w: %d jobs started twice", errVerify, d)
	}
	lat := make([]float64, 0, n)
	pickup := make([]float64, 0, n)
	var sum float64
	for i := range sent {
		st := started[i].Load()
		if st == 0 {
			return measured{}, fmt.Errorf("%w: job %d never started", errVerify, i)
		}
		ms := float64(st-sent[i].Load()) / 1e6
		lat = append(lat, ms)
		pickup = append(pickup, float64(st-acked[i].Load())/1e6)
		sum += ms
	}
	slices.Sort(lat)
	slices.Sort(pickup)
	return measured{
		m: map[string]float64{
			MetricP50:         percentile(lat, 50),
			MetricP95:         percentile(lat, 95),
			MetricP99:         percentile(lat, 99),
			MetricMaxMs:       lat[len(lat)-1],
			MetricMeanMs:      sum / float64(len(lat)),
			MetricPickupP50:   percentile(pickup, 50),
			MetricPickupP99:   percentile(pickup, 99),
			MetricArrivalRate: float64(n) / sendDur.Seconds(),
			MetricJobs:        float64(n),
			MetricSeconds:     sendDur.Seconds(),
		},
		jobs: n, inserted: n, completed: c.n.Load(), all: true,
	}, nil
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
