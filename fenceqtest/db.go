package fenceqtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/migrations"
)

// DB is one test's schema on the test server.
type DB struct {
	// Pool connects to the schema (its search_path points at it). It is closed when the
	// test ends.
	Pool *pgxpool.Pool
	// Schema is the schema's name, fq_test_ and 12 hex digits.
	Schema string
	// URL connects to the schema (search_path set), for other pools and processes.
	URL string
}

// Options tunes New. The zero value (or nil) takes every default.
type Options struct {
	// MaxConns bounds Pool. Defaults to 8.
	MaxConns int32
	// NoMigrate leaves the schema empty.
	NoMigrate bool
	// Migrations are the sets applied to the schema, in order, and the only ones: a
	// non-empty list replaces the default rather than adding to it. Empty (the default)
	// applies the core's alone (migrations.Core()). An application whose tests need
	// fenceq's tables and its own lists the core first, then its own sets:
	//
	//	Migrations: []migrations.Set{migrations.Core(), myapp.Migrations()}
	//
	// A list without migrations.Core() leaves fenceq's tables out of the schema.
	Migrations []migrations.Set
}

// New creates a fresh schema on the test server (see ServerURL), migrates it with
// opts.Migrations unless opts.NoMigrate, and returns it with a pool whose search_path
// points at it. The schema is dropped when the test ends. Each test having its own
// schema, tests run in parallel on one database. A nil opts takes the defaults.
func New(t testing.TB, opts *Options) *DB {
	t.Helper()
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxConns == 0 {
		o.MaxConns = 8
	}
	if o.MaxConns < 0 {
		t.Fatalf("fenceqtest: New: Options.MaxConns %d must be positive", o.MaxConns)
	}
	base, err := ServerURL()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()

	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "fq_test_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("fenceqtest: connect to %s: %v", redact.URL(base), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("fenceqtest: create schema %s: %v", schema, err)
	}
	t.Cleanup(func() { dropSchema(t, base, schema) })

	u := connstr.WithSearchPath(base, schema)
	db := &DB{Schema: schema, URL: u}
	db.Pool = db.NewPool(t, o.MaxConns)
	if !o.NoMigrate {
		sets := o.Migrations
		if len(sets) == 0 {
			sets = []migrations.Set{migrations.Core()}
		}
		if err := migrations.UpAll(ctx, db.Pool, sets...); err != nil {
			t.Fatalf("fenceqtest: migrate schema %s: %v", schema, err)
		}
	}
	return db
}

// setupTimeout bounds New's set-up (the schema and its migrations) and the schema's
// drop at cleanup. A schema's migrations take seconds on a busy machine and longer on a
// Citus coordinator, where each DDL statement is distributed; a hang is still bounded by
// the test binary's own timeout.
const setupTimeout = 3 * time.Minute

func dropSchema(t testing.TB, base, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Errorf("fenceqtest: drop schema %s: %v", schema, err)
		return
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("fenceqtest: drop schema %s: %v", schema, err)
	}
}

// NewPool opens another pool on the schema, of at most maxConns connections, closed
// when the test ends.
func (d *DB) NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pool, _ := d.pool(t, maxConns, nil)
	return pool
}

// ErrPartitioned is what a pool from PartitionedPool answers, while cut off, instead of
// a connection.
var ErrPartitioned = errors.New("fenceqtest: partitioned: database unreachable")

// PartitionedPool opens another pool on the schema that can be cut off from the
// database, as a paused or killed process is: while the returned flag is set, every
// acquire fails at once with ErrPartitioned, so no heartbeat, claim or write made through
// the pool reaches the database. The pool is closed when the test ends.
func (d *DB) PartitionedPool(t testing.TB, maxConns int32) (*pgxpool.Pool, *atomic.Bool) {
	t.Helper()
	cut := new(atomic.Bool)
	return d.pool(t, maxConns, cut)
}

func (d *DB) pool(t testing.TB, maxConns int32, cut *atomic.Bool) (*pgxpool.Pool, *atomic.Bool) {
	t.Helper()
	if maxConns < 1 {
		t.Fatalf("fenceqtest: pool of %d connections: want at least 1", maxConns)
	}
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		t.Fatalf("fenceqtest: parse %s: %v", redact.URL(d.URL), err)
	}
	cfg.MaxConns = maxConns
	if cut != nil {
		cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
			if cut.Load() {
				return true, ErrPartitioned
			}
			return true, nil
		}
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("fenceqtest: pool on schema %s: %v", d.Schema, err)
	}
	t.Cleanup(pool.Close)
	return pool, cut
}
