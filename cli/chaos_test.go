package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// runChaosCLI runs `fenceq chaos args…` in-process on an app that has the chaos command
// (wired or not into the command list).
func runChaosCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	app := NewApp(&stdout, &stderr)
	found := false
	for _, c := range app.Commands {
		found = found || c.Name == "chaos"
	}
	if !found {
		cmd := chaosCommand()
		setUsageErrors(cmd)
		app.Commands = append(app.Commands, cmd)
	}
	err := app.RunContext(context.Background(), reorderArgs(app, append([]string{"fenceq", "chaos"}, args...)))
	code := ExitOK
	if err != nil {
		var usage usageError
		code = ExitError
		if errors.As(err, &usage) {
			code = ExitUsage
		}
		stderr.WriteString(err.Error())
	}
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
		{[]string{"naive-worker", "--id=w1"}, "--database-url is required"},
		{[]string{"naive-worker", "--database-url=postgres://x/y", "--id=w1", "--mail-file=/tmp/m", "--concurrency=0"}, "--concurrency 0"},
	}
	for _, c := range cases {
		code, _, stderr := runChaosCLI(t, c.args...)
		if code != ExitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("fenceq chaos %s: exit %d, stderr %q; want exit %d mentioning %q",
				strings.Join(c.args, " "), code, stderr, ExitUsage, c.want)
		}
	}
}
