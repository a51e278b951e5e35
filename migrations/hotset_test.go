package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// The statements of a worker built for schema 13, the single job table: its claim, its
// fenced completion and its enqueue, as that engine sent them.
const (
	v13Claim = `
WITH next AS (
    SELECT id AS next_id FROM fenceq_jobs
    WHERE state = 'available' AND queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
UPDATE fenceq_jobs
SET state = 'running', attempt = attempt + 1, lease_gen = lease_gen + 1,
    leased_by = 'old', heartbeat_at = now(), attempted_at = now(),
    lease_expires_at = now() + interval '1 minute'
FROM next WHERE id = next.next_id
RETURNING id, lease_gen`
	v13Complete = `
UPDATE fenceq_jobs SET state = 'completed', finished_at = now(), lease_expires_at = NULL, output = NULL
WHERE id = $1 AND lease_gen = $2 AND state = 'running'`
	v13Insert = `
INSERT INTO fenceq_jobs (queue, kind, args, unique_key, unique_states)
VALUES ('default', 'k', '{}', $1, 15)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND fenceq_state_in_mask(state, unique_states) DO NOTHING
RETURNING id`
)

type leaseRow struct{ id, gen int64 }

func v13ClaimN(ctx context.Context, t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, n int) []leaseRow {
	t.Helper()
	rows, err := db.Query(ctx, v13Claim, n)
	if err != nil {
		t.Fatalf("claim as schema 13 did: %v", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (leaseRow, error) {
		var l leaseRow
		return l, r.Scan(&l.id, &l.gen)
	})
	if err != nil || len(out) != n {
		t.Fatalf("claim as schema 13 did: %d rows, want %d: %v", len(out), n, err)
	}
	return out
}

// tableOf says which table holds job id now.
func tableOf(ctx context.Context, t *testing.T, db *fenceqtest.DB, id int64) string {
	t.Helper()
	var hot, hist bool
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM fenceq_jobs_hot WHERE id = $1),
		EXISTS (SELECT 1 FROM fenceq_jobs_history WHERE id = $1)`, id).Scan(&hot, &hist); err != nil {
		t.Fatal(err)
	}
	switch {
	case hot && hist:
		t.Fatalf("job %d is in both tables", id)
	case hot:
		return "hot"
	case hist:
		return "history"
	}
	return "none"
}

// settleLeasesFromBefore settles, with this engine, three leases taken before a
// migration: the first holder completes; the second's lease is revoked by an operator
// and its completion is rejected; the third runs a fenced transaction that writes a row
// (in a table results it creates) and completes. The caller checks where the jobs went.
func settleLeasesFromBefore(ctx context.Context, t *testing.T, db *fenceqtest.DB, leases [3]queue.Lease) {
	t.Helper()
	if err := store.Complete(ctx, db.Pool, leases[0]); err != nil {
		t.Fatalf("complete a lease taken before the migration: %v", err)
	}
	if _, err := store.RequeueJob(ctx, db.Pool, leases[1].JobID); err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, db.Pool, leases[1]); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("completion after revocation: %v, want ErrLeaseLost", err)
	}
	if tableOf(ctx, t, db, leases[1].JobID) != "hot" {
		t.Fatalf("revoked job %d left the hot set", leases[1].JobID)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	err := store.WithLease(ctx, db.Pool, leases[2], store.LeaseTx{Complete: true}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO results VALUES ($1)`, leases[2].JobID)
		return err
	})
	if err != nil {
		t.Fatalf("fenced transaction of a lease taken before the migration: %v", err)
	}
}

// requireJobs fails the test unless the view of every job holds want jobs.
func requireJobs(ctx context.Context, t *testing.T, db *fenceqtest.DB, want int, when string) {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil || n != want {
		t.Fatalf("jobs %s: %d, want %d: %v", when, n, want, err)
	}
}

