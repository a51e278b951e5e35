package chaos

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/queue"
)

// The flow workload runs sleep jobs under three flow limits, a concurrency limit, a
// sequence and a rate limit, each over a few partitions, under the same faults as the
// other workloads. Whether the limits held is computed from the database's own lease
// history: a trigger the harness installs on the run's schema records, as the database
// makes it, every start of a lease (a claim) and every end (a completion, a failure, a
// revocation, a release), for the jobs under a limit. Nothing the workers count goes
// into the checks.
const (
	flowConcLimit = "chaos-conc"
	flowSeqLimit  = "chaos-seq"
	flowRateLimit = "chaos-rate"
	// flowConcMax is the concurrency limit per partition; flowRate starts per flowPer
	// the rate limit.
	flowConcMax = 2
	flowRate    = 4
	flowPer     = time.Second
	// flowPartitions is the number of partitions of each limit.
	flowPartitions = 3
)

// flowSleepArgs are the args of the workload's flow jobs: a sleep job (its handler reads
// only duration and ignore_cancel) that also names its flow key and limit in its args,
// so that the naive baseline, which has no flow limits, can enforce them per process.
type flowSleepArgs struct {
	Duration     diag.Duration `json:"duration"`
	IgnoreCancel bool          `json:"ignore_cancel,omitempty"`
	FlowKey      string        `json:"flow_key"`
	FlowMax      int           `json:"flow_max,omitempty"`
	FlowRate     int           `json:"flow_rate,omitempty"`
	FlowPerMS    int64         `json:"flow_per_ms,omitempty"`
}

// Kind implements fenceq.JobArgs.
func (flowSleepArgs) Kind() string { return diag.SleepKind }

// sqlFlowLog is the lease history of jobs under a flow limit: one row per lease start
// and per lease end, written by the database in the transaction that makes the change.
// at is the time of the change itself (clock_timestamp: after the claim took its row
// locks, before the end committed), tx_at the transaction's time, which the rate
// limit's ledger uses. A job's key is its flow key, or for the naive baseline the
// flow_key of its args.
const sqlFlowLog = `
CREATE TABLE chaos_flow_log (
    job_id bigint NOT NULL, key text NOT NULL, attempt int NOT NULL, event text NOT NULL,
    state text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(), tx_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION chaos_flow_log() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text := COALESCE(OLD.flow_key, OLD.args ->> 'flow_key', '');
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state = 'running'
       AND (NEW.state <> 'running' OR NEW.lease_gen <> OLD.lease_gen OR NEW.attempt <> OLD.attempt) THEN
        INSERT INTO chaos_flow_log (job_id, key, attempt, event, state) VALUES (OLD.id, k, OLD.attempt, 'end', NEW.state);
    END IF;
    IF TG_OP = 'DELETE' AND OLD.state = 'running' THEN
        INSERT INTO chaos_flow_log (job_id, key, attempt, event, state) VALUES (OLD.id, k, OLD.attempt, 'end', 'finished');
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.state = 'running'
       AND (OLD.state <> 'running' OR NEW.lease_gen <> OLD.lease_gen OR NEW.attempt <> OLD.attempt) THEN
        INSERT INTO chaos_flow_log (job_id, key, attempt, event, state) VALUES (NEW.id, k, NEW.attempt, 'start', 'running');
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = 'pending' AND NEW.state <> 'pending' THEN
        INSERT INTO chaos_flow_log (job_id, key, attempt, event, state) VALUES (NEW.id, k, NEW.attempt, 'wake', NEW.state);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_flow_log AFTER UPDATE OR DELETE ON fenceq_jobs_hot FOR EACH ROW
    WHEN (OLD.flow_key IS NOT NULL OR OLD.args ? 'flow_key' OR OLD.flow_hook)
    EXECUTE FUNCTION chaos_flow_log();`

// startFlow installs the lease history and, for a fenced run, sets the limits.
func (wl *Workload) startFlow(ctx context.Context) error {
	if _, err := wl.pool.Exec(ctx, sqlFlowLog); err != nil {
		return fmt.Errorf("chaos: flow lease history: %w", err)
	}
	if wl.naive {
		return nil
	}
	for _, l := range []queue.FlowLimit{
		{Name: flowConcLimit, MaxRunning: flowConcMax},
		{Name: flowSeqLimit, Sequence: true},
		{Name: flowRateLimit, Rate: flowRate, Per: flowPer},
	} {
		if err := fenceq.SetFlowLimit(ctx, wl.pool, l); err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
	}
	return nil
}

