package stockcli

import (
	"github.com/fenceq/fenceq/cli"

	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/bench"
)

// runBench runs `fenceq bench …` in-process through Run, as main does (so the exit
// codes are Run's). The bench tests do not run in parallel: each one loads the machine
// with real benchmark runs.
func runBench(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := Run(ctx, append([]string{"fenceq", "bench"}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestBenchDrainJSON(t *testing.T) {
	out, errOut, code := runBench(t, "drain", "--jobs", "300", "--workers", "20", "--conns", "3",
		"--runs", "1", "--vs", "river", "--json", "--database-url", fenceqtest.RequireServerURL(t))
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	if rep.Workload != "drain" || len(rep.Systems) != 3 {
		t.Fatalf("report %+v, want drain with fenceq, river and bare-sql", rep)
	}
	for _, s := range rep.Systems {
		if s.Summary[bench.MetricJobs].Median != 300 {
			t.Errorf("%s worked %v jobs, want 300", s.Name, s.Summary[bench.MetricJobs].Median)
		}
	}
	// Progress goes to stderr, never into the JSON.
	if !strings.Contains(errOut, "run 1/1") {
		t.Errorf("no progress on stderr: %q", errOut)
	}
}

func TestBenchTextTable(t *testing.T) {
	out, errOut, code := runBench(t, "fenced", "--jobs", "100", "--workers", "10", "--conns", "2",
		"--runs", "1", "--quiet", "--database-url", fenceqtest.RequireServerURL(t))
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"workload fenced", "fenceq: fenceq worker", "jobs_per_sec", "wal_bytes_per_job", "max/min"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if errOut != "" {
		t.Errorf("--quiet still wrote to stderr: %q", errOut)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "usage"},
		{[]string{"sprint"}, `unknown workload "sprint"`},
		{[]string{"drain", "--vs", "sidekiq"}, `--vs "sidekiq"`},
		{[]string{"drain", "--runs", "0"}, "--runs"},
		{[]string{"drain", "--jobs", "-3"}, "--jobs"},
		{[]string{"drain", "--queues", "-1"}, "--queues"},
		{[]string{"drain", "--args-bytes", "-10"}, "--args-bytes"},
		{[]string{"drain", "--job-sleep", "-1s"}, "--job-sleep"},
		{[]string{"drain", "--commit-writes"}, "--commit-writes"},
		{[]string{"drain", "--compare-queues", "-1"}, "--compare-queues"},
		{[]string{"layout", "--layouts", "single,heap"}, `--layouts: "heap"`},
		{[]string{"drain", "--layouts", "single"}, "--layouts"},
		{[]string{"drain", "--rows", "10000"}, "--rows"},
		{[]string{"ui", "--rows", "10000,ten"}, `--rows: "ten"`},
		{[]string{"ui", "--rows", "10"}, "--rows: 10"},
		{[]string{"ui", "--requests", "0"}, "--requests"},
		{[]string{"idle", "--processes", "-2"}, "--processes"},
	} {
		_, errOut, code := runBench(t, tc.args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want exit %d naming %s", tc.args, code, errOut, cli.ExitUsage, tc.want)
		}
	}
}
