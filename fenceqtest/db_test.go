package fenceqtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/migrations"
)

func schemaExists(t *testing.T, schema string) bool {
	t.Helper()
	ctx := context.Background()
	url, err := fenceqtest.ServerURL()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// New hands out a migrated schema of its own, on the pool's search_path and the URL's,
// and drops it when the test ends.
func TestNew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var schema string
	t.Run("Migrated", func(t *testing.T) {
		db := fenceqtest.New(t, nil)
		schema = db.Schema
		if !strings.HasPrefix(schema, "fq_test_") || !strings.Contains(db.URL, "search_path="+schema) {
			t.Fatalf("schema %q, URL %q: want fq_test_… named in the URL's search_path", schema, db.URL)
		}
		var current string
		var jobs, migs bool
		if err := db.Pool.QueryRow(ctx, `SELECT current_schema(), to_regclass('fenceq_jobs') IS NOT NULL,
			to_regclass('fenceq_schema_migrations') IS NOT NULL`).Scan(&current, &jobs, &migs); err != nil {
			t.Fatal(err)
		}
		if current != schema || !jobs || !migs {
			t.Fatalf("current schema %q (want %q), fenceq_jobs %v, fenceq_schema_migrations %v: want a migrated schema on the search_path",
				current, schema, jobs, migs)
		}
		// The URL reaches the same schema from another pool.
		other := db.NewPool(t, 1)
		var seen string
		if err := other.QueryRow(ctx, `SELECT current_schema()`).Scan(&seen); err != nil || seen != schema {
			t.Fatalf("NewPool's schema %q %v, want %q", seen, err, schema)
		}
		if got := db.Pool.Config().MaxConns; got != 8 {
			t.Errorf("default MaxConns %d, want 8", got)
		}
	})
	if schema == "" || schemaExists(t, schema) {
		t.Fatalf("schema %q still exists after its test ended", schema)
	}
}

func TestNewOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("NoMigrate", func(t *testing.T) {
		t.Parallel()
		db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true, MaxConns: 2})
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, db.Schema).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d tables %v in a NoMigrate schema, want none", n, err)
		}
		if got := db.Pool.Config().MaxConns; got != 2 {
			t.Errorf("MaxConns %d, want 2", got)
		}
	})
	t.Run("Migrations", func(t *testing.T) {
		t.Parallel()
		db := fenceqtest.New(t, &fenceqtest.Options{Migrations: []migrations.Set{migrations.Core(), appMigrations()}})
		if _, err := db.Pool.Exec(ctx, `INSERT INTO greetings (job_id, text) VALUES (1, 'hi')`); err != nil {
			t.Fatalf("the application's table: %v", err)
		}
		var jobs bool
		if err := db.Pool.QueryRow(ctx, `SELECT to_regclass('fenceq_jobs') IS NOT NULL`).Scan(&jobs); err != nil || !jobs {
			t.Fatalf("fenceq_jobs %v %v: the core set must be applied too", jobs, err)
		}
	})
	t.Run("BadMaxConns", func(t *testing.T) {
		t.Parallel()
		msg := mustFail(t, func(tb testing.TB) { fenceqtest.New(tb, &fenceqtest.Options{MaxConns: -1}) })
		if !strings.Contains(msg, "MaxConns -1") {
			t.Fatalf("failure %q should name MaxConns", msg)
		}
	})
}

// While cut, a partitioned pool reaches nothing; uncut, it works again.
func TestPartitionedPool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2})
	pool, cut := db.PartitionedPool(t, 2)
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	cut.Store(true)
	_, err := pool.Exec(ctx, `SELECT 1`)
	if !errors.Is(err, fenceqtest.ErrPartitioned) {
		t.Fatalf("while cut: %v, want ErrPartitioned", err)
	}
	cut.Store(false)
	if _, err := pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("after the cut: %v", err)
	}
}
