package pgcluster_test

import (
	"context"
	"errors"
	"os"
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
