package stockcli

import (
	"github.com/fenceq/fenceq/cli"

	"bytes"
	"context"
	"strings"
	"testing"
)

// runChaosCLI runs `fenceq chaos args…` in-process, as main does.
func runChaosCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), append([]string{"fenceq", "chaos"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestChaosCommandRejectsBadFlags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--faults", "pause,gc"}, `unknown fault "gc"`},
		{[]string{"--workers", "0"}, "invalid --workers 0"},
		{[]string{"--duration", "0s"}, "invalid --duration 0s"},
		{[]string{"extra"}, `unknown argument "extra"`},
		{[]string{"--hosts", "-1"}, "invalid --hosts -1"},
		{[]string{"--hosts", "2", "--failover"}, "--hosts and --failover cannot be combined"},
		{[]string{"--hosts", "2", "--workers", "3"}, "--workers 3 differs from --hosts 2"},
		{[]string{"--async"}, "--async needs --failover"},
		{[]string{"--failover", "--replica-lag", "1s"}, "--replica-lag needs --async"},
		{[]string{"naive-worker", "--id=w1"}, "--database-url is required"},
		{[]string{"naive-worker", "--database-url=postgres://x/y", "--id=w1", "--mail-file=/tmp/m", "--concurrency=0"}, "--concurrency 0"},
	}
	for _, c := range cases {
		code, _, stderr := runChaosCLI(t, c.args...)
		if code != cli.ExitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("fenceq chaos %s: exit %d, stderr %q; want exit %d mentioning %q",
				strings.Join(c.args, " "), code, stderr, cli.ExitUsage, c.want)
		}
	}
}