// Migration 000014 moves a schema-13 database's jobs to the hot set and history while
// jobs are running: finished jobs move to history (but a job holding its unique key in
// its final state stays hot), running jobs keep their leases, and their holders then
// complete with the fence or are rejected, with the new engine or with the statements of
// a worker built before the migration.
func TestHotSetMigrationWithJobsInFlight(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "Citus finishes jobs in place and refuses writes through a view (docs/citus.md)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	if err := migrations.Core().Migrate(ctx, db.Pool, 13); err != nil {
		t.Fatalf("migrate to 13: %v", err)
	}
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO fenceq_jobs (kind, state, finished_at, unique_key, unique_states) VALUES
    ('done', 'completed', now(), NULL, NULL),
    ('done', 'discarded', now(), NULL, NULL),
    ('done', 'cancelled', now(), NULL, NULL),
    ('done', 'completed', now(), 'kept', 31),
    ('done', 'completed', now(), 'freed', 15);
INSERT INTO fenceq_jobs (kind) SELECT 'work' FROM generate_series(1, 6)`); err != nil {
		t.Fatal(err)
	}
	running := v13ClaimN(ctx, t, db.Pool, 4)
	var before int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&before); err != nil {
		t.Fatal(err)
	}

	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatalf("up from 13: %v", err)
	}
	var after, hist, hot int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM fenceq_jobs), (SELECT count(*) FROM fenceq_jobs_history),
		(SELECT count(*) FROM fenceq_jobs_hot)`).Scan(&after, &hist, &hot); err != nil {
		t.Fatal(err)
	}
	if after != before || hist != 4 || hot != before-4 {
		t.Fatalf("after the migration: %d jobs (%d before), %d in history (want 4), %d hot", after, before, hist, hot)
	}
	var kept string
	if err := db.Pool.QueryRow(ctx, `SELECT unique_key FROM fenceq_jobs_hot WHERE state = 'completed'`).Scan(&kept); err != nil || kept != "kept" {
		t.Fatalf("the completed job holding its key in completed stays hot: %q %v", kept, err)
	}
	for _, r := range running {
		j, err := store.GetJob(ctx, db.Pool, r.id)
		if err != nil || j.State != queue.StateRunning || j.LeaseGen != r.gen || tableOf(ctx, t, db, r.id) != "hot" {
			t.Fatalf("running job %d after the migration: %+v %v", r.id, j, err)
		}
	}

	lease := func(r leaseRow) queue.Lease { return queue.Lease{JobID: r.id, Gen: r.gen, Holder: "old"} }
	settleLeasesFromBefore(ctx, t, db, [3]queue.Lease{lease(running[0]), lease(running[1]), lease(running[2])})
	for _, r := range []leaseRow{running[0], running[2]} {
		if got := tableOf(ctx, t, db, r.id); got != "history" {
			t.Fatalf("job %d, completed, is in %s, want history", r.id, got)
		}
	}
	// The fourth holder is a worker built before the migration: its completion goes
	// through the view's trigger, fenced; after a revocation it matches nothing.
	tag, err := db.Pool.Exec(ctx, v13Complete, running[3].id, running[3].gen)
	if err != nil || tag.RowsAffected() != 1 || tableOf(ctx, t, db, running[3].id) != "history" {
		t.Fatalf("schema-13 completion through the view: %v rows %d", err, tag.RowsAffected())
	}
	again := v13ClaimN(ctx, t, db.Pool, 1)
	if _, err := store.RequeueJob(ctx, db.Pool, again[0].id); err != nil {
		t.Fatal(err)
	}
	tag, err = db.Pool.Exec(ctx, v13Complete, again[0].id, again[0].gen)
	if err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("schema-13 completion of a revoked lease: %v rows %d, want 0", err, tag.RowsAffected())
	}
	if j, err := store.GetJob(ctx, db.Pool, again[0].id); err != nil || j.State != queue.StateAvailable || j.LeaseGen != again[0].gen+1 {
		t.Fatalf("revoked job after the stale completion: %+v %v", j, err)
	}
	// Its enqueue is refused, and nothing is written.
	if _, err := db.Pool.Exec(ctx, v13Insert, "new-key"); err == nil {
		t.Fatal("a schema-13 enqueue (INSERT … ON CONFLICT into fenceq_jobs) was accepted")
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs WHERE unique_key = 'new-key'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused enqueue wrote %d jobs: %v", n, err)
	}

	// One step down and up again keeps every job.
	if err := migrations.Down(ctx, db.Pool, 1); err != nil {
		t.Fatalf("one step down: %v", err)
	}
	requireJobs(ctx, t, db, after, "after down")
	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// A write through the view compares and sets on the lease generation and state it read:
