package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
)

// tiny is a benchmark config small enough for a test: the point is the benchmark's own
// correctness (every job worked exactly once, figures present and consistent), never
// its speed.
func tiny(t *testing.T, workload string) Config {
	t.Helper()
	return Config{
		Workload:    workload,
		DatabaseURL: fenceqtest.RequireServerURL(t),
		Jobs:        500,
		Duration:    time.Second,
		Rate:        200,
		Workers:     50,
		Conns:       4,
		Runs:        1,
	}
}

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run %s: %v", cfg.Workload, err)
	}
	assertSchemasDropped(t, rep)
	return rep
}

func assertSchemasDropped(t *testing.T, rep *Report) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, fenceqtest.RequireServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, s := range rep.Systems {
		for _, r := range s.Runs {
			if !strings.HasPrefix(r.Schema, "fq_bench_") {
				t.Fatalf("%s run %d: schema %q not recorded", s.Name, r.Run, r.Schema)
			}
			var n int
			if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, r.Schema).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("schema %s of %s run %d was not dropped", r.Schema, s.Name, r.Run)
			}
		}
	}
}

func sideOf(t *testing.T, rep *Report, name string) *SystemReport {
	t.Helper()
	for _, s := range rep.Systems {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("report has no %s side; sides: %d", name, len(rep.Systems))
	return nil
}

// assertFigures checks what every run of every side must carry: positive headline
// figures, the pg_stat figures, and summaries consistent with the runs.
func assertFigures(t *testing.T, rep *Report, runs int) {
	t.Helper()
	for _, s := range rep.Systems {
		if s.Config == "" {
			t.Errorf("%s: configuration not described", s.Name)
		}
		if len(s.Runs) != runs {
			t.Fatalf("%s: %d runs, want %d", s.Name, len(s.Runs), runs)
		}
		for _, m := range Metrics(rep.Workload) {
			sum, ok := s.Summary[m]
			if !ok {
				t.Errorf("%s: no summary of %s", s.Name, m)
				continue
			}
			if sum.Min > sum.Median || sum.Median > sum.Max {
				t.Errorf("%s %s: min %v, median %v, max %v out of order", s.Name, m, sum.Min, sum.Median, sum.Max)
			}
		}
		for _, m := range append(workloadMetrics[rep.Workload], MetricJobs, MetricSeconds, MetricWALPerJob, MetricCommitsPerJob) {
			for _, r := range s.Runs {
				if r.Metrics[m] <= 0 {
					t.Errorf("%s run %d: %s = %v, want > 0", s.Name, r.Run, m, r.Metrics[m])
				}
			}
		}
	}
	var text, js bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Systems {
		if !strings.Contains(text.String(), s.Name+": "+s.Config) {
			t.Errorf("text report does not state %s's configuration:\n%s", s.Name, text.String())
		}
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON report does not parse back: %v", err)
	}
	if back.Workload != rep.Workload || len(back.Systems) != len(rep.Systems) {
		t.Errorf("JSON report lost its content: %s", js.String())
	}
}

func TestDrainAllSides(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	cfg.Vs, cfg.Ceiling, cfg.Runs, cfg.Checkpoint = SystemRiver, true, 2, true
	rep := run(t, cfg)
	if !rep.Settings.Checkpoint || !strings.Contains(rep.settingsLine(), "CHECKPOINT before each run") {
		t.Errorf("report does not say a checkpoint preceded each run: %s", rep.settingsLine())
	}
	assertFigures(t, rep, 2)
	for _, s := range rep.Systems {
		for _, r := range s.Runs {
			if r.Metrics[MetricJobs] != float64(cfg.Jobs) {
				t.Errorf("%s run %d worked %v jobs, want %d", s.Name, r.Run, r.Metrics[MetricJobs], cfg.Jobs)
			}
		}
	}
	// The ceiling updates each job of its table exactly twice: the claim and the
	// completion. fenceq updates each job of the hot set once, at its claim: the
	// completion moves it to history. The statistics must show it.
	for name, want := range map[string]float64{SystemFenceq: 1, SystemCeiling: 2} {
		if u := sideOf(t, rep, name).Summary[MetricUpdatesPerJob].Median; u < want-0.01 || u > want+0.01 {
			t.Errorf("%s: %v updates per job of %s, want %v", name, u, map[string]string{SystemFenceq: "the hot set", SystemCeiling: "its table"}[name], want)
		}
	}
	if len(rep.Ratios) != 2 {
		t.Fatalf("ratios %+v, want fenceq/river and fenceq/bare-sql", rep.Ratios)
	}
	for _, q := range rep.Ratios {
		want := sideOf(t, rep, q.Of).Summary[q.Metric].Median / sideOf(t, rep, q.To).Summary[q.Metric].Median
		if q.Of != SystemFenceq || q.Value != want {
			t.Errorf("ratio %+v, want fenceq first and value %v", q, want)
		}
	}
	// Runs are numbered in order and alternate which side goes first.
	f, r := sideOf(t, rep, SystemFenceq).Runs, sideOf(t, rep, SystemRiver).Runs
	if f[0].Run != 1 || f[1].Run != 2 {
		t.Errorf("runs not numbered in order: %+v", f)
	}
	if !(f[0].Order < r[0].Order) || !(r[1].Order < f[1].Order) {
		t.Errorf("sides did not alternate: fenceq ran at %d, %d; river at %d, %d",
			f[0].Order, f[1].Order, r[0].Order, r[1].Order)
	}
}

func TestFencedCommitsResultsWithCompletion(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadFenced)
	cfg.Vs, cfg.Jobs, cfg.Ceiling = SystemRiver, 300, true
	// runOnce already fails the run unless every completed job has exactly one result
	// row and one outbox row; here the figures must be there too.
	rep := run(t, cfg)
	if len(rep.Systems) != 3 {
		t.Fatalf("%d sides, want fenceq, river and the bare-SQL ceiling", len(rep.Systems))
	}
	assertFigures(t, rep, 1)
	for _, s := range rep.Systems {
		if got := s.Runs[0].Metrics[MetricJobs]; got != 300 {
			t.Errorf("%s: %v jobs, want 300", s.Name, got)
		}
		// One commit per job at least: the fenced transaction.
		if c := s.Summary[MetricCommitsPerJob].Median; c < 1 {
			t.Errorf("%s: %v commits per job, want at least 1", s.Name, c)
		}
	}
}

