package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/redact"
)

// Metric names, as keys of RunResult.Metrics and of the JSON report.
const (
	MetricJobsPerSec     = "jobs_per_sec"          // worked (completed) jobs per second
	MetricInsertedPerSec = "inserted_per_sec"      // steady: jobs inserted per second meanwhile
	MetricCopyPerSec     = "copy_insert_per_sec"   // insert: COPY batches of 5,000
	MetricSinglePerSec   = "single_insert_per_sec" // insert: single-row inserts, one per connection at a time
	MetricP50            = "p50_ms"                // latency: enqueue→start percentiles
	MetricP95            = "p95_ms"
	MetricP99            = "p99_ms"
	MetricMaxMs          = "max_ms"
	MetricMeanMs         = "mean_ms"
	MetricArrivalRate    = "arrival_per_sec" // latency: the rate actually offered
	// Latency from the moment the enqueue returned (its transaction committed, so its
	// commit's WAL flush is not counted) to the handler's start; negative when the job
	// started before the enqueue's reply arrived.
	MetricPickupP50     = "pickup_p50_ms"
	MetricPickupP99     = "pickup_p99_ms"
	MetricJobs          = "jobs"
	MetricSeconds       = "seconds"
	MetricWALPerJob     = "wal_bytes_per_job" // cluster-wide WAL, so other load on the server counts too
	MetricCommitsPerJob = "commits_per_job"   // pg_stat_database.xact_commit of the database
	MetricUpdatesPerJob = "updates_per_job"   // of the job table
	MetricHOTPct        = "hot_update_pct"    // share of the job table's updates that were HOT
	MetricDeadTuples    = "dead_tuples"       // of the job table at the end of the run
	// CPU time (user + system) of the bench process per job during the measured phase:
	// the side's workers plus the bench's own inserts (steady, latency), not the server's.
	MetricClientCPUPerJob = "client_cpu_us_per_job"
	// Heap allocations of the bench process per job during the measured phase, objects
	// and bytes (runtime.MemStats Mallocs and TotalAlloc): like the CPU time, the side's
	// workers plus the bench's own inserts.
	MetricAllocsPerJob     = "allocs_per_job"
	MetricAllocBytesPerJob = "alloc_bytes_per_job"
	// drain and fenced: the most jobs running at once (started by a handler, completion
	// not yet reported), and the bench process's largest resident set (VmRSS) meanwhile.
	MetricPeakRunning = "peak_running"
	MetricRSSPeakMB   = "rss_peak_mb"
	// drain and fenced with --job-sleep, when at least 100 jobs ran at once: how much
	// the resident set (VmRSS) and the Go heap objects and goroutine stacks (sampled
	// right after a collection) grew from the start of the measured phase to the moment
	// the most jobs were running, per 1,000 of them (MiB).
	MetricRSSPer1kRunning   = "rss_mb_per_1k_running"
	MetricGoMemPer1kRunning = "go_mb_per_1k_running"
	// idle: transactions of the workload's own database per second
	// (pg_stat_database.xact_commit + xact_rollback), the statements the workers sent
	// per second, and among them the claims.
	MetricXactPerSec   = "xact_per_sec"
	MetricStmtsPerSec  = "statements_per_sec"
	MetricClaimsPerSec = "claims_per_sec"
)

var workloadMetrics = map[string][]string{
	WorkloadInsert: {MetricCopyPerSec, MetricSinglePerSec},
	WorkloadDrain:  {MetricJobsPerSec},
	WorkloadFenced: {MetricJobsPerSec},
	WorkloadSteady: {MetricJobsPerSec, MetricInsertedPerSec},
	WorkloadIdle:   {MetricXactPerSec, MetricStmtsPerSec, MetricClaimsPerSec},
	WorkloadLayout: {MetricJobsPerSec, MetricWALPerJob, MetricHeapBlksPerClaim, MetricIdxBlksPerClaim,
		MetricHeapBlksPerJob, MetricIdxBlksPerJob, MetricExplainBlksPerClaim, MetricDeadTuples, MetricUpdatesPerJob, MetricHOTPct, MetricVacuumMs,
		MetricHotPagesBefore, MetricHotPagesAfter, MetricHotPagesVacuumed},
	WorkloadLatency: {MetricP50, MetricP95, MetricP99, MetricMeanMs, MetricMaxMs, MetricPickupP50, MetricPickupP99, MetricArrivalRate},
}

