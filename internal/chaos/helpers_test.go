package chaos

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/jobs/builtin"
)

// testLog is a slog handler writing to t.Log until the test ends.
type testLog struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	l := &testLog{t: t}
	t.Cleanup(func() {
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// testEnvConfig fills in what every test's environment needs: the binary, a fresh
// schema on the shared server, the naive worker command, a log directory.
func testEnvConfig(t testing.TB, cfg EnvConfig) EnvConfig {
	t.Helper()
	cfg.Binary = TestBinary
	if !cfg.OwnCluster && cfg.DatabaseURL == "" {
		db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2, Migrations: builtin.Migrations()})
		cfg.DatabaseURL = db.URL
	}
	cfg.NaiveCommand = TestNaiveCommand
	cfg.ProcessEnv = TestNaiveEnv
	if cfg.LogDir == "" {
		cfg.LogDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	return cfg
}

// NewTestEnv is newTestEnv for the chaos_test package.
func NewTestEnv(t *testing.T, cfg EnvConfig) *Env { return newTestEnv(t, cfg) }

// newTestEnv prepares an environment whose workers are not started yet. On cleanup it
// stops every process; when the test failed it first prints the tail of each log.
func newTestEnv(t *testing.T, cfg EnvConfig) *Env {
	t.Helper()
	cfg = testEnvConfig(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := NewEnv(ctx, cfg)
	if err != nil {
		t.Fatalf("NewEnv: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, env)
		}
		if err := env.Close(context.Background()); err != nil {
			t.Errorf("close env: %v", err)
		}
	})
	return env
}

func dumpLogs(t *testing.T, env *Env) {
	for _, w := range env.Workers {
		b, err := os.ReadFile(w.LogPath())
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Logf("--- last lines of %s ---\n%s", w.LogPath(), strings.Join(lines, "\n"))
	}
}

// runChaos runs a whole chaos run in a fresh schema and logs its report.
func runChaos(t *testing.T, cfg Config) *Report {
	t.Helper()
	cfg.Env = testEnvConfig(t, cfg.Env)
	if cfg.Logger == nil {
		cfg.Logger = cfg.Env.Logger
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var env *Env
	on := cfg.OnStarted
	cfg.OnStarted = func(e *Env) {
		env = e
		if on != nil {
			on(e)
		}
	}
	rep, err := Run(ctx, cfg)
	if err != nil {
		if env != nil {
			dumpLogs(t, env)
		}
		t.Fatalf("chaos run: %v", err)
	}
	logReport(t, rep)
	if rep.FaultPhase < rep.Duration {
		t.Errorf("fault phase %s reported shorter than the planned %s", rep.FaultPhase, rep.Duration)
	}
	if !rep.Pass && !cfg.Env.Naive && env != nil {
		dumpLogs(t, env)
	}
	return rep
}

func logReport(t *testing.T, rep *Report) {
	t.Helper()
	var buf bytes.Buffer
	_ = rep.WriteText(&buf)
	buf.WriteString("\n")
	_ = rep.WriteFaultLog(&buf)
	t.Logf("report:\n%s", buf.String())
}

// runChaosOwnCluster is runChaos on a throwaway cluster the harness controls, started
// from the machine's PostgreSQL server binaries.
func runChaosOwnCluster(t *testing.T, cfg Config) *Report {
	t.Helper()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
	cfg.Env.OwnCluster = true
	cfg.Env = testEnvConfig(t, cfg.Env)
	if cfg.Logger == nil {
		cfg.Logger = cfg.Env.Logger
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	logReport(t, rep)
	return rep
}

// faultSummary returns the summary of one fault type.
func faultSummary(rep *Report, f FaultType) FaultSummary {
	for _, s := range rep.Faults {
		if s.Type == f {
			return s
		}
	}
	return FaultSummary{Type: f}
}

func requirePass(t *testing.T, rep *Report) {
	t.Helper()
	if !rep.Pass {
		// The report was logged above; the jobs behind the failure are repeated here, at
		// the end of the output, where a truncated log still shows them.
		var behind []string
		for _, j := range rep.Unfinished {
			behind = append(behind, "unfinished "+j)
		}
		for _, j := range rep.Discarded {
			behind = append(behind, "discarded "+j)
		}
		for _, m := range rep.Missing {
			behind = append(behind, "missing: "+m)
		}
		if rep.Verify != nil {
			for _, c := range rep.Verify.Checks {
				if !c.OK() && c.Skipped == "" {
					behind = append(behind, fmt.Sprintf("verify %s: %d: %s", c.Name, c.Violations, strings.Join(c.Examples, "; ")))
				}
			}
		}
		t.Fatalf("chaos run failed: %s\n%s", strings.Join(rep.Failures, "; "), strings.Join(behind, "\n"))
	}
	if rep.Duplicates != 0 || rep.Lost != 0 {
		t.Fatalf("duplicates %d, lost %d; want 0 and 0", rep.Duplicates, rep.Lost)
	}
}

func requireFired(t *testing.T, rep *Report, f FaultType) {
	t.Helper()
	s := faultSummary(rep, f)
	if s.Fired == 0 {
		var why []string
		for _, r := range rep.FaultLog {
			if r.Type == f {
				why = append(why, r.Err)
			}
		}
		t.Fatalf("fault %s: scheduled %d, fired 0 (%s)", f, s.Scheduled, strings.Join(why, "; "))
	}
	// A fired fault took time (a pause lasts its For), and the log says when it began.
	for _, r := range rep.FaultLog {
		if r.Type == f && r.Fired && (r.Took <= 0 || r.Started < 0) {
			t.Fatalf("fault %s fired but its record says started %s, took %s", f, r.Started, r.Took)
		}
	}
}
