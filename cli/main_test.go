package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/stockcli"
	"github.com/fenceq/fenceq/internal/syncbuf"
	"github.com/fenceq/fenceq/jobs/builtin"
)

// TestMain stops the throwaway PostgreSQL cluster when the tests started one.
func TestMain(m *testing.M) { fenceqtest.Main(m) }

// result is one in-process run of the fenceq command.
type result struct {
	code           int
	stdout, stderr string
}

type testBundle struct {
	db  *fenceqtest.DB
	ctx context.Context
}

func setup(t *testing.T, opts ...fenceqtest.Options) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	var o fenceqtest.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if !o.NoMigrate {
		o.Migrations = builtin.Migrations()
	}
	return &testBundle{db: fenceqtest.New(t, &o), ctx: ctx}
}

// run runs `fenceq args… --database-url <test schema>`.
func (b *testBundle) run(t *testing.T, args ...string) result {
	t.Helper()
	return runCLI(b.ctx, append(args, "--database-url", b.db.URL)...)
}

// ok runs and fails the test unless the exit status is 0.
func (b *testBundle) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := b.run(t, args...)
	if r.code != 0 {
		t.Fatalf("fenceq %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// okJSON runs with --json and decodes stdout into v.
func (b *testBundle) okJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := b.ok(t, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("fenceq %s --json: decode %q: %v", strings.Join(args, " "), out, err)
	}
}

func runCLI(ctx context.Context, args ...string) result {
	var out, errb syncbuf.Buffer
	code := stockcli.Run(ctx, append([]string{"fenceq"}, args...), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// oneErrorLine checks that stderr is exactly one line starting with "fenceq: " and
// containing want.
func oneErrorLine(t *testing.T, r result, want string) {
	t.Helper()
	if r.code == 0 {
		t.Fatalf("exit 0, want an error containing %q (stdout %q)", want, r.stdout)
	}
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "fenceq: ") || !strings.Contains(lines[0], want) {
		t.Fatalf("stderr = %q, want one line \"fenceq: …%s…\"", r.stderr, want)
	}
}

func jsonDecode(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// runWithWriters runs fenceq with stderr going to w (for commands that log while running).
func runWithWriters(ctx context.Context, w *syncbuf.Buffer, args ...string) int {
	var out syncbuf.Buffer
	return stockcli.Run(ctx, append([]string{"fenceq"}, args...), &out, w)
}
