package stockcli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/stockcli"
	"github.com/fenceq/fenceq/internal/syncbuf"
)

// TestMain stops the throwaway PostgreSQL cluster when the tests started one.
func TestMain(m *testing.M) { fenceqtest.Main(m) }

// result is one in-process run of the fenceq command.
type result struct {
	code           int
	stdout, stderr string
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