// it moves a job between the tables as its new state says, and a job whose generation
// moved on in between is not written.
func TestJobsViewWrites(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "Citus refuses writes through a view (docs/citus.md)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	var id int64
	if err := db.Pool.QueryRow(ctx, `INSERT INTO fenceq_jobs (kind) VALUES ('k') RETURNING id`).Scan(&id); err != nil {
		t.Fatalf("insert through the view: %v", err)
	}
	if got := tableOf(ctx, t, db, id); got != "hot" {
		t.Fatalf("inserted job in %s", got)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs SET state = 'cancelled', finished_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if got := tableOf(ctx, t, db, id); got != "history" {
		t.Fatalf("cancelled job in %s, want history", got)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs SET state = 'available', finished_at = NULL WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if got := tableOf(ctx, t, db, id); got != "hot" {
		t.Fatalf("job made available again in %s, want hot", got)
	}
	// The trigger's compare-and-set: a write whose row changed generation since the
	// statement read it writes nothing. Simulated by a transaction that holds the row
	// while another bumps it: the view's UPDATE reads the old row, waits, and misses.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `UPDATE fenceq_jobs_hot SET lease_gen = lease_gen + 1 WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var rows int64
	go func() {
		tag, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs SET state = 'completed', finished_at = now() WHERE id = $1 AND lease_gen = 0`, id)
		rows = tag.RowsAffected()
		done <- err
	}()
	// Wait until the view's UPDATE waits for the row lock, then commit the bump.
	for {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE fenceq_jobs SET state = ''completed''%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the view's UPDATE did not wait for the row: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || rows != 0 {
		t.Fatalf("write through the view after the generation moved: %v, %d rows, want 0", err, rows)
	}
	if j, err := store.GetJob(ctx, db.Pool, id); err != nil || j.State != queue.StateAvailable || j.LeaseGen != 1 {
		t.Fatalf("job after the missed write: %+v %v", j, err)
	}
}

// The engine checks the schema it needs: a schema one migration short of
// store.SchemaVersion is refused with the step to take, and that version passes.
func TestEngineSchemaCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	if store.SchemaVersion > migrations.Latest() {
		t.Fatalf("store.SchemaVersion %d is beyond the latest migration %d", store.SchemaVersion, migrations.Latest())
	}
	// One migration short of SchemaVersion, whatever its number.
	if err := migrations.Core().Migrate(ctx, db.Pool, store.SchemaVersion); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Core().Down(ctx, db.Pool, 1); err != nil {
		t.Fatal(err)
	}
	if err := store.CheckSchema(ctx, db.Pool); err == nil || !strings.Contains(err.Error(), "migrate up") {
		t.Fatalf("schema before %d: %v, want the refusal naming `fenceq migrate up`", store.SchemaVersion, err)
	}
	if err := migrations.Core().Migrate(ctx, db.Pool, store.SchemaVersion); err != nil {
		t.Fatal(err)
	}
	if err := store.CheckSchema(ctx, db.Pool); err != nil {
		t.Fatalf("schema %d: %v", store.SchemaVersion, err)
	}
}
