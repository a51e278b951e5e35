package cli_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/internal/syncbuf"
	"github.com/fenceq/fenceq/queue"
)

var metricsAddrRe = regexp.MustCompile(`msg="serving metrics" addr=(\S+)`)

// TestWorkerCommand runs `fenceq worker` in-process: it works jobs, exposes metrics with
// real values, notices a lease an operator revoked, and shuts down gracefully when its
// context is cancelled (what SIGINT does in cmd/fenceq), giving back the lease of the
// job still running.
func TestWorkerCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := 0; i < 3; i++ {
		b.enqueue(t, "noop")
	}
	sleeper := b.enqueue(t, "sleep", "--args", `{"duration": "1m"}`)

	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWithWriters(ctx, &stderr, "worker", "--database-url", b.db.URL, "--metrics-addr", "127.0.0.1:0",
			"--lease", "3s", "--reaper", "500ms", "--poll", "100ms", "--shutdown-timeout", "200ms",
			"--mailer", "file:"+filepath.Join(t.TempDir(), "mail.jsonl"), "--id", "cli-test-worker")
	}()
	var addr string
	fenceqtest.WaitFor(t, "the metrics server", 10*time.Second, func() bool {
		m := metricsAddrRe.FindStringSubmatch(stderr.String())
		if m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	// The housekeeping schedule runs once at the start: no worker ran a pass before.
	fenceqtest.WaitFor(t, "the noop and housekeeping jobs to complete and the sleep job to run", 10*time.Second, func() bool {
		var done, housekeeping, running int
		_ = b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE kind = 'noop' AND state = 'completed'),
			count(*) FILTER (WHERE kind = 'housekeeping.idempotency' AND state = 'completed'
				AND metadata->'periodic'->>'run_on_start' = 'true'),
			count(*) FILTER (WHERE kind = 'sleep' AND state = 'running') FROM fenceq_jobs`).Scan(&done, &housekeeping, &running)
		return done == 3 && housekeeping == 1 && running == 1
	})

	var ws []queue.WorkerInfo
	b.okJSON(t, &ws, "workers")
	if len(ws) != 1 || ws[0].ID != "cli-test-worker" || ws[0].RunningJobs != 1 {
		t.Fatalf("workers while running: %+v", ws)
	}

	// An operator revokes the running job's lease; the worker's heartbeat notices.
	b.ok(t, "jobs", "requeue", strconv.FormatInt(sleeper.ID, 10))
	var body string
	fenceqtest.WaitFor(t, "the lost lease in /metrics", 10*time.Second, func() bool {
		body = get(t, "http://"+addr+"/metrics")
		return strings.Contains(body, "\nfenceq_leases_lost_total 1\n")
	})
	for _, want := range []string{
		`fenceq_jobs_claimed_total{kind="noop",queue="default"} 3`,
		`fenceq_jobs_finished_total{kind="noop",outcome="completed",queue="default"} 3`,
		`fenceq_job_duration_seconds_count{kind="noop",queue="default"} 3`,
		`fenceq_db_up 1`,
		`fenceq_outbox_pending 0`,
		`fenceq_heartbeat_failures_total 0`,
		`fenceq_jobs_finished_total{kind="sleep",outcome="lease_lost",queue="default"} 1`,
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, name := range []string{"fenceq_queue_depth{", "fenceq_db_oldest_transaction_age_seconds ",
		"fenceq_outbox_oldest_pending_age_seconds ", "fenceq_stale_writes_rejected_total{",
		"fenceq_leases_expired_holder_alive_total{"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if got := get(t, "http://"+addr+"/healthz"); got != "ok\n" {
		t.Errorf("/healthz = %q", got)
	}
	// The revoked job is claimed again (attempt 2); then the worker is told to stop.
	fenceqtest.WaitFor(t, "the requeued job to run again", 10*time.Second, func() bool {
		j, err := store.GetJob(b.ctx, b.db.Pool, sleeper.ID)
		return err == nil && j.State == queue.StateRunning && j.Attempt == 2
	})
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("worker exit %d\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
	if !strings.Contains(stderr.String(), "worker shut down gracefully") {
		t.Errorf("stderr lacks the graceful shutdown:\n%s", stderr.String())
	}
	j, err := store.GetJob(b.ctx, b.db.Pool, sleeper.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != queue.StateAvailable {
		t.Errorf("sleep job after shutdown: %s, want available (lease released)", j.State)
	}
	b.okJSON(t, &ws, "workers")
	if len(ws) != 0 {
		t.Errorf("workers after shutdown: %+v", ws)
	}
}

func TestWorkerFlagErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneErrorLine(t, b.run(t, "worker", "--concurrency", "0"), "invalid --concurrency 0")
	oneErrorLine(t, b.run(t, "worker", "--queues", "ok, bad queue!"), "--queues")
	oneErrorLine(t, b.run(t, "worker", "--lease", "1s", "--heartbeat", "2s"), "HeartbeatInterval")
	oneErrorLine(t, b.run(t, "worker", "--mailer", "carrier-pigeon"), `invalid --mailer "carrier-pigeon": want file:PATH`)
	oneErrorLine(t, b.run(t, "worker", "--mailer", "smtp://ada:secret@127.0.0.1:25"), `invalid --mailer "smtp://ada:xxxxx@127.0.0.1:25"`)
	oneErrorLine(t, b.run(t, "worker", "--tax-latency", "fast"), "invalid --tax-latency")
	oneErrorLine(t, b.run(t, "worker", "--housekeeping-interval", "-1s"), "invalid --housekeeping-interval -1s")
	oneErrorLine(t, b.run(t, "worker", "--log-level", "loud"), "invalid --log-level")
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return string(b)
}
