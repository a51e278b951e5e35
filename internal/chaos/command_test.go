package chaos

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
)

// TestChaosCommand runs `fenceq chaos` itself, the built binary, end to end: the worker
// processes it starts are the binary's own `worker` and `chaos naive-worker`.
func TestChaosCommand(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, args ...string) (int, *Report) {
		t.Helper()
		args = append([]string{"chaos", "--database-url", fenceqtest.RequireServerURL(t), "--json", "--log-level", "warn",
			"--log-dir", t.TempDir(), "--workers", "2", "--wave-every", "3s", "--customers", "10", "--order-keys", "4"}, args...)
		cmd := exec.Command(TestBinary, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var rep Report
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("fenceq chaos exited %d without a JSON report: %v\nstdout: %s\nstderr: %s", code, err, stdout.String(), stderr.String())
		}
		return code, &rep
	}

	t.Run("Fenced", func(t *testing.T) {
		t.Parallel()
		code, rep := run(t, "--duration", "6s", "--seed", "3", "--faults", "pause")
		if code != 0 || !rep.Pass || rep.Mode != "fenced" {
			t.Fatalf("fenceq chaos: exit %d, pass %v, mode %s, failures %v; want exit 0", code, rep.Pass, rep.Mode, rep.Failures)
		}
		if s := faultSummary(rep, FaultPause); s.Fired == 0 {
			t.Fatalf("pause scheduled %d, fired 0", s.Scheduled)
		}
	})

	t.Run("Naive", func(t *testing.T) {
		t.Parallel()
		code, rep := run(t, "--naive", "--duration", "4s", "--seed", "3", "--faults", "none")
		if code != 1 || rep.Pass || rep.Duplicates == 0 || rep.Mode != "naive" {
			t.Fatalf("fenceq chaos --naive: exit %d, pass %v, duplicates %d; want exit 1 with duplicates", code, rep.Pass, rep.Duplicates)
		}
	})
}
