package migrations_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// historyIndexes returns the oids and names of the indexes on table.
func historyIndexes(ctx context.Context, t *testing.T, db *fenceqtest.DB, table string) map[uint32]string {
	t.Helper()
	rows, err := db.Pool.Query(ctx, `SELECT c.oid, c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass`, table)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]string{}
	for rows.Next() {
		var oid uint32
		var name string
		if err := rows.Scan(&oid, &name); err != nil {
			t.Fatal(err)
		}
		out[oid] = name
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// partitionOf names the partition of history that holds job id.
func partitionOf(ctx context.Context, t *testing.T, db *fenceqtest.DB, id int64) string {
	t.Helper()
	var name string
	if err := db.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM fenceq_jobs_history WHERE id = $1`, id).Scan(&name); err != nil {
		t.Fatalf("job %d in history: %v", id, err)
	}
	return name
}

// rangePartitions lists history's range partitions by name, in id order.
func rangePartitions(ctx context.Context, t *testing.T, db *fenceqtest.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(ctx, `SELECT name FROM fenceq_history_partitions()`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// Migration 000023 makes history a partitioned table while jobs run: history's rows stay
// where they are, as its first partition, whose indexes are attached to the partitioned
// table's rather than built again; running jobs keep their leases, and their holders
// then complete with the fence, into that partition, or are rejected. Down and up again
// keep every job.
func TestHistoryPartitionsMigrationWithJobsInFlight(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "a Citus distributed schema keeps one history table (docs/citus.md)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	if err := migrations.Core().Migrate(ctx, db.Pool, 22); err != nil {
		t.Fatalf("migrate to 22: %v", err)
	}
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO fenceq_jobs_history (id, kind, args, state, finished_at)
SELECT nextval(pg_get_serial_sequence('fenceq_jobs_hot', 'id')), 'done', jsonb_build_object('n', g), 'completed', now()
FROM generate_series(1, 50) g;
INSERT INTO fenceq_jobs_hot (kind) SELECT 'work' FROM generate_series(1, 6)`); err != nil {
		t.Fatal(err)
	}
	running, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: "default", WorkerID: "old", Limit: 3, Lease: time.Minute})
	if err != nil || len(running) != 3 {
		t.Fatalf("claim 3 jobs at schema 22: %d, %v", len(running), err)
	}
	before := historyIndexes(ctx, t, db, "fenceq_jobs_history")
	var jobs int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&jobs); err != nil {
		t.Fatal(err)
	}

	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatalf("up from 22: %v", err)
	}
	var partitioned bool
	var after, first int
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'fenceq_jobs_history'::regclass),
		(SELECT count(*) FROM fenceq_jobs), (SELECT count(*) FROM fenceq_jobs_history_0)`).Scan(&partitioned, &after, &first); err != nil {
		t.Fatal(err)
	}
	if !partitioned || after != jobs || first != 50 {
		t.Fatalf("after the migration: partitioned %v, %d jobs (%d before), %d in the first partition (want 50)", partitioned, after, jobs, first)
	}
	// The same indexes, now the first partition's, each attached to the partitioned
	// table's index of the name it had.
	moved := historyIndexes(ctx, t, db, "fenceq_jobs_history_0")
	parents := historyIndexes(ctx, t, db, "fenceq_jobs_history")
	for oid, name := range before {
		if _, ok := moved[oid]; !ok {
			t.Errorf("index %s (oid %d) was not kept: the first partition has %v", name, oid, moved)
			continue
		}
		var parent string
		if err := db.Pool.QueryRow(ctx, `SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = $1`, oid).Scan(&parent); err != nil || parent != name {
			t.Errorf("index %s (oid %d) is attached to %q (%v), want %s", moved[oid], oid, parent, err, name)
		}
	}
	if len(parents) != len(before) {
		t.Errorf("partitioned table's indexes %v, want the %d names of %v", parents, len(before), before)
	}

	lease := func(j *queue.JobRow) queue.Lease { return queue.Lease{JobID: j.ID, Gen: j.LeaseGen, Holder: "old"} }
	settleLeasesFromBefore(ctx, t, db, [3]queue.Lease{lease(running[0]), lease(running[1]), lease(running[2])})
	for _, j := range []*queue.JobRow{running[0], running[2]} {
		if p := partitionOf(ctx, t, db, j.ID); p != "fenceq_jobs_history_0" {
			t.Fatalf("job %d, completed, is in %s, want fenceq_jobs_history_0", j.ID, p)
		}
	}
	// A search by args reads the retained rows through the partition's index.
	page, err := store.ListJobsPage(ctx, db.Pool, queue.ListParams{JobFilter: queue.JobFilter{Args: json.RawMessage(`{"n": 7}`)}})
	if err != nil || len(page.Jobs) != 1 || page.Jobs[0].Kind != "done" {
		t.Fatalf("args search after the migration: %+v %v", page, err)
	}

	if err := migrations.Down(ctx, db.Pool, 1); err != nil {
		t.Fatalf("down to 22: %v", err)
	}
	requireJobs(ctx, t, db, after, "after down")
	if names := historyIndexes(ctx, t, db, "fenceq_jobs_history"); len(names) != len(before) {
		t.Fatalf("history's indexes after down: %v, want the names of %v", names, before)
	}
	if err := migrations.Up(ctx, db.Pool); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// A finishing write never fails for want of a partition: a job whose id is past every
// partition lands in the default one, and the partitions made next start above it.
// Partitions that retention emptied are dropped once no unfinished job can land in them.
// Neither function waits for a lock longer than it is told, and bad input is refused
// with the name of the argument.
func TestHistoryPartitionsDefaultAndDrop(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "a Citus distributed schema keeps one history table (docs/citus.md)")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	setNext := func(id int64) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('fenceq_jobs_hot', 'id'), $1 - 1)`, id); err != nil {
			t.Fatal(err)
		}
	}
	run := func() *queue.JobRow {
		t.Helper()
		if _, err := store.Insert(ctx, db.Pool, store.InsertParams{Kind: "k", Args: []byte(`{}`), Queue: "p"}); err != nil {
			t.Fatal(err)
		}
		got, err := store.Claim(ctx, db.Pool, store.ClaimParams{Queue: "p", WorkerID: "w", Limit: 1, Lease: time.Minute})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim: %d %v", len(got), err)
		}
		return got[0]
	}
	complete := func(j *queue.JobRow) {
		t.Helper()
		if err := store.Complete(ctx, db.Pool, queue.Lease{JobID: j.ID, Gen: j.LeaseGen, Holder: "w"}); err != nil {
			t.Fatalf("complete job %d: %v", j.ID, err)
		}
	}

	to, partitioned, err := store.ExtendHistory(ctx, db.Pool, 0)
	if err != nil || !partitioned || to < 1_000_000 {
		t.Fatalf("ExtendHistory on a new schema: %d %v %v", to, partitioned, err)
	}
	low := run() // an id in the first partition, left running for now

	setNext(to + 5)
	past := run()
	complete(past)
	if p := partitionOf(ctx, t, db, past.ID); p != "fenceq_jobs_history_default" {
		t.Fatalf("job %d, past every partition (to %d), finished into %s", past.ID, to, p)
	}
	to2, _, err := store.ExtendHistory(ctx, db.Pool, 1_000_000)
	if err != nil || to2 <= past.ID+1_000_000 {
		t.Fatalf("ExtendHistory past the default partition's row %d: to %d, %v", past.ID, to2, err)
	}
	var from int64
	if err := db.Pool.QueryRow(ctx, `SELECT min(from_id) FROM fenceq_history_partitions() WHERE from_id > $1`, to-1).Scan(&from); err != nil || from != past.ID+1 {
		t.Fatalf("the first partition made after the default's row %d starts at %d (%v), want %d", past.ID, from, err, past.ID+1)
	}
	next := run()
	complete(next)
	if p := partitionOf(ctx, t, db, next.ID); p != "fenceq_jobs_history_"+strconv.FormatInt(past.ID+1, 10) {
		t.Fatalf("job %d finished into %s, want the partition made from %d", next.ID, p, past.ID+1)
	}

	// Retention empties history, but job low, unfinished, can still land in the first
	// partition and those after it: nothing is dropped.
	if _, err := store.PruneFinished(ctx, db.Pool, 0, 1000); err != nil {
		t.Fatal(err)
	}
	if n, err := store.DropEmptiedHistory(ctx, db.Pool); err != nil || n != 0 {
		t.Fatalf("DropEmptiedHistory with job %d unfinished: dropped %d, %v", low.ID, n, err)
	}
	// A search holds history: the drop waits lock_wait for it, then gives up.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM fenceq_jobs_history`); err != nil {
		t.Fatal(err)
	}
	complete(low)
	if _, err := store.PruneFinished(ctx, db.Pool, 0, 1000); err != nil {
		t.Fatal(err)
	}
	var held bool
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = 'fenceq_jobs_history'::regclass
		AND pid <> pg_backend_pid() AND granted)`).Scan(&held); err != nil || !held {
		t.Fatalf("the open search holds no lock on history: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT fenceq_history_drop_emptied('50 milliseconds')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("drop while a search holds history: dropped %d, %v; want 0 after the wait", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	kept := run()
	complete(kept)
	names := rangePartitions(ctx, t, db)
	if n, err := store.DropEmptiedHistory(ctx, db.Pool); err != nil || n == 0 {
		t.Fatalf("DropEmptiedHistory once history is emptied and free: dropped %d, %v", n, err)
	}
	left := rangePartitions(ctx, t, db)
	if slices.Contains(left, "fenceq_jobs_history_0") || !slices.Contains(left, partitionOf(ctx, t, db, kept.ID)) {
		t.Fatalf("partitions before the drop %v, after %v: want the first gone and job %d's kept", names, left, kept.ID)
	}
	var below int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_history_partitions() WHERE to_id <= $1`, kept.ID).Scan(&below); err != nil || below != 0 {
		t.Fatalf("%d emptied partitions below the last id %d kept (%v): %v", below, kept.ID, err, left)
	}
	// A job whose range was dropped still finishes, into the default partition.
	setNext(10)
	late := run()
	complete(late)
	if p := partitionOf(ctx, t, db, late.ID); p != "fenceq_jobs_history_default" {
		t.Fatalf("job %d of a dropped range finished into %s", late.ID, p)
	}

	// With no range partition left at all, the next ones start at the partition of the
	// next id, not at the lowest ids.
	for _, name := range rangePartitions(ctx, t, db) {
		if _, err := db.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	setNext(5_500_000)
	to3, _, err := store.ExtendHistory(ctx, db.Pool, 0)
	if got := rangePartitions(ctx, t, db); err != nil || to3 != 6_000_000 || !slices.Equal(got, []string{"fenceq_jobs_history_5000000"}) {
		t.Fatalf("ExtendHistory with no range partition, next id 5,500,000: to %d, %v, partitions %v", to3, err, got)
	}

	for _, c := range []struct{ sql, arg string }{
		{`SELECT fenceq_history_extend(-1)`, "ahead"},
		{`SELECT fenceq_history_extend(1, '0 seconds')`, "lock_wait"},
		{`SELECT fenceq_history_drop_emptied(NULL)`, "lock_wait"},
	} {
		_, err := db.Pool.Exec(ctx, c.sql)
		if pe := pgError(err); pe == nil || pe.Code != stateInvalid || pe.ColumnName != c.arg {
			t.Errorf("%s: %v, want %s naming %s", c.sql, err, stateInvalid, c.arg)
		}
	}
	if _, _, err := store.ExtendHistory(ctx, db.Pool, -1); err == nil || !strings.Contains(err.Error(), "invalid ahead: -1") {
		t.Errorf("ExtendHistory(-1): %v, want the argument named", err)
	}
}
