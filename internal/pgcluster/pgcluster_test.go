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
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
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

// TestStandbyFailover starts a primary and a synchronous standby, commits a row on the
// primary, kills it in immediate mode, promotes the standby and finds the row there;
// then it checks that a multi-host URL with target_session_attrs=read-write reaches
// the promoted standby although the dead primary is listed first.
func TestStandbyFailover(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"synchronous_commit": "on"}})
	if err != nil {
		t.Fatalf("start primary: %v", err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	s, err := p.StartStandby(ctx, pgcluster.StandbyOptions{Name: "fenceq_standby", Sync: true})
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })

	pc, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		t.Fatal(err)
	}
	var names, syncState string
	if err := pc.QueryRow(ctx, `SELECT current_setting('synchronous_standby_names'),
		(SELECT sync_state FROM pg_stat_replication)`).Scan(&names, &syncState); err != nil {
		t.Fatal(err)
	}
	if names != `"fenceq_standby"` || syncState != "sync" {
		t.Fatalf("synchronous_standby_names %q, sync_state %q; want the standby, sync", names, syncState)
	}
	if _, err := pc.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	_ = pc.Close(ctx)

	sc, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	var inRecovery bool
	if err := sc.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("standby: pg_is_in_recovery %v, %v; want true", inRecovery, err)
	}
	if pid, err := s.WalReceiverPid(ctx); err != nil || pid == 0 {
		t.Fatalf("standby's WAL receiver pid %d, %v", pid, err)
	}
	_ = sc.Close(ctx)

	if err := p.Kill(ctx); err != nil {
		t.Fatalf("kill primary: %v", err)
	}
	if c, err := pgx.Connect(ctx, p.URL); err == nil {
		_ = c.Close(ctx)
		t.Fatal("the killed primary still accepts connections")
	}
	if err := s.Promote(ctx); err != nil {
		t.Fatalf("promote: %v", err)
	}
	multi := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		p.Port, s.Port)
	mc, err := pgx.Connect(ctx, multi)
	if err != nil {
		t.Fatalf("multi-host connect after the promotion: %v", err)
	}
	defer mc.Close(context.Background())
	var n int
	var port int
	if err := mc.QueryRow(ctx, `SELECT (SELECT count(*) FROM t), current_setting('port')::int`).Scan(&n, &port); err != nil {
		t.Fatal(err)
	}
	if n != 1 || port != s.Port {
		t.Fatalf("after failover: %d rows on port %d; want 1 row on the promoted standby's port %d", n, port, s.Port)
	}
	if _, err := mc.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatalf("write on the promoted standby: %v", err)
	}
}