// With CommitWrites the fenced handler's rows and completion go in one pipeline; the
// run's own check (one result row and one outbox row per completed job) holds, and the
// report says which call fenceq used.
func TestFencedThroughCommitWrites(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadFenced)
	cfg.Jobs, cfg.CommitWrites = 300, true
	rep := run(t, cfg)
	assertFigures(t, rep, 1)
	if got := rep.Systems[0].Runs[0].Metrics[MetricJobs]; got != 300 {
		t.Errorf("%v jobs, want 300", got)
	}
	if !rep.Settings.CommitWrites || !strings.Contains(rep.Systems[0].Config, "Job.CommitWrites") {
		t.Errorf("settings %+v, config %q: the report does not name Job.CommitWrites", rep.Settings, rep.Systems[0].Config)
	}
}

func TestSteadyInsertsWhileWorking(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadSteady)
	cfg.Vs = SystemRiver
	rep := run(t, cfg)
	assertFigures(t, rep, 1)
	for _, s := range rep.Systems {
		r := s.Runs[0]
		if r.Metrics[MetricSeconds] < cfg.Duration.Seconds() {
			t.Errorf("%s ran %vs, want at least %v", s.Name, r.Metrics[MetricSeconds], cfg.Duration)
		}
	}
}

func TestLatencyPercentiles(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadLatency)
	cfg.Vs = SystemRiver
	rep := run(t, cfg)
	assertFigures(t, rep, 1)
	for _, s := range rep.Systems {
		m := s.Runs[0].Metrics
		if m[MetricPickupP50] > m[MetricP50] || m[MetricPickupP50] > m[MetricPickupP99] {
			t.Errorf("%s: pickup latency (from the committed enqueue) p50 %v, p99 %v; enqueue→start p50 %v",
				s.Name, m[MetricPickupP50], m[MetricPickupP99], m[MetricP50])
		}
		if !(m[MetricP50] <= m[MetricP95] && m[MetricP95] <= m[MetricP99] && m[MetricP99] <= m[MetricMaxMs]) {
			t.Errorf("%s: percentiles out of order: %v", s.Name, m)
		}
		if m[MetricJobs] != float64(cfg.Rate)*cfg.Duration.Seconds() {
			t.Errorf("%s: %v jobs, want rate × duration = %v", s.Name, m[MetricJobs], float64(cfg.Rate)*cfg.Duration.Seconds())
		}
	}
}

