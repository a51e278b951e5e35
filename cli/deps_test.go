package cli_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Importing cli links none of the built-in jobs, River, SMTP or the demo: an
// application's command carries only what it registers.
func TestCLILinksNoStockDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/fenceq/fenceq/cli").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 || !strings.Contains(string(out), "github.com/urfave/cli/v2\n") {
		t.Fatalf("go list -deps printed %d packages, without urfave/cli: %q", len(deps), out)
	}
	for _, d := range deps {
		for _, banned := range []string{"riverqueue", "emersion/go-smtp", "fenceq/jobs/invoice", "fenceq/jobs/order",
			"fenceq/jobs/email", "fenceq/jobs/builtin", "fenceq/internal/demo", "fenceq/internal/bench", "fenceq/internal/chaos",
			"fenceq/internal/stockcli"} {
			if strings.Contains(d, banned) {
				t.Errorf("package cli links %s", d)
			}
		}
	}
}
