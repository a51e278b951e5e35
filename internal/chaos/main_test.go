package chaos

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fenceq/fenceq/fenceqtest"
)

// naiveWorkerEnv makes the test binary run as a naive worker process instead of
// running tests: the tests start naive workers by re-executing themselves.
const naiveWorkerEnv = "FENCEQ_CHAOS_TEST_NAIVE_WORKER"

// TestBinary is the fenceq binary built for this test run; TestNaiveCommand and
// TestNaiveEnv start a naive worker process. Exported for the chaos_test package.
var (
	TestBinary       string
	TestNaiveCommand []string
	TestNaiveEnv     = []string{naiveWorkerEnv + "=1"}
)

func TestMain(m *testing.M) {
	if os.Getenv(naiveWorkerEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := RunNaiveCommand(ctx, os.Args[1:])
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "naive worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "fenceq-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	TestBinary, err = BuildBinary(ctx, dir)
	cancel()
	if err != nil {
		_ = os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	TestNaiveCommand = []string{self}
	code := fenceqtest.Run(m) // stops the throwaway PostgreSQL cluster, if one was started
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