// ownMetrics are the figures of the idle and layout workloads besides their headline
// ones; they report none of the other workloads' per-job statistics.
var ownMetrics = map[string][]string{
	WorkloadIdle:   {MetricSeconds},
	WorkloadLayout: {MetricClaims, MetricClaimRetries, MetricJobs, MetricSeconds},
}

// ratioMetrics are the metrics whose medians a workload's ratios divide, where they
// are not its workloadMetrics.
var ratioMetrics = map[string][]string{
	WorkloadLayout: {MetricJobsPerSec, MetricWALPerJob, MetricHeapBlksPerJob, MetricIdxBlksPerJob},
}

var (
	// Reported by every run: the process's own costs, then the server's.
	processMetrics = []string{MetricJobs, MetricSeconds, MetricClientCPUPerJob, MetricAllocsPerJob, MetricAllocBytesPerJob}
	serverMetrics  = []string{MetricWALPerJob, MetricCommitsPerJob, MetricUpdatesPerJob, MetricHOTPct, MetricDeadTuples}
	// Reported by the runs of drain and fenced.
	runningMetrics = []string{MetricPeakRunning, MetricRSSPeakMB}
	// Reported by the runs of drain and fenced whose jobs sleep (Config.JobSleep).
	memoryMetrics = []string{MetricRSSPer1kRunning, MetricGoMemPer1kRunning}
)

// Metrics returns the metrics every run of a workload reports: its headline figures
// first, then the per-job statistics. Runs whose jobs sleep report memoryMetrics too.
func Metrics(workload string) []string {
	return metricsOf(workload, false)
}

// metricsOf returns the metrics of a workload in the report's order, with
// memoryMetrics where the workload has them and withMemory is set.
func metricsOf(workload string, withMemory bool) []string {
	switch workload {
	case WorkloadIdle, WorkloadLayout:
		return append(slices.Clone(workloadMetrics[workload]), ownMetrics[workload]...)
	}
	out := append(slices.Clone(workloadMetrics[workload]), processMetrics...)
	if workload == WorkloadDrain || workload == WorkloadFenced {
		out = append(out, runningMetrics...)
		if withMemory {
			out = append(out, memoryMetrics...)
		}
	}
	return append(out, serverMetrics...)
}

// RunResult is one run of one side.
type RunResult struct {
	System string `json:"system"`
	Run    int    `json:"run"`
	// Order is the run's place among every side's runs, in the order they ran (from 1):
	// within a paired run the sides alternate which goes first.
	Order   int                `json:"order"`
	Metrics map[string]float64 `json:"metrics"`
	// Schema is the schema the run used (dropped at its end).
	Schema string `json:"schema"`
}

func (r *RunResult) headline(workload string) string {
	var parts []string
	for _, m := range workloadMetrics[workload] {
		parts = append(parts, fmt.Sprintf("%s %s", m, formatValue(r.Metrics[m])))
	}
	return strings.Join(parts, ", ")
}

// Summary condenses one metric over the runs of one side.
type Summary struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Spread is Max/Min: 1 is perfectly stable.
	Spread float64 `json:"max_over_min"`
}

