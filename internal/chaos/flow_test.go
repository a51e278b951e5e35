package chaos

import (
	"testing"
	"time"
)

// The flow checks find what they are built to find, from lease histories made up to
// break each limit once, and pass the same histories kept within the limits.
func TestJudgeFlowFindsEachViolation(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	start := func(job int64, key string, ms int) flowEvent {
		return flowEvent{job: job, key: key, attempt: 1, start: true, at: at(ms), txAt: at(ms)}
	}
	end := func(job int64, key string, ms int) flowEvent {
		return flowEvent{job: job, key: key, attempt: 1, at: at(ms), txAt: at(ms)}
	}
	conc, seq, rate := flowConcLimit+":p0", flowSeqLimit+":p0", flowRateLimit+":p0"
	fin := func(ms int) *time.Time { t := at(ms); return &t }

	// Within the limits: two of conc at once, the sequence in order, four starts in a
	// second of rate.
	ok := []flowEvent{
		start(1, conc, 0), start(2, conc, 1), end(1, conc, 10), start(3, conc, 11),
		start(10, seq, 0), end(10, seq, 5), start(11, seq, 6),
		start(20, rate, 0), start(21, rate, 100), start(22, rate, 200), start(23, rate, 300), start(24, rate, 1000),
	}
	seqJobs := map[string][]seqJob{seq: {{id: 10, finished: fin(5)}, {id: 11, finished: fin(20)}}}
	if r := judgeFlow(ok, seqJobs); len(r.failures()) != 0 || r.ConcurrencyChecked != 3 || r.SequenceChecked != 2 || r.RateChecked != 5 {
		t.Fatalf("history within the limits: %+v, failures %v", r, r.failures())
	}

	// A third lease of conc at once, job 11 started before job 10 finished, a fifth
	// start within a second.
	bad := []flowEvent{
		start(1, conc, 0), start(2, conc, 1), start(3, conc, 2),
		start(10, seq, 0), start(11, seq, 3),
		start(20, rate, 0), start(21, rate, 100), start(22, rate, 200), start(23, rate, 300), start(24, rate, 999),
	}
	seqJobs = map[string][]seqJob{seq: {{id: 10, finished: fin(50)}, {id: 11, finished: fin(60)}}}
	r := judgeFlow(bad, seqJobs)
	if r.ConcurrencyViolations != 1 || r.SequenceViolations != 2 || r.RateViolations != 1 {
		t.Fatalf("history breaking each limit once: %+v, want 1 concurrency, 2 sequence (two leases at once, and "+
			"a start before its predecessor finished), 1 rate violation", r)
	}
	// A run that checked nothing fails too.
	if f := judgeFlow(nil, nil).failures(); len(f) != 3 {
		t.Fatalf("empty history: failures %v, want one per limit", f)
	}
}

// The flow workload under faults: the fenced workers keep every limit, checked against
// the lease history the database recorded; the naive baseline, which enforces the
// limits per process, breaks them, so the checks can fail.
func TestFlowWorkload(t *testing.T) {
	t.Parallel()
	wl := WorkloadConfig{Flow: true, FlowJobs: 3, WaveEvery: 2 * time.Second}
	for _, naive := range []bool{false, true} {
		t.Run(map[bool]string{false: "fenced", true: "naive"}[naive], func(t *testing.T) {
			t.Parallel()
			rep := runChaos(t, Config{
				Env:      EnvConfig{Workers: 3, Concurrency: 3, Naive: naive},
				Workload: wl,
				Seed:     5, Duration: 10 * time.Second, Faults: []FaultType{FaultPause},
			})
			f := rep.Flow
			if f == nil || f.ConcurrencyChecked == 0 || f.SequenceChecked == 0 || f.RateChecked == 0 {
				t.Fatalf("flow report %+v: every limit must have been checked", f)
			}
			if !naive {
				requireFired(t, rep, FaultPause)
				requirePass(t, rep)
				if !f.Graphs || f.DependencyChecked == 0 || f.Batches == 0 || f.Waits == 0 {
					t.Fatalf("flow report %+v: the workflows, batches and signal waits must have been checked", f)
				}
				if rep.Revocations == 0 {
					t.Fatal("no lease was revoked: the pause did not test that a revoked lease frees its slot")
				}
				return
			}
			if rep.Pass || f.ConcurrencyViolations == 0 || f.SequenceViolations == 0 || f.RateViolations == 0 {
				t.Fatalf("the naive baseline kept the limits (%+v): the checks cannot tell it from fenceq", f)
			}
		})
	}
}
