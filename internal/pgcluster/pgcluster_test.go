package pgcluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/pgcluster"
)

func TestStartStop(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	dir := c.Dir
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatalf("connect to %s: %v", c.URL, err)
	}
	var user string
	var fsync string
	if err := conn.QueryRow(ctx, "SELECT current_user, current_setting('fsync')").Scan(&user, &fsync); err != nil {
		t.Fatalf("query: %v", err)
	}
	if user != "postgres" || fsync != "off" {
		t.Fatalf("user %q fsync %q, want postgres and off", user, fsync)
	}

	t.Run("RestartImmediate", func(t *testing.T) {
		if err := c.Restart(ctx, "immediate"); err != nil {
			t.Fatalf("restart: %v", err)
		}
		if err := conn.Ping(ctx); err == nil {
			t.Fatalf("old connection survived an immediate restart")
		}
		conn2, err := pgx.Connect(ctx, c.URL)
		if err != nil {
			t.Fatalf("reconnect after restart: %v", err)
		}
		_ = conn2.Close(ctx)
	})
	_ = conn.Close(ctx)

	if err := c.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still exists after Stop (err %v)", dir, err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}

func TestStartWithMissingBinaries(t *testing.T) {
	t.Parallel()
	_, err := pgcluster.Start(context.Background(), pgcluster.Options{BinDir: t.TempDir()})
	if !errors.Is(err, pgcluster.ErrNoBinaries) {
		t.Fatalf("err = %v, want ErrNoBinaries", err)
	}
}

// A cluster whose owner process is gone is shut down and removed by ReapOrphans; one
// whose owner runs is left alone.
func TestReapOrphans(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); errors.Is(err, pgcluster.ErrNoBinaries) {
		t.Skip("no PostgreSQL server binaries on this machine")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The pid of a process that has exited.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	base := os.TempDir()
	prefix := fmt.Sprintf("fenceq-reap-test-%d-", os.Getpid())
	orphan, err := pgcluster.Start(ctx, pgcluster.Options{DirPrefix: prefix, OwnerPID: gone.Process.Pid})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = orphan.Stop(context.Background()) })
	owned, err := pgcluster.Start(ctx, pgcluster.Options{DirPrefix: prefix, OwnerPID: os.Getpid()})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = owned.Stop(context.Background()) })
	pidOf := func(c *pgcluster.Cluster) int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(c.Dir, "data", "postmaster.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	orphanPID := pidOf(orphan)

	removed, err := pgcluster.ReapOrphans(base, prefix)
	if err != nil {
		t.Fatalf("reap: %v", err)
	}
	if len(removed) != 1 || removed[0] != orphan.Dir {
		t.Fatalf("removed %v, want only %s", removed, orphan.Dir)
	}
	if _, err := os.Stat(orphan.Dir); !os.IsNotExist(err) {
		t.Fatalf("orphaned cluster directory still exists (err %v)", err)
	}
	if err := syscall.Kill(orphanPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("orphaned postmaster %d still runs (kill 0: %v)", orphanPID, err)
	}
	conn, err := pgx.Connect(ctx, owned.URL)
	if err != nil {
		t.Fatalf("the owned cluster was touched: %v", err)
	}
	_ = conn.Close(ctx)
	if _, err := pgcluster.ReapOrphans(base, ""); err == nil {
		t.Fatal("ReapOrphans with an empty prefix: no error")
	}
}
