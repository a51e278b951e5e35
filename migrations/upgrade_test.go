package migrations_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// A schema at version 9 holding unique jobs (unfinished and finished ones sharing keys)
// migrates to the latest version, and the keys still mean what they meant: held while
// the job is unfinished, free once it finished.
func TestUpgradeFrom9KeepsUniqueJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	if err := migrations.Core().Migrate(ctx, db.Pool, 9); err != nil {
		t.Fatalf("migrate to 9: %v", err)
	}
	// Version 9's rows: key "held" by an available job and by two completed ones, key
	// "free" by a completed job only, and a job without a key.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO fenceq_jobs (kind, unique_key, state, finished_at) VALUES
    ('k', 'held', 'available', NULL), ('k', 'held', 'completed', now()), ('k', 'held', 'completed', now()),
    ('k', 'free', 'completed', now()), ('k', NULL, 'available', NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatalf("up from 9: %v", err)
	}
	rep, err := migrations.Status(ctx, db.Pool)
	if err != nil || rep.Version != migrations.Latest() || rep.Dirty {
		t.Fatalf("status after upgrade: %+v %v", rep, err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT unique_key, unique_states FROM fenceq_jobs ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var key *string
		var mask *int16
		if err := rows.Scan(&key, &mask); err != nil {
			t.Fatal(err)
		}
		switch {
		case key == nil && mask != nil:
			t.Fatalf("job without a key got unique_states %d", *mask)
		case key != nil && (mask == nil || !slices.Equal(store.StateMask(*mask).States(), queue.UnfinishedStates())):
			t.Fatalf("job with key %q: unique_states %v, want the unfinished states", *key, mask)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	held, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "k", UniqueKey: "held"})
	if err != nil || !held.Existing || held.Job.State != queue.StateAvailable || held.Job.ID != 1 {
		t.Fatalf("insert with the held key: %+v %v; want the available job 1 back", held, err)
	}
	free, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "k", UniqueKey: "free"})
	if err != nil || free.Existing {
		t.Fatalf("insert with a key only a finished job had: %+v %v; want a new job", free, err)
	}
	// The database itself still refuses a second unfinished holder.
	_, err = db.Pool.Exec(ctx, `INSERT INTO fenceq_jobs_hot (kind, unique_key, unique_states) VALUES ('k', 'held', 15)`)
	if !store.IsUniqueViolation(err, "fenceq_jobs_unique_key_idx") {
		t.Fatalf("a second holder of key held: %v, want a unique violation", err)
	}
}