func summarize(vals []float64) Summary {
	if len(vals) == 0 {
		return Summary{}
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	sum := Summary{Median: med, Min: s[0], Max: s[len(s)-1]}
	if sum.Min > 0 {
		sum.Spread = sum.Max / sum.Min
	}
	return sum
}

// SystemReport is one side: how it was configured, its runs and their summaries.
type SystemReport struct {
	Name    string             `json:"name"`
	Config  string             `json:"config"`
	Runs    []*RunResult       `json:"runs"`
	Summary map[string]Summary `json:"summary"`
}

// Ratio is median(Of)/median(To) of one metric.
type Ratio struct {
	Metric string  `json:"metric"`
	Of     string  `json:"of"`
	To     string  `json:"to"`
	Value  float64 `json:"value"`
}

// Settings echoes what was asked for.
type Settings struct {
	Jobs            int    `json:"jobs,omitempty"`
	Duration        string `json:"duration,omitempty"`
	Rate            int    `json:"rate,omitempty"`
	Workers         int    `json:"workers"`
	Conns           int    `json:"conns"`
	Runs            int    `json:"runs"`
	Retained        int    `json:"retained"`
	IdleXact        string `json:"idle_xact,omitempty"`
	Checkpoint      bool   `json:"checkpoint_before_each_run"`
	CeilingClaimers int    `json:"ceiling_claimers,omitempty"`
	Queues          int    `json:"queues"`
	SplitWorkers    bool   `json:"split_workers,omitempty"`
	CompareQueues   int    `json:"compare_queues,omitempty"`
	CompareFlow     int    `json:"compare_flow,omitempty"`
	Processes       int    `json:"processes,omitempty"`
	Warmup          string `json:"warmup,omitempty"`
	ArgsBytes       int    `json:"args_bytes,omitempty"`
	JobSleep        string `json:"job_sleep,omitempty"`
	CommitWrites    bool   `json:"commit_writes,omitempty"`
}

// Conditions describes the machine and server the figures come from.
type Conditions struct {
	Server            string    `json:"server"`
	Autovacuum        string    `json:"autovacuum"`
	SynchronousCommit string    `json:"synchronous_commit"`
	SharedBuffers     string    `json:"shared_buffers"`
	CPUs              int       `json:"cpus"`
	GoVersion         string    `json:"go_version"`
	LoadAtStart       string    `json:"load_at_start"`
	LoadAtEnd         string    `json:"load_at_end"`
	Started           time.Time `json:"started"`
	Elapsed           string    `json:"elapsed"`
}

// Report is the outcome of Run.
type Report struct {
	Workload   string          `json:"workload"`
	Settings   Settings        `json:"settings"`
	Conditions Conditions      `json:"conditions"`
	Systems    []*SystemReport `json:"systems"`
	Ratios     []Ratio         `json:"ratios"`

	// ratioPairs, when set, are the (of, to) sides whose medians the ratios divide;
	// otherwise each side after the first is divided into the first.
	ratioPairs [][2]string
}

func newReport(ctx context.Context, cfg Config, systems []system) (*Report, error) {
	r, err := newBaseReport(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for _, s := range systems {
		if s.name() == SystemCeiling {
			r.Settings.CeilingClaimers = cfg.CeilingClaimers
		}
		r.Systems = append(r.Systems, &SystemReport{Name: s.name(), Config: s.describe()})
	}
	return r, nil
}

// newBaseReport is a report of cfg with its settings and conditions and no sides yet.
func newBaseReport(ctx context.Context, cfg Config) (*Report, error) {
	r := &Report{Workload: cfg.Workload, Settings: Settings{
		Workers: cfg.slotsPerQueue(), SplitWorkers: cfg.SplitWorkers, CompareQueues: cfg.CompareQueues, CompareFlow: cfg.CompareFlow, Conns: cfg.Conns, Runs: cfg.Runs, Retained: cfg.Retained, Checkpoint: cfg.Checkpoint,
		Queues: cfg.Queues, ArgsBytes: cfg.ArgsBytes, CommitWrites: cfg.CommitWrites && cfg.Workload == WorkloadFenced,
	}}
	if cfg.JobSleep > 0 {
		r.Settings.JobSleep = cfg.JobSleep.String()
	}
	switch cfg.Workload {
	case WorkloadSteady:
		r.Settings.Duration = cfg.Duration.String()
	case WorkloadLatency:
		r.Settings.Duration, r.Settings.Rate = cfg.Duration.String(), cfg.Rate
	default:
		r.Settings.Jobs = cfg.Jobs
	}
	if cfg.IdleXact > 0 {
		r.Settings.IdleXact = cfg.IdleXact.String()
	}
	switch cfg.Workload {
	case WorkloadIdle:
		r.Settings.Jobs, r.Settings.Retained, r.Settings.Checkpoint = 0, 0, false
		r.Settings.Processes, r.Settings.Duration = cfg.Processes, cfg.Duration.String()
		r.Settings.Warmup = cfg.idleWarmup.String()
	case WorkloadLayout:
		r.Settings.Workers, r.Settings.Queues, r.Settings.Conns = 0, 0, 0
		r.Settings.CeilingClaimers = cfg.CeilingClaimers
	}
	c, err := pgx.Connect(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact.URL(cfg.DatabaseURL), err)
	}
	defer c.Close(ctx)
	cond := &r.Conditions
	if err := c.QueryRow(ctx, sqlServerVersion).Scan(&cond.Server, &cond.Autovacuum,
		&cond.SynchronousCommit, &cond.SharedBuffers); err != nil {
		return nil, fmt.Errorf("read server settings: %w", err)
	}
	cond.Server = "PostgreSQL " + cond.Server
	cond.CPUs, cond.GoVersion = runtime.NumCPU(), runtime.Version()
	cond.LoadAtStart, cond.Started = loadAvg(), time.Now()
	return r, nil
}

func (r *Report) add(run *RunResult) {
	for _, s := range r.Systems {
		if s.Name == run.System {
			s.Runs = append(s.Runs, run)
		}
	}
}

func (r *Report) finish(context.Context, Config) {
	r.Conditions.LoadAtEnd = loadAvg()
	r.Conditions.Elapsed = time.Since(r.Conditions.Started).Round(time.Second).String()
	for _, s := range r.Systems {
		s.Summary = map[string]Summary{}
		for _, m := range metricsOf(r.Workload, true) {
			var vals []float64
			for _, run := range s.Runs {
				if v, ok := run.Metrics[m]; ok {
					vals = append(vals, v)
				}
			}
			if len(vals) > 0 {
				s.Summary[m] = summarize(vals)
			}
		}
	}
	if r.ratioPairs != nil {
		for _, p := range r.ratioPairs {
			of, to := r.system(p[0]), r.system(p[1])
			if of == nil || to == nil {
				continue
			}
			for _, m := range r.ratioMetrics() {
				if b := to.Summary[m].Median; b != 0 {
					r.Ratios = append(r.Ratios, Ratio{Metric: m, Of: of.Name, To: to.Name, Value: of.Summary[m].Median / b})
				}
			}
		}
		return
	}
	if len(r.Systems) < 2 {
		return
	}
	base := r.Systems[0]
	for _, other := range r.Systems[1:] {
		// fenceq over its peers; each layout over the first (single).
		of, to := base, other
		if r.Workload == WorkloadLayout {
			of, to = other, base
		}
		for _, m := range r.ratioMetrics() {
			if b := to.Summary[m].Median; b != 0 {
				r.Ratios = append(r.Ratios, Ratio{Metric: m, Of: of.Name, To: to.Name, Value: of.Summary[m].Median / b})
			}
		}
	}
}

// ratioMetrics are the metrics the report's ratios divide.
func (r *Report) ratioMetrics() []string {
	if ms, ok := ratioMetrics[r.Workload]; ok {
		return ms
	}
	return workloadMetrics[r.Workload]
}

// system returns the side with this name, nil when there is none.
func (r *Report) system(name string) *SystemReport {
	for _, s := range r.Systems {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as a table: each metric's median, min, max and max/min
// over the runs of each side, then the ratios of the medians.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "workload %s: %s\n", r.Workload, r.settingsLine())
	c := r.Conditions
	fmt.Fprintf(&b, "server: %s, autovacuum=%s, synchronous_commit=%s, shared_buffers=%s; client: %d CPUs, %s; load %s → %s; took %s\n",
		c.Server, c.Autovacuum, c.SynchronousCommit, c.SharedBuffers, c.CPUs, c.GoVersion, c.LoadAtStart, c.LoadAtEnd, c.Elapsed)
	for _, s := range r.Systems {
		fmt.Fprintf(&b, "%s: %s\n", s.Name, s.Config)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "metric\tsystem\tmedian\tmin\tmax\tmax/min\truns\t\n")
	for _, m := range metricsOf(r.Workload, true) {
		for i, s := range r.Systems {
			sum, ok := s.Summary[m]
			if !ok {
				continue
			}
			name := m
			if i > 0 {
				name = ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%d\t\n", name, s.Name, formatValue(sum.Median),
				formatValue(sum.Min), formatValue(sum.Max), sum.Spread, len(s.Runs))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Ratios) > 0 {
		b.WriteString("\nratios of medians:\n")
		for _, q := range r.Ratios {
			fmt.Fprintf(&b, "  %s: %s/%s = %.2f\n", q.Metric, q.Of, q.To, q.Value)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) settingsLine() string {
	s := r.Settings
	switch r.Workload {
	case WorkloadIdle:
		return fmt.Sprintf("%d processes, each with a pool of %d conns, serving 1 queue against %d queues of %d workers, "+
			"no jobs; %s measured after a %s warm-up; %d runs, the sides in rotating order",
			s.Processes, s.Conns, s.Queues, s.Workers, s.Duration, s.Warmup, s.Runs)
	case WorkloadLayout:
		line := fmt.Sprintf("%d jobs drained by %d claimers (LIMIT %d, then one batched fenced completion), "+
			"%d finished jobs retained; %d runs, the layouts in rotating order", s.Jobs, s.CeilingClaimers, ceilingBatch, s.Retained, s.Runs)
		if s.Checkpoint {
			line += ", CHECKPOINT before each run"
		}
		return line
	}
	var parts []string
	if s.Jobs > 0 {
		parts = append(parts, fmt.Sprintf("%d jobs", s.Jobs))
	}
	if s.Duration != "" {
		parts = append(parts, "for "+s.Duration)
	}
	if s.Rate > 0 {
		parts = append(parts, fmt.Sprintf("at %d jobs/s", s.Rate))
	}
	switch {
	case s.CompareFlow > 0:
		parts = append(parts, fmt.Sprintf("%d workers, no flow limit against every job under a limit of 1 running per partition over %d partitions",
			s.Workers, s.CompareFlow))
	case s.CompareQueues > 0:
		parts = append(parts, fmt.Sprintf("%d workers on 1 queue against %d queues of %d workers",
			s.Workers, s.CompareQueues, s.Workers/s.CompareQueues))
	case s.Queues > 1 && s.SplitWorkers:
		parts = append(parts, fmt.Sprintf("%d queues of %d workers (%d split over them)", s.Queues, s.Workers, s.Workers*s.Queues))
	case s.Queues > 1:
		parts = append(parts, fmt.Sprintf("%d queues of %d workers", s.Queues, s.Workers))
	case s.Workers > 0:
		parts = append(parts, fmt.Sprintf("%d workers", s.Workers))
	}
	parts = append(parts, fmt.Sprintf("%d conns per side", s.Conns), fmt.Sprintf("%d runs alternating", s.Runs))
	if s.ArgsBytes > 0 {
		parts = append(parts, fmt.Sprintf("args padded by %d bytes", s.ArgsBytes))
	}
	if s.JobSleep != "" {
		parts = append(parts, "each job sleeping "+s.JobSleep)
	}
	if s.CommitWrites {
		parts = append(parts, "fenceq committing through Job.CommitWrites")
	}
	if s.Retained > 0 {
		parts = append(parts, fmt.Sprintf("%d finished jobs retained", s.Retained))
	}
	if s.IdleXact != "" {
		parts = append(parts, "an idle transaction holding the vacuum horizon for "+s.IdleXact)
	}
	if s.Checkpoint {
		parts = append(parts, "CHECKPOINT before each run")
	}
	return strings.Join(parts, ", ")
}

func formatValue(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
