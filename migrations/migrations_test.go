package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/migrations"
)

func tables(t *testing.T, db *fenceqtest.DB) map[string]bool {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT table_name FROM information_schema.tables WHERE table_schema = $1`, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[n] = true
	}
	return out
}

// Up → Down → Up round-trips cleanly, in a schema of its own.
func TestUpDownUpRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})

	rep, err := migrations.Status(ctx, db.Pool)
	if err != nil || rep.Version != 0 || len(rep.Migrations) == 0 || rep.Migrations[0].Applied {
		t.Fatalf("fresh status: %+v %v", rep, err)
	}
	for round := 0; round < 2; round++ {
		if err := migrations.Up(ctx, db.Pool); err != nil {
			t.Fatalf("round %d up: %v", round, err)
		}
		rep, err := migrations.Status(ctx, db.Pool)
		if err != nil || rep.Version != migrations.Latest() || rep.Dirty {
			t.Fatalf("round %d status after up: %+v %v", round, rep, err)
		}
		for _, m := range rep.Migrations {
			if !m.Applied {
				t.Fatalf("round %d: migration %d %s not applied", round, m.Version, m.Name)
			}
		}
		have := tables(t, db)
		for _, want := range []string{"fenceq_jobs", "fenceq_workers", "fenceq_queues", "fenceq_lease_events", "fenceq_outbox"} {
			if !have[want] {
				t.Fatalf("round %d: table %s missing after up (have %v)", round, want, have)
			}
		}
		// Up again is a no-op.
		if err := migrations.Up(ctx, db.Pool); err != nil {
			t.Fatalf("second up: %v", err)
		}
		if err := migrations.Down(ctx, db.Pool, 0); err != nil {
			t.Fatalf("round %d down: %v", round, err)
		}
		left := tables(t, db)
		delete(left, migrations.Table)
		if len(left) != 0 {
			t.Fatalf("round %d: tables left after down: %v", round, left)
		}
	}
	// Down by steps reverts one migration at a time.
	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Down(ctx, db.Pool, 1); err != nil {
		t.Fatal(err)
	}
	rep, err = migrations.Status(ctx, db.Pool)
	// Versions need not be contiguous (numbers are assigned to work in progress): one
	// step down goes to the version before the latest that exists.
	if err != nil || len(rep.Migrations) < 2 {
		t.Fatalf("after down 1: %+v %v", rep, err)
	}
	if prev := rep.Migrations[len(rep.Migrations)-2].Version; rep.Version != prev {
		t.Fatalf("after down 1: version %d, want %d", rep.Version, prev)
	}
}

// A migration that failed half-way leaves the schema dirty: Up and Down refuse to run,
// and Status still reports the version and the dirty flag for the operator to act on.
func TestDirtySchemaIsReportedAndRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil) // migrated
	if _, err := db.Pool.Exec(ctx, `UPDATE `+migrations.Table+` SET dirty = true`); err != nil {
		t.Fatal(err)
	}
	rep, err := migrations.Status(ctx, db.Pool)
	if err != nil || !rep.Dirty || rep.Version != migrations.Latest() {
		t.Fatalf("status of a dirty schema: %+v %v; want dirty at version %d", rep, err, migrations.Latest())
	}
	if err := migrations.Up(ctx, db.Pool); !errors.Is(err, migrations.ErrDirty) {
		t.Fatalf("up on a dirty schema: %v, want ErrDirty", err)
	}
	if err := migrations.Down(ctx, db.Pool, 1); !errors.Is(err, migrations.ErrDirty) {
		t.Fatalf("down on a dirty schema: %v, want ErrDirty", err)
	}
}

// An application that applies fenceq's migrations gets fenceq's tables and nothing else
// next to its own.
func TestUpCreatesOnlyFenceqTables(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	have := tables(t, db)
	if len(have) < 6 {
		t.Fatalf("tables after up: %v", have)
	}
	for name := range have {
		if !strings.HasPrefix(name, "fenceq_") {
			t.Errorf("migrations.Up created table %s", name)
		}
	}
}
