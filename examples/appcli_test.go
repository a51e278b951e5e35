package examples_test

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
)

// examples/appcli, an application's own command built with cli.New, against a fresh
// schema: migrate up installs the core and the app set only, migrate status names only
// those sets, enqueue takes the app's kind without an override flag, and worker runs
// the job: its greeting row is written, and SIGTERM stops the worker gracefully.
func TestAppCLI(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs examples/appcli; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "appcli")
	if out, err := exec.Command("go", "build", "-o", bin, "./appcli").CombinedOutput(); err != nil {
		t.Fatalf("go build ./appcli: %v\n%s", err, out)
	}
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true, MaxConns: 2})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append(args, "--database-url", db.URL)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("appcli %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}

	out := run("migrate", "up")
	if !regexp.MustCompile(`(?m)^fenceq: migrated from version 0 to [0-9]+ \([0-9]+ applied\)\napp: migrated from version 0 to 1 \(1 applied\)\n$`).MatchString(out) {
		t.Fatalf("migrate up printed\n%s\nwant the core and the app set migrated, nothing else", out)
	}
	var tables []string
	rows, err := db.Pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1`, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"greetings", "app_schema_migrations", "fenceq_jobs_hot", "fenceq_jobs_history", "fenceq_schema_migrations"} {
		if !slices.Contains(tables, want) {
			t.Errorf("tables %v lack %s", tables, want)
		}
	}
	for _, tb := range tables {
		if tb != "greetings" && tb != "app_schema_migrations" && !strings.HasPrefix(tb, "fenceq_") {
			t.Errorf("migrate up created %s: want only fenceq_* tables and the app's", tb)
		}
	}

	out = run("migrate", "status")
	sets := regexp.MustCompile(`(?m)^(\S+): version `).FindAllStringSubmatch(out, -1)
	if len(sets) != 2 || sets[0][1] != "fenceq" || sets[1][1] != "app" || !strings.Contains(out, "app: version 1 of 1, current") {
		t.Fatalf("migrate status printed\n%s\nwant the sets fenceq and app, both current", out)
	}

	// verify knows only the core and the app set: no check of the built-in jobs' tables.
	out = run("verify")
	if strings.Contains(out, "invoice") || strings.Contains(out, "order") || !strings.Contains(out, "one outbox row per dedupe key") {
		t.Fatalf("verify printed\n%s\nwant the core's checks and none of the built-in jobs'", out)
	}

	out = run("enqueue", "--args", `{"name":"ada"}`, "app.greet")
	m := regexp.MustCompile(`^enqueued job ([0-9]+) \(app\.greet, queue default\): available`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("enqueue printed %q", out)
	}
	id, _ := strconv.ParseInt(m[1], 10, 64)

	worker := exec.CommandContext(ctx, bin, "worker", "--database-url", db.URL, "--max-conns", "4")
	var wout, werr bytes.Buffer
	worker.Stdout, worker.Stderr = &wout, &werr
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- worker.Wait() }()
	var name string
	fenceqtest.WaitFor(t, "the greeting row of job "+m[1], time.Minute, func() bool {
		select {
		case err := <-done:
			t.Fatalf("worker exited before the greeting was written: %v\nstderr:\n%s", err, werr.String())
		default:
		}
		err := db.Pool.QueryRow(ctx, `SELECT name FROM greetings WHERE job_id = $1`, id).Scan(&name)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return err == nil
	})
	if name != "ada" {
		t.Errorf("greeting of job %d names %q, want ada", id, name)
	}
	if err := worker.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("worker after SIGTERM: %v\nstderr:\n%s", err, werr.String())
	}
	if !strings.Contains(werr.String(), "worker shut down gracefully") {
		t.Errorf("worker stderr lacks the graceful shutdown:\n%s", werr.String())
	}
	var state string
	if err := db.Pool.QueryRow(ctx, `SELECT state FROM fenceq_jobs WHERE id = $1`, id).Scan(&state); err != nil || state != "completed" {
		t.Errorf("job %d: state %q, %v; want completed", id, state, err)
	}
}