// flowWave enqueues one wave of flow jobs: per partition, FlowJobs jobs under the
// concurrency limit and as many in the sequence, and three times as many under the
// rate limit, so that the rate binds. The concurrency-limited jobs sleep up to the
// lease, some past it (a paused worker's lease is revoked and the job runs again
// elsewhere); the sequenced and rate-limited ones are short.
func (wl *Workload) flowWave(ctx context.Context, i int) error {
	lease := wl.env.cfg.Lease
	for p := range flowPartitions {
		for j := range 3 * wl.cfg.FlowJobs {
			jobs := []struct {
				limit string
				sleep time.Duration
				args  flowSleepArgs
			}{
				{flowConcLimit, wl.rng.duration(lease), flowSleepArgs{FlowMax: flowConcMax}},
				{flowSeqLimit, wl.rng.duration(lease / 4), flowSleepArgs{FlowMax: 1}},
				{flowRateLimit, wl.rng.duration(lease / 8), flowSleepArgs{FlowRate: flowRate, FlowPerMS: flowPer.Milliseconds()}},
			}
			for _, x := range jobs {
				if j >= wl.cfg.FlowJobs && x.limit != flowRateLimit {
					continue
				}
				if j == 0 && x.limit == flowConcLimit && i%2 == 1 {
					x.sleep = lease + lease/2 // held past the lease, unless its worker is paused first
				}
				partition := fmt.Sprintf("p%d", p)
				a := x.args
				a.Duration = diag.Duration(x.sleep)
				a.FlowKey = queue.FlowOpts{Limit: x.limit}.Key(partition)
				var opts *fenceq.InsertOpts
				if !wl.naive {
					opts = &fenceq.InsertOpts{Flow: queue.FlowOpts{Limit: x.limit, Partition: partition}}
				}
				if err := wl.enqueue(ctx, "flow job", a, opts); err != nil {
					return err
				}
				wl.mu.Lock()
				wl.stats.FlowJobs++
				wl.mu.Unlock()
			}
		}
	}
	if wl.naive {
		return nil // the naive baseline has no dependencies, batches or signals
	}
	return wl.flowGraphs(ctx, i)
}

// flowGraphs enqueues a wave's workflow (a fan-out and a fan-in of sleep tasks, one of
// them held past the lease now and then), batch (sleep members and a noop callback) and
// signal waits, and sends each wait its signal twice at once, as two racing senders.
func (wl *Workload) flowGraphs(ctx context.Context, i int) error {
	lease := wl.env.cfg.Lease
	sleep := func(d time.Duration) diag.SleepArgs { return diag.SleepArgs{Duration: diag.Duration(d)} }
	long := wl.rng.duration(lease / 4)
	if i%2 == 0 {
		long = lease + lease/2
	}
	wf := fenceq.NewWorkflow(fmt.Sprintf("chaos-%d", i)).
		Add("a", sleep(wl.rng.duration(lease/4)), nil).
		Add("b", sleep(long), &fenceq.TaskOpts{After: []string{"a"}}).
		Add("c", sleep(wl.rng.duration(lease/4)), &fenceq.TaskOpts{After: []string{"a"}}).
		Add("d", sleep(wl.rng.duration(lease/4)), &fenceq.TaskOpts{After: []string{"b", "c"}})
	if err := wl.retry(ctx, "enqueue a workflow", func() error { _, err := wf.Enqueue(ctx, wl.pool); return err }); err != nil {
		return err
	}
	b := fenceq.NewBatch(fmt.Sprintf("chaos-%d", i), diag.NoopArgs{}, nil)
	for range 4 {
		b.Add(sleep(wl.rng.duration(lease/2)), nil)
	}
	if err := wl.retry(ctx, "enqueue a batch", func() error { _, err := b.Enqueue(ctx, wl.pool); return err }); err != nil {
		return err
	}
	var ids []int64
	for range 2 {
		var res *queue.InsertResult
		if err := wl.retry(ctx, "enqueue a wait", func() error {
			var err error
			res, err = fenceq.Enqueue(ctx, wl.pool, diag.WaitArgs{Signal: "go"}, nil)
			return err
		}); err != nil {
			return err
		}
		ids = append(ids, res.Job.ID)
	}
	wl.mu.Lock()
	wl.stats.FlowJobs += 4 + 5 + len(ids)
	wl.mu.Unlock()
	// The signals go out a little later, most often while the jobs wait, from two
	// senders at once; the settle waits for them as for the order storm.
	wl.storms.Add(1)
	go func() {
		defer wl.storms.Done()
		sleepCtx(wl.stormCtx, wl.rng.duration(lease))
		for _, id := range ids {
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = wl.retry(wl.stormCtx, "send a signal", func() error {
						_, err := fenceq.SendSignal(wl.stormCtx, wl.pool, id, "go", map[string]int64{"job": id})
						return err
					})
				}()
			}
			wg.Wait()
		}
	}()
	return nil
}

