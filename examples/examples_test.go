package examples_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
)

func TestMain(m *testing.M) { fenceqtest.Main(m) }

// TestExamples builds every example program and runs it against the test server, each in
// an empty schema of its own, asserting that it exits 0 and prints its result line.
func TestExamples(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the example programs; skipped with -short")
	}
	cases := []struct {
		dir  string
		want *regexp.Regexp
	}{
		{"quickstart", regexp.MustCompile(`(?m)^job [0-9]+ completed: hello, world$`)},
		{"outbox-webhook", regexp.MustCompile(`(?m)^webhook delivered exactly once: outbox row receipt:42, payload \{"order_id": 42, "total_cents": 1999\}$`)},
		{"idempotent-http", regexp.MustCompile(`(?m)^2 requests, 1 signup: both answered 201 \{"id":[0-9]+\}, the retry replayed$`)},
		{"periodic", regexp.MustCompile(`(?m)^example\.tick ran for slot [0-9T:Z-]+$`)},
	}

	bin := t.TempDir()
	args := []string{"build", "-o", bin + string(filepath.Separator)}
	for _, c := range cases {
		args = append(args, "./"+c.dir)
	}
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, out)
	}

	for _, c := range cases {
		t.Run(c.dir, func(t *testing.T) {
			t.Parallel()
			db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true, MaxConns: 2})
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, c.dir))
			cmd.Env = append(cmd.Environ(), "DATABASE_URL="+db.URL)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", c.dir, err, stdout.String(), stderr.String())
			}
			if !c.want.Match(stdout.Bytes()) {
				t.Fatalf("%s printed\n%s\nwant a line matching %s (stderr:\n%s)", c.dir, stdout.String(), c.want, stderr.String())
			}
		})
	}
}
