package fenceqhttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqhttp"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// python is the interpreter of the cross-language test: Debian's, whose psycopg 3 is
// the package python3-psycopg.
const python = "/usr/bin/python3"

// requirePythonPsycopg skips the test (fails it in CI, naming the Debian package) when
// Debian's python3 with psycopg 3 is missing.
func requirePythonPsycopg(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import psycopg").CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf("%s with psycopg 3 is needed (Debian packages python3 and python3-psycopg): %v %s", python, err, out)
	if os.Getenv("FENCEQ_CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// pyEvent is one line the Python endpoint prints.
type pyEvent struct {
	Event    string `json:"event"`
	Port     int    `json:"port"`
	Job      int64  `json:"job"`
	Gen      int64  `json:"gen"`
	SQLState string `json:"sqlstate"`
	Error    string `json:"error"`
}

// startPython runs testdata/endpoint.py on the test's schema and returns its URL and
// its events. It is killed when the test ends.
func startPython(t *testing.T, db *fenceqtest.DB, secret string) (string, <-chan pyEvent) {
	t.Helper()
	base, err := fenceqtest.ServerURL()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, filepath.Join("testdata", "endpoint.py"))
	cmd.Env = append(os.Environ(), "FENCEQ_DSN="+base, "FENCEQ_SCHEMA="+db.Schema,
		"FENCEQ_HTTP_SECRET="+secret, "HOLD_FIRST=1")
	cmd.Stderr = &testWriter{t: t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the Python endpoint: %v", err)
	}
	events := make(chan pyEvent, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev pyEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("python endpoint printed %q: %v", sc.Text(), err)
				continue
			}
			events <- ev
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
	})
	ev := next(t, events, "listening")
	return fmt.Sprintf("http://127.0.0.1:%d", ev.Port), events
}

// next waits for the endpoint's next event and fails unless it is want.
func next(t *testing.T, events <-chan pyEvent, want string) pyEvent {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatalf("the Python endpoint exited before %q", want)
		}
		if ev.Event != want {
			t.Fatalf("python endpoint: %+v, want %q", ev, want)
		}
		return ev
	case <-time.After(30 * time.Second):
		t.Fatalf("python endpoint: no %q within 30s", want)
	}
	panic("unreachable")
}

// testWriter logs what a child process writes.
type testWriter struct {
	t  *testing.T
	mu sync.Mutex
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Logf("python: %s", p)
	return len(p), nil
}

// The fence across languages. The endpoint is Python (http.server and psycopg 3): it
// writes its result row and calls fenceq_complete in one transaction. The worker that
// holds the first lease is cut off from the database (a paused process) while the
// endpoint holds its request; its lease expires and the reaper revokes it; a second
// worker runs the job again under the next generation, and the endpoint's second call
// completes it. Then the first call resumes: its fenceq_complete under the revoked
// generation fails with SQLSTATE QF002 and its result row rolls back. One result row
// remains, the second lease's.
func TestFenceAcrossLanguages(t *testing.T) {
	t.Parallel()
	requirePythonPsycopg(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE results (job_id bigint NOT NULL, lease_gen bigint NOT NULL, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const key = "cross-language secret"
	url, events := startPython(t, db, key)

	handlers := func() *fenceq.Handlers {
		hs := fenceq.NewHandlers()
		if err := fenceqhttp.Add(hs, fenceqhttp.Endpoint{Kind: kind, URL: url + "/run", Secret: []byte(key)}); err != nil {
			t.Fatal(err)
		}
		return hs
	}
	res, err := fenceq.Enqueue(ctx, db.Pool, fenceq.RawArgs{KindName: kind, JSON: []byte(`{"n": 7}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID

	// Worker A: short leases, on a pool that can be cut off from the database.
	poolA, cut := db.PartitionedPool(t, 4)
	fenceqtest.StartWorker(ctx, t, poolA, fenceq.Config{Handlers: handlers(), ID: "worker-a",
		Logger: fenceqtest.QuietLogger(), LeaseDuration: time.Second, HeartbeatInterval: 200 * time.Millisecond,
		ReaperInterval: time.Hour, DisablePeriodic: true})
	held := next(t, events, "held")
	if held.Job != id {
		t.Fatalf("the endpoint holds job %d, want %d", held.Job, id)
	}
	cut.Store(true) // A pauses: no heartbeat reaches the database from now on
	defer cut.Store(false)

	// The lease expires; worker B's reaper revokes it and B runs the job again.
	fenceqtest.StartWorker(ctx, t, db.Pool, fenceq.Config{Handlers: handlers(), ID: "worker-b",
		Logger: fenceqtest.QuietLogger(), ReaperInterval: 100 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		DisablePeriodic: true})
	var revokedGen int64
	fenceqtest.WaitFor(t, "the reaper revokes the first lease", 30*time.Second, func() bool {
		err := db.Pool.QueryRow(ctx, `SELECT lease_gen FROM fenceq_lease_events WHERE job_id = $1 AND kind = $2`,
			id, queue.EventRevoked).Scan(&revokedGen)
		return err == nil
	})
	if revokedGen != held.Gen {
		t.Fatalf("revoked generation %d, want the held call's %d", revokedGen, held.Gen)
	}
	second := next(t, events, "committed")
	if second.Job != id || second.Gen <= held.Gen {
		t.Fatalf("second call committed job %d at generation %d; want job %d above generation %d", second.Job, second.Gen, id, held.Gen)
	}
	done := fenceqtest.WaitState(t, db.Pool, id, queue.StateCompleted, 30*time.Second)
	if done.LeaseGen != second.Gen || string(done.Output) != fmt.Sprintf(`{"by": "python", "gen": %d}`, second.Gen) {
		t.Fatalf("job completed at generation %d with output %s; want the second call's (%d)", done.LeaseGen, done.Output, second.Gen)
	}

	// The first call resumes, under the revoked lease.
	resp, err := http.Get(url + "/release")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	late := next(t, events, "rejected")
	if late.Job != id || late.Gen != held.Gen || late.SQLState != "QF002" {
		t.Fatalf("late call: %+v; want job %d generation %d rejected with SQLSTATE QF002", late, id, held.Gen)
	}

	// The fault happened (revocation, rejected late completion): now the outcome.
	rows, err := db.Pool.Query(ctx, `SELECT lease_gen FROM results WHERE job_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	var gens []int64
	for rows.Next() {
		var g int64
		if err := rows.Scan(&g); err != nil {
			t.Fatal(err)
		}
		gens = append(gens, g)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(gens) != 1 || gens[0] != second.Gen {
		t.Fatalf("result rows of job %d at generations %v; want exactly one, at %d", id, gens, second.Gen)
	}
	after, err := fenceq.GetJob(ctx, db.Pool, id)
	if err != nil || after.State != queue.StateCompleted || after.LeaseGen != second.Gen {
		t.Fatalf("job after the late call: %+v %v; want still completed at generation %d", after, err, second.Gen)
	}
	var stale int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND kind = $2 AND lease_gen = $3`,
		id, queue.EventStaleWriteRejected, second.Gen).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("%d stale writes recorded under the second lease (%v): its completion found the endpoint's", stale, err)
	}
}