// FlowReport is what the flow workload's checks found in the lease history.
type FlowReport struct {
	// ConcurrencyViolations counts the lease starts that made more leases valid at once
	// under a key than its limit allows; ConcurrencyChecked the starts checked.
	ConcurrencyViolations int `json:"concurrency_violations"`
	ConcurrencyChecked    int `json:"concurrency_checked"`
	// SequenceViolations counts starts of a sequence's job while an earlier job of its
	// key was unfinished (or another lease of the key was valid); SequenceChecked the
	// starts checked.
	SequenceViolations int `json:"sequence_violations"`
	SequenceChecked    int `json:"sequence_checked"`
	// RateViolations counts starts that made more starts under a key within one period
	// than the rate allows; RateChecked the starts checked.
	RateViolations int `json:"rate_violations"`
	RateChecked    int `json:"rate_checked"`
	// Graphs is set when the run had workflows, batches and signal waits (not the naive
	// baseline's).
	Graphs bool `json:"graphs"`
	// DependencyViolations counts starts of a task before one of its dependencies had
	// completed; DependencyChecked the starts of tasks with dependencies checked.
	DependencyViolations int `json:"dependency_violations"`
	DependencyChecked    int `json:"dependency_checked"`
	// Batches: the batches enqueued, their callbacks that completed with the right
	// counts, and the callbacks released (made available) more than once.
	Batches         int `json:"batches"`
	BatchCallbacks  int `json:"batch_callbacks"`
	BatchDuplicates int `json:"batch_duplicates"`
	// Waits: the jobs that waited for a signal, those that resumed with it and
	// completed, and the wakes beyond one per wait.
	Waits          int `json:"waits"`
	WaitsResumed   int `json:"waits_resumed"`
	WaitDuplicates int `json:"wait_duplicates"`
}

func (f *FlowReport) failures() []string {
	if f == nil {
		return nil
	}
	var out []string
	for _, c := range []struct {
		what       string
		bad, looks int
	}{
		{"concurrency-limit", f.ConcurrencyViolations, f.ConcurrencyChecked},
		{"sequence-order", f.SequenceViolations, f.SequenceChecked},
		{"rate-limit", f.RateViolations, f.RateChecked},
	} {
		if c.bad > 0 {
			out = append(out, fmt.Sprintf("%d %s violations", c.bad, c.what))
		}
		if c.looks == 0 {
			out = append(out, fmt.Sprintf("no %s start was checked", c.what))
		}
	}
	if !f.Graphs {
		return out
	}
	switch {
	case f.DependencyViolations > 0:
		out = append(out, fmt.Sprintf("%d dependency-order violations", f.DependencyViolations))
	case f.DependencyChecked == 0:
		out = append(out, "no start of a task with dependencies was checked")
	}
	if f.Batches == 0 || f.BatchCallbacks != f.Batches || f.BatchDuplicates > 0 {
		out = append(out, fmt.Sprintf("batch callbacks %d of %d, duplicates %d", f.BatchCallbacks, f.Batches, f.BatchDuplicates))
	}
	if f.Waits == 0 || f.WaitsResumed != f.Waits || f.WaitDuplicates > 0 {
		out = append(out, fmt.Sprintf("signal waits resumed %d of %d, duplicates %d", f.WaitsResumed, f.Waits, f.WaitDuplicates))
	}
	return out
}

// flowEvent is one row of the lease history.
type flowEvent struct {
	job     int64
	key     string
	attempt int
	start   bool
	wake    bool // a pending job given its turn (not a lease event)
	state   string
	at      time.Time
	txAt    time.Time
}