func TestInsertBothPaths(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadInsert)
	cfg.Vs = SystemRiver
	rep := run(t, cfg)
	assertFigures(t, rep, 1)
	for _, s := range rep.Systems {
		if got := s.Runs[0].Metrics[MetricJobs]; got != 550 {
			t.Errorf("%s: %v jobs inserted, want 500 by COPY + 50 single", s.Name, got)
		}
	}
}

func TestRetainedAndIdleTransaction(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	cfg.Retained, cfg.IdleXact = 2000, 5*time.Second
	rep := run(t, cfg)
	assertFigures(t, rep, 1)
	// The retained jobs are not worked (they are finished); the run's own jobs all are.
	if got := rep.Systems[0].Runs[0].Metrics[MetricJobs]; got != 500 {
		t.Errorf("%v jobs worked, want 500", got)
	}
	// The idle transaction pins the horizon: the old versions of the claimed and
	// completed rows cannot be pruned, so dead tuples remain.
	if d := rep.Systems[0].Runs[0].Metrics[MetricDeadTuples]; d < 500 {
		t.Errorf("%v dead tuples with the horizon pinned, want at least one per job", d)
	}
	if !strings.Contains(rep.settingsLine(), "2000 finished jobs retained") {
		t.Errorf("settings line does not mention the retained jobs: %s", rep.settingsLine())
	}
}

