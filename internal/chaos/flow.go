package chaos

import (
	"context"
	"fmt"
	"sort"
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
    k text := COALESCE(OLD.flow_key, OLD.args ->> 'flow_key');
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
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_flow_log AFTER UPDATE OR DELETE ON fenceq_jobs_hot FOR EACH ROW
    WHEN (OLD.flow_key IS NOT NULL OR OLD.args ? 'flow_key')
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
	return out
}

// flowEvent is one row of the lease history.
type flowEvent struct {
	job     int64
	key     string
	attempt int
	start   bool
	state   string
	at      time.Time
	txAt    time.Time
}

// checkFlow computes the flow report from the lease history and the jobs' final states.
func checkFlow(ctx context.Context, db queue.DBTX) (*FlowReport, error) {
	rows, err := db.Query(ctx, `
SELECT job_id, key, attempt, event = 'start', state, at, tx_at FROM chaos_flow_log ORDER BY at, event = 'start'`)
	if err != nil {
		return nil, fmt.Errorf("chaos: flow report: %w", err)
	}
	var events []flowEvent
	for rows.Next() {
		var e flowEvent
		if err := rows.Scan(&e.job, &e.key, &e.attempt, &e.start, &e.state, &e.at, &e.txAt); err != nil {
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
	return judgeFlow(events, seq), nil
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