// checkFlow computes the flow report from the lease history and the jobs' final states.
func checkFlow(ctx context.Context, db queue.DBTX, graphs bool) (*FlowReport, error) {
	rows, err := db.Query(ctx, `
SELECT job_id, key, attempt, event = 'start', event = 'wake', state, at, tx_at FROM chaos_flow_log
ORDER BY at, event = 'start'`)
	if err != nil {
		return nil, fmt.Errorf("chaos: flow report: %w", err)
	}
	var events []flowEvent
	for rows.Next() {
		var e flowEvent
		if err := rows.Scan(&e.job, &e.key, &e.attempt, &e.start, &e.wake, &e.state, &e.at, &e.txAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("chaos: flow report: %w", err)
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: flow report: %w", err)
	}
	// Every sequenced job, by key, and when it finished for good: its finished_at (the
	// time of the transaction that finished it, which committed before any later claim
	// of its key), or none while it is unfinished.
	seq := map[string][]seqJob{}
	frows, err := db.Query(ctx, `SELECT id, COALESCE(flow_key, args ->> 'flow_key') AS k, finished_at FROM fenceq_jobs
WHERE COALESCE(flow_key, args ->> 'flow_key') LIKE $1 ORDER BY id`, flowSeqLimit+":%")
	if err != nil {
		return nil, fmt.Errorf("chaos: flow report: %w", err)
	}
	for frows.Next() {
		var j seqJob
		var key string
		if err := frows.Scan(&j.id, &key, &j.finished); err != nil {
			frows.Close()
			return nil, fmt.Errorf("chaos: flow report: %w", err)
		}
		seq[key] = append(seq[key], j)
	}
	if err := frows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: flow report: %w", err)
	}
	r := judgeFlow(events, seq)
	if graphs {
		if err := checkGraphs(ctx, db, events, r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// checkGraphs adds the workflow, batch and signal checks to r: every start of a task
// after all its dependencies completed (their finished_at, the time of the transaction
// that completed them); every batch's callback completed once, with the counts of its
// members' final states, and woken once; every signal wait resumed with its signal,
// woken once.
func checkGraphs(ctx context.Context, db queue.DBTX, events []flowEvent, r *FlowReport) error {
	r.Graphs = true
	wakes := map[int64]int{}
	starts := map[int64][]time.Time{}
	for _, e := range events {
		switch {
		case e.wake:
			wakes[e.job]++
		case e.start:
			starts[e.job] = append(starts[e.job], e.at)
		}
	}
	rows, err := db.Query(ctx, `
SELECT d.job_id, j.finished_at, j.state FROM fenceq_job_deps d JOIN fenceq_jobs j ON j.id = d.dep_id`)
	if err != nil {
		return fmt.Errorf("chaos: flow report: dependencies: %w", err)
	}
	type dep struct {
		finished *time.Time
		state    string
	}
	deps := map[int64][]dep{}
	for rows.Next() {
		var job int64
		var d dep
		if err := rows.Scan(&job, &d.finished, &d.state); err != nil {
			rows.Close()
			return fmt.Errorf("chaos: flow report: dependencies: %w", err)
		}
		deps[job] = append(deps[job], d)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("chaos: flow report: dependencies: %w", err)
	}
	batchCallback := map[int64]bool{}
	brows, err := db.Query(ctx, `SELECT job_id FROM fenceq_flow_jobs WHERE dep_counts`)
	if err != nil {
		return fmt.Errorf("chaos: flow report: batches: %w", err)
	}
	for brows.Next() {
		var id int64
		if err := brows.Scan(&id); err != nil {
			brows.Close()
			return fmt.Errorf("chaos: flow report: batches: %w", err)
		}
		batchCallback[id] = true
	}
	if err := brows.Err(); err != nil {
		return fmt.Errorf("chaos: flow report: batches: %w", err)
	}
	for job, ds := range deps {
		if batchCallback[job] {
			continue // a batch's callback tolerates its members' ends: counted below
		}
		for _, at := range starts[job] {
			r.DependencyChecked++
			for _, d := range ds {
				if d.state != string(queue.StateCompleted) || d.finished == nil || !d.finished.Before(at) {
					r.DependencyViolations++
					break
				}
			}
		}
	}
	// A batch's callback: completed, its counts those of its members' final states.
	if err := db.QueryRow(ctx, `
SELECT count(*),
       count(*) FILTER (WHERE cb.state = 'completed' AND (cb.metadata -> 'batch' ->> 'completed')::int = m.completed
                        AND (cb.metadata -> 'batch' ->> 'discarded')::int = m.discarded
                        AND (cb.metadata -> 'batch' ->> 'cancelled')::int = m.cancelled)
FROM fenceq_flow_jobs f JOIN fenceq_jobs cb ON cb.id = f.job_id
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE j.state = 'completed') AS completed,
           count(*) FILTER (WHERE j.state = 'discarded') AS discarded,
           count(*) FILTER (WHERE j.state = 'cancelled') AS cancelled
    FROM fenceq_job_deps d JOIN fenceq_jobs j ON j.id = d.dep_id WHERE d.job_id = f.job_id) m
WHERE f.dep_counts`).Scan(&r.Batches, &r.BatchCallbacks); err != nil {
		return fmt.Errorf("chaos: flow report: batch callbacks: %w", err)
	}
	for id := range batchCallback {
		if wakes[id] > 1 {
			r.BatchDuplicates += wakes[id] - 1
		}
	}
	wrows, err := db.Query(ctx, `SELECT id, state = 'completed' AND output ? 'signal' FROM fenceq_jobs WHERE kind = $1`, diag.WaitKind)
	if err != nil {
		return fmt.Errorf("chaos: flow report: waits: %w", err)
	}
	for wrows.Next() {
		var id int64
		var resumed bool
		if err := wrows.Scan(&id, &resumed); err != nil {
			wrows.Close()
			return fmt.Errorf("chaos: flow report: waits: %w", err)
		}
		r.Waits++
		if resumed { // with its signal: woken from its wait, or finding it already sent
			r.WaitsResumed++
		}
		if wakes[id] > 1 {
			r.WaitDuplicates += wakes[id] - 1
		}
	}
	if err := wrows.Err(); err != nil {
		return fmt.Errorf("chaos: flow report: waits: %w", err)
	}
	return nil
}

// seqJob is a job of a sequence: its id and when it finished (nil: unfinished).
type seqJob struct {
	id       int64
	finished *time.Time
}

// judgeFlow checks the lease history (ordered by time, ends before starts at one
// instant): the concurrency limit by sweeping the valid leases of each key, the
// sequence by comparing every start with the jobs of its key that came before, the rate
// by counting the starts of each key within a period before each start.
func judgeFlow(events []flowEvent, seq map[string][]seqJob) *FlowReport {
	r := &FlowReport{}
	type lease struct {
		job     int64
		attempt int
	}
	valid := map[string]map[lease]bool{}
	starts := map[string][]flowEvent{}
	for _, e := range events {
		if e.wake || e.key == "" {
			continue // not a job under a flow limit
		}
		limit := limitOfKey(e.key)
		if valid[e.key] == nil {
			valid[e.key] = map[lease]bool{}
		}
		l := lease{e.job, e.attempt}
		if !e.start {
			delete(valid[e.key], l)
			continue
		}
		valid[e.key][l] = true
		starts[e.key] = append(starts[e.key], e)
		switch limit {
		case flowConcLimit:
			r.ConcurrencyChecked++
			if len(valid[e.key]) > flowConcMax {
				r.ConcurrencyViolations++
			}
		case flowSeqLimit:
			r.SequenceChecked++
			if len(valid[e.key]) > 1 {
				r.SequenceViolations++
			}
		case flowRateLimit:
			r.RateChecked++
		}
	}
	for key, ss := range starts {
		switch limitOfKey(key) {
		case flowSeqLimit:
			// Every start of a job must come after every earlier job of its key (lower
			// id, in enqueue order) finished for good.
			for _, s := range ss {
				for _, j := range seq[key] {
					if j.id >= s.job {
						break
					}
					if j.finished == nil || !j.finished.Before(s.at) {
						r.SequenceViolations++
						break
					}
				}
			}
		case flowRateLimit:
			byTx := make([]time.Time, len(ss))
			for i, s := range ss {
				byTx[i] = s.txAt
			}
			sort.Slice(byTx, func(i, j int) bool { return byTx[i].Before(byTx[j]) })
			lo := 0
			for i, t := range byTx {
				for !byTx[lo].After(t.Add(-flowPer)) {
					lo++
				}
				if i-lo+1 > flowRate {
					r.RateViolations++
				}
			}
		}
	}
	return r
}

// limitOfKey returns the limit's name of a flow key.
func limitOfKey(key string) string {
	for i := range len(key) {
		if key[i] == ':' {
			return key[:i]
		}
	}
	return key
}
