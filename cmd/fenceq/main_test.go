package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/internal/syncbuf"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/queue"
)

// TestMain removes the throwaway cluster a test may have started.
func TestMain(m *testing.M) { fenceqtest.Main(m) }

// TestSignals runs the fenceq binary's worker as a process and signals it, as a
// container engine or a service manager does: SIGTERM stops it gracefully, giving back
// the lease of the job it runs, with exit status 0; a second signal during the
// shutdown ends it at once, giving nothing back.
func TestSignals(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "fenceq")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("SIGTERM gives the lease back", func(t *testing.T) {
		t.Parallel()
		p := startHolding(t, bin, "1s")
		p.signal(t, syscall.SIGTERM)
		err := p.wait(t)
		logs := p.stderr.String()
		if err != nil {
			t.Fatalf("worker after SIGTERM: %v, want exit 0\n%s", err, logs)
		}
		for _, want := range []string{`msg="shutting down: no new claims`, `msg="worker shut down gracefully"`} {
			if !strings.Contains(logs, want) {
				t.Errorf("the worker's log lacks %s:\n%s", want, logs)
			}
		}
		j := p.job(t)
		if j.State != queue.StateAvailable || j.Attempt != p.held.Attempt-1 || j.LeaseGen != p.held.LeaseGen || j.LeasedBy != nil {
			t.Errorf("job after SIGTERM: state %s attempt %d gen %d holder %v; want available, attempt %d, gen %d, no holder",
				j.State, j.Attempt, j.LeaseGen, j.LeasedBy, p.held.Attempt-1, p.held.LeaseGen)
		}
	})

	t.Run("a second signal ends the shutdown at once", func(t *testing.T) {
		t.Parallel()
		// The shutdown would wait a minute for the running job.
		p := startHolding(t, bin, "1m")
		p.signal(t, syscall.SIGTERM)
		fenceqtest.WaitFor(t, "the worker to start its shutdown", 30*time.Second, func() bool {
			return strings.Contains(p.stderr.String(), `msg="shutting down: no new claims`)
		})
		// The first signal's handler lets go of SIGTERM just after the shutdown starts: a
		// signal sent in between is still the first one's, so signal until it ends.
		var err error
		fenceqtest.WaitFor(t, "the worker to end on a second SIGTERM", 30*time.Second, func() bool {
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
				t.Fatalf("signal the worker: %v", err)
			}
			select {
			case err = <-p.done:
				p.done <- err // for the cleanup
				return true
			case <-time.After(time.Second):
				return false
			}
		})
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("worker after a second SIGTERM: %v, want killed by the signal\n%s", err, p.stderr.String())
		}
		if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Fatalf("worker after a second SIGTERM: %v, want killed by SIGTERM\n%s", err, p.stderr.String())
		}
		// Killed, it gave nothing back: the lease stands until it expires.
		j := p.job(t)
		if j.State != queue.StateRunning || j.LeaseGen != p.held.LeaseGen || j.LeasedBy == nil || *j.LeasedBy != p.id {
			t.Errorf("job after the forced exit: state %s gen %d holder %v; want still running under %s at gen %d",
				j.State, j.LeaseGen, j.LeasedBy, p.id, p.held.LeaseGen)
		}
	})
}

// proc is a fenceq worker process holding the lease of a sleep job.
type proc struct {
	id     string
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	done   chan error
	db     *fenceqtest.DB
	held   *queue.JobRow // the job, as it was while running
}

// startHolding starts `fenceq worker` on a schema of its own with a job that sleeps
// far longer than the test, and waits until the worker holds that job's lease.
func startHolding(t *testing.T, bin, shutdownTimeout string) *proc {
	t.Helper()
	ctx := testContext(t)
	db := fenceqtest.New(t, &fenceqtest.Options{Migrations: builtin.Migrations()})
	res, err := fenceq.Enqueue(ctx, db.Pool, fenceq.RawArgs{KindName: diag.SleepKind,
		JSON: json.RawMessage(`{"duration": "10m"}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{id: "signal-test-" + db.Schema, stderr: &syncbuf.Buffer{}, done: make(chan error, 1), db: db}
	p.cmd = exec.Command(bin, "worker", "--id", p.id, "--queues", queue.DefaultQueue, "--no-periodic",
		"--poll", "200ms", "--shutdown-timeout", shutdownTimeout, "--mailer", "file:-")
	p.cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL)
	p.cmd.Stdout = p.stderr
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	fenceqtest.WaitFor(t, "the worker to hold the sleep job's lease", 30*time.Second, func() bool {
		j, err := store.GetJob(ctx, db.Pool, res.Job.ID)
		if err == nil && j.State == queue.StateRunning && j.LeasedBy != nil && *j.LeasedBy == p.id {
			p.held = j
		}
		return p.held != nil
	})
	return p
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal the worker: %v", err)
	}
}

// wait returns how the process ended.
func (p *proc) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(time.Minute):
		t.Fatalf("the worker did not stop\n%s", p.stderr.String())
		return nil
	}
}

func (p *proc) job(t *testing.T) *queue.JobRow {
	t.Helper()
	j, err := store.GetJob(testContext(t), p.db.Pool, p.held.ID)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