// fenceq's retained jobs are in history's range partitions, none in the default one,
// and counted in the job counters before the run, as the workers that finished them
// would have counted them.
func TestFenceqRetainPartitionsAndCounts(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	ctx := context.Background()
	e, err := newEnv(ctx, cfg, "fenceq")
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	s := newFenceqSystem(cfg)
	if err := s.setup(ctx, e); err != nil {
		t.Fatal(err)
	}
	// The ids taken next start 500 below the end of the partitions made so far: the rest
	// need partitions made for them.
	if _, err := e.admin.Exec(ctx, `SELECT setval(pg_get_serial_sequence('fenceq_jobs_hot', 'id'),
		(SELECT max(to_id) FROM fenceq_history_partitions()) - 500)`); err != nil {
		t.Fatal(err)
	}
	if err := s.retain(ctx, e, 1, 1500); err != nil {
		t.Fatal(err)
	}
	var inDefault, counted int64
	if err := e.admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM fenceq_jobs_history_default),
		(SELECT coalesce(sum(jobs), 0) FROM fenceq_job_counts)`).Scan(&inDefault, &counted); err != nil {
		t.Fatal(err)
	}
	if inDefault != 0 || counted != 1500 {
		t.Fatalf("after retaining 1500 jobs: %d in the default partition (want 0), %d counted (want 1500)", inDefault, counted)
	}
}

func TestConfigErrorsNameTheSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Workload: "sprint"}, `workload "sprint"`},
		{Config{Workload: WorkloadDrain, Vs: "sidekiq"}, `--vs "sidekiq"`},
		{Config{Workload: WorkloadDrain, Runs: -1}, "runs"},
		{Config{Workload: WorkloadDrain, Retained: -5}, "retained"},
		{Config{Workload: WorkloadDrain, IdleXact: -time.Second}, "idle-xact"},
		{Config{Workload: WorkloadDrain, Queues: -2}, "queues"},
		{Config{Workload: WorkloadDrain, ArgsBytes: -1}, "args bytes"},
		{Config{Workload: WorkloadDrain, JobSleep: -time.Second}, "job sleep"},
		{Config{Workload: WorkloadDrain, Conns: 5000}, "conns"},
		{Config{Workload: WorkloadLayout, NoSearchIndexes: true}, "--no-search-indexes"},
	} {
		_, err := Run(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %+v: error %v, want one naming %s", tc.cfg, err, tc.want)
		}
	}
}

func TestCheckCatchesBrokenInvariants(t *testing.T) {
	t.Parallel()
	ok := measured{inserted: 10, completed: 10, all: true}
	if err := ok.check(10, 10, 10); err != nil {
		t.Fatalf("consistent run rejected: %v", err)
	}
	for name, c := range map[string][3]int64{
		"lost row":       {9, 9, 9},
		"not completed":  {10, 9, 9},
		"worked twice":   {10, 10, 9},
		"count mismatch": {10, 11, 11},
	} {
		if err := ok.check(c[0], c[1], c[2]); !errors.Is(err, errVerify) {
			t.Errorf("%s: check(%v) = %v, want errVerify", name, c, err)
		}
	}
}

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	vals := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]float64{50: 5, 95: 10, 99: 10, 10: 1} {
		if got := percentile(vals, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if s := summarize([]float64{4, 1, 2}); s.Median != 2 || s.Spread != 4 {
		t.Errorf("summarize = %+v, want median 2 and max/min 4", s)
	}
}

func TestTraceSQLShowsTheStatementsOfTheRun(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	var progress bytes.Buffer
	cfg.Jobs, cfg.TraceSQL, cfg.Progress = 200, true, &progress
	run(t, cfg)
	out := progress.String()
	for _, want := range []string{"fenceq run 1: statements by total time", "WITH q AS MATERIALIZED", "unnest($1::bigint[]"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
}

// A pool larger than the server's free connections fails before any run, naming the
// setting and the server's limit.
func TestConnsBeyondTheServersLimit(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	var maxConn int
	err = c.QueryRow(ctx, `SELECT current_setting('max_connections')::int`).Scan(&maxConn)
	_ = c.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// This test's own connection is in use, so max_connections is more than is free. A
	// server that allows more than the bench's own limit gets that limit's error.
	cfg.Conns = maxConn
	want := []string{fmt.Sprintf("conns: %d needs", maxConn), "max_connections"}
	if maxConn > maxConns {
		want = []string{fmt.Sprintf("conns: %d is more than %d", maxConn, maxConns)}
	}
	_, err = Run(ctx, cfg)
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Fatalf("run with a pool of %d: error %v, want one naming %q", cfg.Conns, err, w)
		}
	}
}

// Each side spreads the jobs over the queues round robin and pads their args to the
// asked size, stored at full size (the padding does not compress).
func TestQueuesAndArgsPadding(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	cfg.Queues, cfg.ArgsBytes = 7, 5000
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range []system{newFenceqSystem(cfg), newRiverSystem(cfg)} {
		e, err := newEnv(ctx, cfg, s.name())
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer e.close()
			if err := s.setup(ctx, e); err != nil {
				t.Fatal(err)
			}
			if err := prefill(ctx, e, s, kindNoop, 0, 70, "test"); err != nil {
				t.Fatalf("%s: %v", s.name(), err)
			}
			var queues, perQueueMin, perQueueMax, minSize int
			q := `SELECT count(DISTINCT queue), min(n), max(n), min(size) FROM (
			    SELECT queue, count(*) OVER (PARTITION BY queue) AS n, pg_column_size(args) AS size FROM ` + s.jobTable() + `) x`
			if err := e.admin.QueryRow(ctx, q).Scan(&queues, &perQueueMin, &perQueueMax, &minSize); err != nil {
				t.Fatal(err)
			}
			if queues != 7 || perQueueMin != 10 || perQueueMax != 10 {
				t.Errorf("%s: %d queues of %d–%d jobs, want 7 of 10", s.name(), queues, perQueueMin, perQueueMax)
			}
			if minSize < 5000 {
				t.Errorf("%s: args stored in %d bytes, want at least the 5000 of the padding", s.name(), minSize)
			}
		}()
	}
}

// Jobs that sleep make many run at once; the run reports how many, the memory per
// 1,000 of them and the allocations per job.
func TestJobSleepReportsMemoryPerRunningJob(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	cfg.Jobs, cfg.Workers, cfg.JobSleep = 300, 150, time.Second
	rep := run(t, cfg)
	if len(rep.Systems) != 1 {
		t.Fatalf("%d sides, want fenceq alone (the bare-SQL ceiling runs no handlers)", len(rep.Systems))
	}
	m := rep.Systems[0].Runs[0].Metrics
	if m[MetricJobs] != 300 {
		t.Fatalf("%v jobs worked, want 300", m[MetricJobs])
	}
	if p := m[MetricPeakRunning]; p < minRunningForMemory || p > 150 {
		t.Fatalf("peak of %v jobs running at once, want between %d and the 150 slots", p, minRunningForMemory)
	}
	for _, k := range []string{MetricRSSPeakMB, MetricGoMemPer1kRunning, MetricAllocsPerJob, MetricAllocBytesPerJob} {
		if v, ok := m[k]; !ok || v <= 0 {
			t.Errorf("%s = %v (reported %v), want a positive figure", k, v, ok)
		}
	}
	if _, ok := m[MetricRSSPer1kRunning]; !ok {
		t.Errorf("no %s", MetricRSSPer1kRunning)
	}
	if !strings.Contains(rep.settingsLine(), "each job sleeping 1s") {
		t.Errorf("settings line does not mention the sleep: %s", rep.settingsLine())
	}
}

func TestQueueNamesAndPadding(t *testing.T) {
	t.Parallel()
	if got := benchQueueNames(1); len(got) != 1 || got[0] != "default" {
		t.Errorf("one queue: %v, want [default]", got)
	}
	c := Config{Workload: WorkloadDrain, Queues: 3}.withDefaults()
	for seq, want := range map[int64]string{0: "bench_0000", 4: "bench_0001", -5: "bench_0002"} {
		if got := c.queueOf(seq); got != want {
			t.Errorf("queueOf(%d) = %s, want %s", seq, got, want)
		}
	}
	p := argsPadding(1000)
	if len(p) != 1000 || p != argsPadding(1000) || strings.Trim(p, padAlphabet) != "" {
		t.Errorf("padding of 1000: %d bytes, reproducible %v, outside the alphabet %q",
			len(p), p == argsPadding(1000), strings.Trim(p, padAlphabet))
	}
}

// With SplitWorkers, Workers is the total: each queue of each side gets its share.
func TestSplitWorkersOverQueues(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	cfg.Vs, cfg.Jobs, cfg.Queues, cfg.Workers, cfg.SplitWorkers = SystemRiver, 400, 4, 8, true
	rep := run(t, cfg)
	assertFigures(t, rep, 1)
	if rep.Settings.Workers != 2 || !strings.Contains(rep.settingsLine(), "4 queues of 2 workers (8 split over them)") {
		t.Errorf("settings %+v, line %q: want 4 queues of 2 workers", rep.Settings, rep.settingsLine())
	}
	for _, s := range rep.Systems {
		if !strings.Contains(s.Config, "MaxWorkers=2") {
			t.Errorf("%s: configuration %q does not give each queue 2 workers", s.Name, s.Config)
		}
		m := s.Runs[0].Metrics
		if m[MetricJobs] != 400 {
			t.Errorf("%s: %v jobs, want 400", s.Name, m[MetricJobs])
		}
		if p := m[MetricPeakRunning]; p > 8 {
			t.Errorf("%s: %v jobs ran at once, more than the 8 slots in all", s.Name, p)
		}
	}
}

// CompareQueues measures each side on one queue and on N queues in one invocation
// and divides their medians.
func TestCompareQueues(t *testing.T) {
	t.Parallel()
	cfg := tiny(t, WorkloadDrain)
	cfg.Vs, cfg.Jobs, cfg.Workers, cfg.CompareQueues = SystemRiver, 300, 8, 4
	rep := run(t, cfg)
	assertFigures(t, rep, 1)
	var names []string
	for _, s := range rep.Systems {
		names = append(names, s.Name)
		if got := s.Runs[0].Metrics[MetricJobs]; got != 300 {
			t.Errorf("%s: %v jobs, want 300", s.Name, got)
		}
	}
	if strings.Join(names, ",") != "fenceq/1q,fenceq/4q,river/1q,river/4q" {
		t.Fatalf("sides %v, want fenceq and river on 1 and 4 queues", names)
	}
	if !strings.Contains(sideOf(t, rep, "fenceq/1q").Config, "queue default MaxWorkers=8") ||
		!strings.Contains(sideOf(t, rep, "river/4q").Config, "4 queues (jobs round robin), each MaxWorkers=2") {
		t.Errorf("configurations do not split the 8 slots: %q, %q", sideOf(t, rep, "fenceq/1q").Config, sideOf(t, rep, "river/4q").Config)
	}
	if len(rep.Ratios) != 4 {
		t.Fatalf("ratios %+v, want 4q/1q of each side and fenceq/river on each", rep.Ratios)
	}
	q := rep.Ratios[0]
	want := sideOf(t, rep, "fenceq/4q").Summary[MetricJobsPerSec].Median / sideOf(t, rep, "fenceq/1q").Summary[MetricJobsPerSec].Median
	if q.Of != "fenceq/4q" || q.To != "fenceq/1q" || q.Value != want || q.Value <= 0 {
		t.Errorf("first ratio %+v, want fenceq/4q over fenceq/1q = %v", q, want)
	}
}

func TestSlotErrorsNameTheFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want []string
	}{
		{Config{Workload: WorkloadDrain, Workers: 10, Queues: 3, SplitWorkers: true}, []string{"--workers 10", "--queues 3", "multiple"}},
		{Config{Workload: WorkloadDrain, Workers: 2, Queues: 4, SplitWorkers: true}, []string{"--workers 2", "--queues 4"}},
		{Config{Workload: WorkloadInsert, SplitWorkers: true}, []string{"--split-workers", "insert"}},
		{Config{Workload: WorkloadDrain, Workers: 10, CompareQueues: 3}, []string{"--workers 10", "--compare-queues 3"}},
		{Config{Workload: WorkloadFenced, CompareQueues: 10}, []string{"--compare-queues", "fenced"}},
		{Config{Workload: WorkloadDrain, Queues: 5, CompareQueues: 10}, []string{"--compare-queues 10", "--queues 5"}},
	} {
		_, err := Run(context.Background(), tc.cfg)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("config %+v: error %v, want one naming %q", tc.cfg, err, w)
			}
		}
	}
}

// idle measures each side on 1 queue and on N in a database of its own, which it
// drops at the end.
func TestIdleMeasuresOwnDatabase(t *testing.T) {
	t.Parallel()
	cfg := Config{
		Workload:    WorkloadIdle,
		DatabaseURL: fenceqtest.RequireServerURL(t),
		Vs:          SystemRiver,
		Processes:   2,
		Queues:      3,
		Runs:        1,
		Duration:    2 * time.Second,
		idleWarmup:  time.Second,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rep.Systems {
		names = append(names, s.Name)
		m := s.Runs[0].Metrics
		// Every worker polls each of its queues and keeps its leases and presence
		// fresh: with nothing to do it still sends statements and commits.
		for _, k := range []string{MetricXactPerSec, MetricStmtsPerSec, MetricClaimsPerSec} {
			if m[k] <= 0 {
				t.Errorf("%s: %s = %v, want > 0", s.Name, k, m[k])
			}
		}
		if m[MetricSeconds] < 2 {
			t.Errorf("%s: measured %vs, want at least the 2s asked", s.Name, m[MetricSeconds])
		}
		if !strings.HasPrefix(s.Runs[0].Schema, idleDatabasePrefix) {
			t.Errorf("%s: run recorded database %q", s.Name, s.Runs[0].Schema)
		}
	}
	if strings.Join(names, ",") != "fenceq/1q,fenceq/3q,river/1q,river/3q" {
		t.Fatalf("sides %v", names)
	}
	if len(rep.Ratios) != 12 || rep.Ratios[0].Of != "fenceq/3q" || rep.Ratios[0].To != "fenceq/1q" || rep.Ratios[0].Value <= 0 {
		t.Errorf("ratios %+v, want 3q/1q of each side and fenceq/river on each, for 3 metrics", rep.Ratios)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 processes, each with a pool of 2 conns, serving 1 queue against 3 queues of 1 workers", "xact_per_sec", "fenceq/3q/fenceq/1q"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	c, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, rep.Systems[0].Runs[0].Schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %s was not dropped", rep.Systems[0].Runs[0].Schema)
	}
}

// A role that may not create databases gets an error naming the privilege. Not
// parallel: the idle run of TestIdleMeasuresOwnDatabase uses the same database name.
func TestIdleNeedsCreatedb(t *testing.T) {
	url := fenceqtest.RequireServerURL(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	role := fmt.Sprintf("fq_bench_nocreatedb_%d", time.Now().UnixNano())
	if _, err := c.Exec(ctx, "CREATE ROLE "+role+" LOGIN NOCREATEDB"); err != nil {
		t.Skipf("cannot create a role to test with: %v", err)
	}
	defer func() { _, _ = c.Exec(ctx, "DROP ROLE "+role) }()
	pc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	roleURL := fmt.Sprintf("host=%s port=%d dbname=%s user=%s sslmode=disable", pc.Host, pc.Port, pc.Database, role)
	_, err = Run(ctx, Config{Workload: WorkloadIdle, DatabaseURL: roleURL, Runs: 1})
	if err == nil || !strings.Contains(err.Error(), "CREATEDB") {
		t.Fatalf("idle as a role without CREATEDB: error %v, want one naming the privilege", err)
	}
}

// Every layout drains its jobs exactly once (layoutOnce verifies it) and reports the
// figures of each: blocks per claim and per job, WAL, vacuum work and hot pages.
func TestLayoutAllLayouts(t *testing.T) {
	t.Parallel()
	cfg := Config{
		Workload:    WorkloadLayout,
		DatabaseURL: fenceqtest.RequireServerURL(t),
		Jobs:        3000,
		Retained:    2000,
		Runs:        1,
		Checkpoint:  true,
	}
	rep := run(t, cfg)
	var names []string
	for _, s := range rep.Systems {
		names = append(names, s.Name)
		if s.Config == "" {
			t.Errorf("%s: not described", s.Name)
		}
		m := s.Runs[0].Metrics
		if m[MetricJobs] != 3000 {
			t.Errorf("%s: %v jobs, want 3000", s.Name, m[MetricJobs])
		}
		// 3,000 jobs in claims of at most 1,000.
		if m[MetricClaims] < 3 {
			t.Errorf("%s: %v claims for 3000 jobs, want at least 3", s.Name, m[MetricClaims])
		}
		for _, k := range []string{MetricJobsPerSec, MetricWALPerJob, MetricHeapBlksPerClaim, MetricIdxBlksPerClaim,
			MetricHeapBlksPerJob, MetricIdxBlksPerJob, MetricExplainBlksPerClaim, MetricHotPagesBefore, MetricHotPagesAfter} {
			if m[k] <= 0 {
				t.Errorf("%s: %s = %v, want > 0", s.Name, k, m[k])
			}
		}
		for _, k := range []string{MetricVacuumMs, MetricClaimRetries} {
			if _, ok := m[k]; !ok {
				t.Errorf("%s: no %s", s.Name, k)
			}
		}
		// Each job's completion leaves at least one dead row version behind (the claimed
		// version, or the deleted hot row), until VACUUM.
		if m[MetricDeadTuples] < 3000 {
			t.Errorf("%s: %v dead tuples after draining 3000 jobs", s.Name, m[MetricDeadTuples])
		}
		if m[MetricHeapBlksPerClaim] < m[MetricHeapBlksPerJob] {
			t.Errorf("%s: %v heap blocks per claim, fewer than the %v per job", s.Name, m[MetricHeapBlksPerClaim], m[MetricHeapBlksPerJob])
		}
	}
	if strings.Join(names, ",") != "single,split,partitioned,narrow,heaponly,leaseset" {
		t.Fatalf("layouts %v", names)
	}
	// The claim updates every job once (the completions of split and heaponly delete,
	// those of the others update again). Only heaponly's claim can be heap-only, and
	// with half of each page free most of them are; every other layout's updates
	// change an indexed column, so none is.
	for _, s := range rep.Systems {
		pct, ok := s.Runs[0].Metrics[MetricHOTPct]
		switch {
		case !ok:
			t.Errorf("%s: no %s", s.Name, MetricHOTPct)
		case s.Name == LayoutHeapOnly && pct < 50:
			t.Errorf("%s: %.1f%% of updates heap-only, want most", s.Name, pct)
		case s.Name != LayoutHeapOnly && pct != 0:
			t.Errorf("%s: %.1f%% of updates heap-only, want none", s.Name, pct)
		}
	}
	// A heap-only claim writes no index entry: heaponly touches fewer index blocks per
	// job than split, whose claim adds a primary-key and a lease-index entry per job.
	if h, s := sideOf(t, rep, LayoutHeapOnly).Runs[0].Metrics[MetricIdxBlksPerJob],
		sideOf(t, rep, LayoutSplit).Runs[0].Metrics[MetricIdxBlksPerJob]; h >= s {
		t.Errorf("index blocks per job: heaponly %v, split %v; want fewer for heaponly", h, s)
	}
	// A lease-set claim writes no job row: the only rows it updates are its claimer's
	// lease, one per claim after the claimer's first, where split's claims update every
	// job once (and the claim explained mid-drain updates rows of its own, counted though
	// rolled back). It writes no lease-index or primary-key entry per job either, so it
	// touches fewer index blocks per job.
	split, leases := sideOf(t, rep, LayoutSplit).Runs[0].Metrics, sideOf(t, rep, LayoutLeaseSet).Runs[0].Metrics
	if u := split[MetricUpdatesPerJob]; u < 1 {
		t.Errorf("split: %v updates per job, want at least 1 (the claim)", u)
	}
	if u, most := leases[MetricUpdatesPerJob], leases[MetricClaims]/leases[MetricJobs]; u > most {
		t.Errorf("leaseset: %v updates per job, want at most one per claim (%v per job)", u, most)
	}
	if l, s := leases[MetricIdxBlksPerJob], split[MetricIdxBlksPerJob]; l >= s {
		t.Errorf("index blocks per job: leaseset %v, split %v; want fewer for leaseset", l, s)
	}
	// The drain grows the hot tables of single (every completed row stays) and of split
	// (dead versions until VACUUM); VACUUM shrinks none. How much VACUUM can truncate
	// depends on the oldest snapshot on the whole server, so it is not asserted.
	for _, name := range []string{LayoutSingle, LayoutSplit} {
		m := sideOf(t, rep, name).Runs[0].Metrics
		if m[MetricHotPagesAfter] <= m[MetricHotPagesBefore] || m[MetricHotPagesVacuumed] > m[MetricHotPagesAfter] {
			t.Errorf("%s: hot pages %v before the drain, %v after, %v vacuumed", name,
				m[MetricHotPagesBefore], m[MetricHotPagesAfter], m[MetricHotPagesVacuumed])
		}
	}
	if len(rep.Ratios) != (len(Layouts)-1)*len(ratioMetrics[WorkloadLayout]) || rep.Ratios[0].To != LayoutSingle || rep.Ratios[0].Of != LayoutSplit {
		t.Errorf("ratios %+v, want each layout over single", rep.Ratios)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"3000 jobs drained by 2 claimers", "2000 finished jobs retained", "idx_blks_per_claim", "split/single"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

func TestLayoutErrorsNameTheFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		layouts []string
		want    string
	}{
		{[]string{"single", "heap"}, `--layouts: "heap" is not a layout`},
		{[]string{"split", "split"}, `--layouts: "split" named twice`},
	} {
		_, err := Run(context.Background(), Config{Workload: WorkloadLayout, Layouts: tc.layouts})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("layouts %v: error %v, want %q", tc.layouts, err, tc.want)
		}
	}
}

// --no-search-indexes drops every index of history that a migration creates but the
// primary key and the finished_at index: the list names each search index the
// migrations create, and a drain runs on the schema without them.
func TestNoSearchIndexes(t *testing.T) {
	t.Parallel()
	db := fenceqtest.New(t, nil)
	rows, err := db.Pool.Query(context.Background(),
		`SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'fenceq_jobs_history'`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := append([]string{"fenceq_jobs_history_pkey", "fenceq_jobs_history_finished_idx"}, searchIndexes...)
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("history's indexes %v; the primary key, finished_at and searchIndexes are %v", names, want)
	}
	// The set-up of fenceq's side leaves history only those two.
	cfg := Config{Workload: WorkloadDrain, DatabaseURL: fenceqtest.RequireServerURL(t), Jobs: 500, Runs: 1,
		NoSearchIndexes: true}
	ctx := context.Background()
	e, err := newEnv(ctx, cfg.withDefaults(), "nosearch")
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	if err := newFenceqSystem(cfg).setup(ctx, e); err != nil {
		t.Fatal(err)
	}
	rows, err = e.admin.Query(ctx,
		`SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'fenceq_jobs_history'`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"fenceq_jobs_history_finished_idx", "fenceq_jobs_history_pkey"}) {
		t.Errorf("history's indexes after the set-up without search indexes: %v", left)
	}
	rep := run(t, cfg)
	side := sideOf(t, rep, SystemFenceq)
	if side.Summary[MetricJobs].Median != 500 || !strings.Contains(side.Config, "search indexes dropped") {
		t.Errorf("drain without search indexes: %v jobs, config %q", side.Summary[MetricJobs].Median, side.Config)
	}
}
