// Package dbtest hands each test its own PostgreSQL schema, migrated, on the shared test
// database, so tests run in parallel against a real server.
//
// The server is TEST_DATABASE_URL when set, else the local one at
// postgres://postgres@127.0.0.1:5432/test.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/migrations"
)

// DefaultURL is the database used when TEST_DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// BaseURL returns the test server's URL.
func BaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's schema.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	// URL connects to the schema (search_path set), for other processes and pools.
	URL string
}

// Options tunes New.
type Options struct {
	// MaxConns bounds the pool. Defaults to 8.
	MaxConns int32
	// NoMigrate leaves the schema empty.
	NoMigrate bool
	// Migrations are the sets applied to the schema, in order. Defaults to the core's
	// alone (migrations.Core()).
	Migrations []migrations.Set
}

// New creates a fresh schema, migrates it (unless NoMigrate), and returns a pool whose
// search_path points at it. The schema is dropped when the test ends.
func New(t testing.TB, opts ...Options) *DB {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.MaxConns == 0 {
		o.MaxConns = 8
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "fq_test_" + hex.EncodeToString(b[:])

	admin, err := pgx.Connect(ctx, BaseURL())
	if err != nil {
		t.Fatalf("dbtest: connect to %s: %v (set TEST_DATABASE_URL)", redact.URL(BaseURL()), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("dbtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, BaseURL())
		if err != nil {
			t.Errorf("dbtest: drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dbtest: drop schema %s: %v", schema, err)
		}
	})

	u := connstr.WithSearchPath(BaseURL(), schema)
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("dbtest: parse url: %v", err)
	}
	cfg.MaxConns = o.MaxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if !o.NoMigrate {
		sets := o.Migrations
		if len(sets) == 0 {
			sets = []migrations.Set{migrations.Core()}
		}
		if err := migrations.UpAll(ctx, pool, sets...); err != nil {
			t.Fatalf("dbtest: migrate schema %s: %v", schema, err)
		}
	}
	return &DB{Pool: pool, Schema: schema, URL: u}
}

// NewPool opens another pool on the same schema, closed when the test ends.
func (d *DB) NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatalf("dbtest: parse url: %v", err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// ErrPartitioned is what a pool from PartitionedPool answers, while cut off, instead of
// a connection.
var ErrPartitioned = errors.New("test partition: database unreachable")

// PartitionedPool opens another pool on the same schema that can be cut off from the
// database, as a paused or killed process is: while the returned flag is set, every
// acquire fails at once with ErrPartitioned, so no heartbeat, claim or write made through
// the pool reaches the database. The pool is closed when the test ends.
func (d *DB) PartitionedPool(t testing.TB, maxConns int32) (*pgxpool.Pool, *atomic.Bool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatalf("dbtest: parse url: %v", err)
	}
	cfg.MaxConns = maxConns
	cut := new(atomic.Bool)
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if cut.Load() {
			return true, ErrPartitioned
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, cut
}
