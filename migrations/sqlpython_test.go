package migrations_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// pythonExample returns the Python example of docs/other-languages.md: the python code
// block that follows the "python-example" marker.
func pythonExample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/other-languages.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	_, after, ok := strings.Cut(doc, "<!-- python-example -->")
	if !ok {
		t.Fatal("docs/other-languages.md has no <!-- python-example --> marker")
	}
	_, code, ok := strings.Cut(after, "```python\n")
	if !ok {
		t.Fatal("no python code block after the marker")
	}
	code, _, ok = strings.Cut(code, "```")
	if !ok {
		t.Fatal("the python code block does not end")
	}
	return code
}

// python is the interpreter Debian's python3-psycopg installs psycopg for.
const python = "/usr/bin/python3"

// requirePsycopg skips the test unless /usr/bin/python3 with psycopg 3 is installed; in CI
// (FENCEQ_CI set) it fails instead, naming the Debian package.
func requirePsycopg(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import psycopg").CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf(python+" with psycopg 3 is needed (Debian package python3-psycopg): %v %s", err, out)
	if os.Getenv("FENCEQ_CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// The Python example of docs/other-languages.md works: it enqueues (uniquely), its
// stale completion writes nothing, its completion under the current lease commits the
// invoice, the outbox row and the completion together, and bad input names the field.
func TestSQLPythonExample(t *testing.T) {
	t.Parallel()
	requirePsycopg(t)
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE invoices (job_id bigint PRIMARY KEY, total int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "example.py")
	if err := os.WriteFile(script, []byte(pythonExample(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	base, err := fenceqtest.ServerURL()
	if err != nil {
		t.Fatal(err)
	}
	dsn := base
	if u, err := url.Parse(base); err == nil && u.Scheme != "" {
		q := u.Query()
		q.Del("search_path") // not a libpq parameter; the example sets it itself
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	run := func(args ...string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, python, append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "FENCEQ_DSN="+dsn, "FENCEQ_SCHEMA="+db.Schema)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python3 example.py %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}

	out := run("enqueue", "42")
	id, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		t.Fatalf("enqueue printed %q; want a job id", out)
	}
	if again := run("enqueue", "42"); again != out {
		t.Fatalf("second enqueue of customer 42 printed %q; want the same job %s", again, out)
	}
	j, err := fenceq.GetJob(ctx, db.Pool, id)
	if err != nil || j.Kind != "invoice.generate" || j.Queue != "billing" || string(j.EncodedArgs) != `{"customer_id": 42}` ||
		j.UniqueKey == nil || *j.UniqueKey != "invoice:42" || strings.Join(j.Tags, ",") != "billing" {
		t.Fatalf("job enqueued from Python: %+v, %v", j, err)
	}

	stale := claim(ctx, t, db.Pool, "billing", time.Minute)
	if _, err := fenceq.RequeueJob(ctx, db.Pool, id); err != nil {
		t.Fatal(err)
	}
	current := claim(ctx, t, db.Pool, "billing", time.Minute)
	if got := run("complete", fmt.Sprint(id), fmt.Sprint(stale.LeaseGen), "100"); got != "lease lost" {
		t.Fatalf("stale completion printed %q; want lease lost", got)
	}
	var invoices, outboxRows, staleEvents int64
	count := func() {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM invoices), (SELECT count(*) FROM fenceq_outbox),
            (SELECT count(*) FROM fenceq_lease_events WHERE kind = $1 AND job_id = $2)`,
			string(queue.EventStaleWriteRejected), id).Scan(&invoices, &outboxRows, &staleEvents); err != nil {
			t.Fatal(err)
		}
	}
	count()
	if invoices != 0 || outboxRows != 0 || staleEvents != 1 {
		t.Fatalf("after the stale completion: %d invoices, %d outbox rows, %d stale events; want 0, 0, 1",
			invoices, outboxRows, staleEvents)
	}
	if got := run("complete", fmt.Sprint(id), fmt.Sprint(current.LeaseGen), "100"); got != "completed" {
		t.Fatalf("completion under the current lease printed %q; want completed", got)
	}
	count()
	if invoices != 1 || outboxRows != 1 {
		t.Fatalf("after the completion: %d invoices, %d outbox rows; want 1 and 1", invoices, outboxRows)
	}
	j, err = fenceq.GetJob(ctx, db.Pool, id)
	if err != nil || j.State != queue.StateCompleted || string(j.Output) != `{"total": 100}` {
		t.Fatalf("job after the Python completion: %+v, %v", j, err)
	}
	if got, want := run("invalid"), "priority: invalid priority: 500 is outside 0–100"; got != want {
		t.Fatalf("invalid enqueue printed %q; want %q", got, want)
	}
}
