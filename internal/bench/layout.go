package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
)

// The layout workload compares ways of storing jobs at the bare-SQL level, like the
// bare-SQL ceiling: no Worker, only the protocol's statements (a claim of up to
// ceilingBatch jobs with FOR UPDATE SKIP LOCKED and the lease generation bumped, then
// one batched fenced completion of the claimed jobs), on each candidate layout in a
// schema of its own. Every layout keeps the columns and constraints of fenceq_jobs;
// they differ in where a job lives before and after it finishes and in which indexes
// a claim and a completion touch.

// Layout names.
const (
	LayoutSingle      = "single"
	LayoutSplit       = "split"
	LayoutPartitioned = "partitioned"
	LayoutNarrow      = "narrow"
	LayoutHeapOnly    = "heaponly"
	LayoutLeaseSet    = "leaseset"
)

// Layouts lists the layouts of the layout workload in report order.
var Layouts = []string{LayoutSingle, LayoutSplit, LayoutPartitioned, LayoutNarrow, LayoutHeapOnly, LayoutLeaseSet}

// Metrics of the layout workload. Blocks are buffer accesses (pg_statio_user_tables
// heap_blks_hit + heap_blks_read, idx_blks_hit + idx_blks_read) summed over the
// layout's tables during the drain; pages are of the tables that hold unfinished jobs
// (pg_total_relation_size: heap, indexes and TOAST).
const (
	MetricHeapBlksPerClaim    = "heap_blks_per_claim"
	MetricIdxBlksPerClaim     = "idx_blks_per_claim"
	MetricHeapBlksPerJob      = "heap_blks_per_job"
	MetricIdxBlksPerJob       = "idx_blks_per_job"
	MetricExplainBlksPerClaim = "explain_blks_per_claim" // shared buffers of one claim mid-drain, EXPLAIN (ANALYZE, BUFFERS)
	MetricVacuumMs            = "vacuum_ms"              // VACUUM of the layout's tables right after the drain
	MetricHotPagesBefore      = "hot_pages_before"       // before the drain
	MetricHotPagesAfter       = "hot_pages_after"        // right after it
	MetricHotPagesVacuumed    = "hot_pages_vacuumed"     // after that VACUUM
	MetricClaims              = "claims"                 // claims that returned jobs
	MetricClaimRetries        = "claim_retries"          // claims that failed with a serialization error and were taken again
)

// layoutColumns are fenceq_jobs' columns after the id, as the core migrations leave
// them (through 000013), with its constraints.
const layoutColumns = `
    queue            text        NOT NULL DEFAULT 'default',
    kind             text        NOT NULL,
    args             jsonb       NOT NULL DEFAULT '{}',
    state            text        NOT NULL DEFAULT 'available',
    priority         smallint    NOT NULL DEFAULT 1,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 25,
    lease_gen        bigint      NOT NULL DEFAULT 0,
    leased_by        text,
    heartbeat_at     timestamptz,
    lease_expires_at timestamptz,
    attempted_at     timestamptz,
    unique_key       text,
    errors           jsonb       NOT NULL DEFAULT '[]',
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    metadata         jsonb       NOT NULL DEFAULT '{}',
    output           jsonb,
    unique_states    smallint,
    tags             text[]      NOT NULL DEFAULT '{}',
    CHECK (state IN ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled')),
    CHECK (char_length(queue) BETWEEN 1 AND 64),
    CHECK (char_length(kind) BETWEEN 1 AND 128),
    CHECK (jsonb_typeof(args) = 'object'),
    CHECK (max_attempts >= 1 AND attempt >= 0),
    CHECK (state <> 'running' OR lease_expires_at IS NOT NULL),
    CHECK ((state IN ('completed', 'discarded', 'cancelled')) = (finished_at IS NOT NULL)),
    CHECK (jsonb_typeof(metadata) = 'object'),
    CHECK ((unique_key IS NULL) = (unique_states IS NULL))`

// layoutColumnNames lists layoutColumns' names, for INSERT … SELECT.
const layoutColumnNames = `queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen, leased_by,
    heartbeat_at, lease_expires_at, attempted_at, unique_key, errors, created_at, finished_at, metadata, output,
    unique_states, tags`

// sqlLayoutMaskFunction is the core's fenceq_state_in_mask, which the unique-key
// index's predicate calls.
const sqlLayoutMaskFunction = `
CREATE FUNCTION fenceq_state_in_mask(state text, mask smallint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (mask::int >> (array_position(
        '{available,scheduled,running,retryable,completed,discarded,cancelled}'::text[], state) - 1)) & 1 = 1
$$`

// Index definitions of the core's job table, by what they serve; %s is the table.
const (
	idxClaim    = `CREATE INDEX ON %s (queue, priority, run_at, id) WHERE state = 'available'`
	idxLease    = `CREATE INDEX ON %s (lease_expires_at) WHERE state = 'running'`
	idxDue      = `CREATE INDEX ON %s (run_at) WHERE state IN ('scheduled', 'retryable')`
	idxFinished = `CREATE INDEX ON %s (finished_at) WHERE finished_at IS NOT NULL`
	idxUnique   = `CREATE UNIQUE INDEX ON %s (unique_key) WHERE unique_key IS NOT NULL AND fenceq_state_in_mask(state, unique_states)`
	idxKind     = `CREATE INDEX ON %s (kind, id) WHERE state IN ('available', 'scheduled', 'retryable')`
	idxTags     = `CREATE INDEX ON %s USING gin (tags) WHERE tags <> '{}'`
)

func indexes(table string, defs ...string) []string {
	out := make([]string, len(defs))
	for i, d := range defs {
		out[i] = fmt.Sprintf(d, table)
	}
	return out
}

// layoutDef is one storage layout: its tables and the protocol's statements on them.
type layoutDef struct {
	name     string
	describe string
	ddl      []string
	// tables are all of the layout's tables (VACUUMed after the drain); hot are those
	// that hold unfinished jobs.
	tables, hot []string
	// retain inserts finished jobs $1..$2 (sequence numbers stored negated, ids
	// ascending); afterRetain runs once they are in, with $1 the last retained id.
	retain      string
	afterRetain string
	// fill inserts $1 available jobs, sequence numbers 0..$1-1; afterFill runs next.
	fill      string
	afterFill string
	// claimStart claims from the start of the claim order, claimAfter after the
	// position ($3 priority, $4 run_at, $5 id) where the claimer's previous claim ended,
	// as the engine's claim cursor does: $1 limit, $2 claimer; both return (id,
	// lease_gen, priority, run_at). complete: $1 ids, $2 generations; affects one row
	// per job completed.
	claimStart, claimAfter, complete string
	// claimLock, when set, runs before the claim in the claim's transaction, each
	// statement with a snapshot of its own: the claim then sees every claim committed
	// before the lock was granted.
	claimLock string
	// verify returns, of the run's jobs (sequence number >= 0), how many are completed
	// at the first attempt and how many rows remain unfinished anywhere.
	verify string
}

const sqlFillJobs = `
INSERT INTO jobs (queue, kind, args) SELECT 'default', 'bench_noop', jsonb_build_object('seq', g)
FROM generate_series(0, $1::bigint - 1) g`

const sqlRetainJobs = `
INSERT INTO %s (%squeue, kind, args, state, attempt, lease_gen, finished_at, run_at, created_at, attempted_at)
SELECT %s'default', 'bench_noop', jsonb_build_object('seq', -g), 'completed', 1, 1,
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series($1::bigint, $2::bigint) g`

// The claim of the layouts without a ready table: %[1]s is the table, %[2]s and %[3]s extra
// conditions on the claimed rows and on the updated ones, %[4]s the cursor's. The
// update finds the claimed rows by primary key, as the engine's claim does (id = ANY of
// an array): a join with the CTE is planned as a hash join over the whole table.
const sqlLayoutClaim = `
WITH next AS (
    SELECT id FROM %[1]s
    WHERE state = 'available' AND queue = 'default' AND run_at <= now()%[2]s%[4]s
    ORDER BY priority, run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
UPDATE %[1]s j
SET state = 'running', attempt = attempt + 1, lease_gen = lease_gen + 1, leased_by = $2,
    heartbeat_at = now(), attempted_at = now(), lease_expires_at = now() + interval '1 minute'
WHERE j.id = ANY (ARRAY(SELECT id FROM next))%[3]s
RETURNING j.id, j.lease_gen, j.priority, j.run_at`

// sqlLayoutCursor is the condition of a claim after a cursor.
const sqlLayoutCursor = `
      AND (priority, run_at, id) > ($3::smallint, $4::timestamptz, $5::bigint)`

// layoutClaims returns the claims from the start and after a cursor of a claim
// template with one %s, the cursor's condition.
func layoutClaims(format string, args ...any) (start, after string) {
	return fmt.Sprintf(format, append(args, "")...), fmt.Sprintf(format, append(args, sqlLayoutCursor)...)
}

// sqlLayoutBatch is the completions' batch, as the engine's completion has it: the
// state compared with a column of a materialized batch, not with a constant, so that
// the planner finds the rows by id in the primary key. With state = 'running' as a
// restriction it scans the running range of the lease index, walking the entry of
// every job claimed since the last VACUUM, and the drain slows as it goes.
const sqlLayoutBatch = `
WITH l AS MATERIALIZED (
    SELECT l.*, 'running'::text AS lstate FROM unnest($1::bigint[], $2::bigint[]) AS l(lid, lgen))`

// sqlSplitComplete is the completion of split and the layouts built on it: it deletes
// the batch's rows from the hot table where their state is %[1]s and their generation the
// batch's, and inserts them into history, completed, with %[2]s their attempt,
// max_attempts, lease_gen, leased_by, heartbeat_at, lease_expires_at and attempted_at.
const sqlSplitComplete = `
WITH l AS MATERIALIZED (
    SELECT l.*, '%[1]s'::text AS lstate FROM unnest($1::bigint[], $2::bigint[]) AS l(lid, lgen)),
d AS (
    DELETE FROM jobs j USING l
    WHERE j.id = l.lid AND j.lease_gen = l.lgen AND j.state = l.lstate
    RETURNING j.*)
INSERT INTO jobs_history (id, ` + layoutColumnNames + `)
SELECT id, queue, kind, args, 'completed', priority, run_at, %[2]s,
    unique_key, errors, created_at, now(), metadata, output, unique_states, tags
FROM d`

const sqlLayoutCompleteUpdate = sqlLayoutBatch + `
UPDATE %s j SET state = 'completed', finished_at = now(), lease_expires_at = NULL%s
FROM l
WHERE j.id = l.lid AND j.lease_gen = l.lgen AND j.state = l.lstate%s`

const sqlLayoutVerify = `
SELECT count(*) FILTER (WHERE state = 'completed' AND attempt = 1 AND lease_gen = 1),
       count(*) FILTER (WHERE finished_at IS NULL)
FROM jobs WHERE (args->>'seq')::bigint >= 0`

func layoutSingle() layoutDef {
	d := layoutDef{
		name: LayoutSingle,
		describe: "one table, fenceq_jobs as the core migrations define it: claim index (queue, priority, run_at, id) " +
			"WHERE available, lease, due, finished_at, unique-key, kind and tags indexes; completion UPDATEs the row",
		ddl: append([]string{sqlLayoutMaskFunction,
			"CREATE TABLE jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY," + layoutColumns + ")"},
			indexes("jobs", idxClaim, idxLease, idxDue, idxFinished, idxUnique, idxKind, idxTags)...),
		tables:   []string{"jobs"},
		hot:      []string{"jobs"},
		retain:   fmt.Sprintf(sqlRetainJobs, "jobs", "", ""),
		fill:     sqlFillJobs,
		complete: fmt.Sprintf(sqlLayoutCompleteUpdate, "jobs", "", ""),
		verify:   sqlLayoutVerify,
	}
	d.claimStart, d.claimAfter = layoutClaims(sqlLayoutClaim, "jobs", "", "")
	return d
}

// splitTables are the tables of split and the layouts built on it, without indexes: the
// hot table (created WITH hotWith, when given) and the history.
func splitTables(hotWith string) []string {
	return []string{sqlLayoutMaskFunction,
		"CREATE TABLE jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY," + layoutColumns + ")" + hotWith,
		"CREATE TABLE jobs_history (id bigint PRIMARY KEY," + layoutColumns + ")"}
}

// historyIndexes are the indexes of the history of split and partitioned.
var historyIndexes = []string{"CREATE INDEX ON jobs_history (finished_at)", "CREATE INDEX ON jobs_history (kind, id)"}

func layoutSplit() layoutDef {
	d := layoutDef{
		name: LayoutSplit,
		describe: "hot table of unfinished jobs (primary key, claim, lease, due, kind and unique-key indexes) and a " +
			"history table (id primary key, finished_at and (kind, id) indexes); completion DELETEs from the hot table " +
			"and INSERTs into the history in one statement",
		ddl: append(append(splitTables(""), indexes("jobs", idxClaim, idxLease, idxDue, idxKind, idxUnique)...),
			historyIndexes...),
		tables:      []string{"jobs", "jobs_history"},
		hot:         []string{"jobs"},
		retain:      fmt.Sprintf(sqlRetainJobs, "jobs_history", "id, ", "g, "),
		afterRetain: "SELECT setval(pg_get_serial_sequence('jobs', 'id'), $1::bigint)",
		fill:        sqlFillJobs,
		complete: fmt.Sprintf(sqlSplitComplete, "running",
			"attempt, max_attempts, lease_gen, leased_by, heartbeat_at, NULL, attempted_at"),
		verify: `
SELECT (SELECT count(*) FROM jobs_history
        WHERE (args->>'seq')::bigint >= 0 AND state = 'completed' AND attempt = 1 AND lease_gen = 1),
       (SELECT count(*) FROM jobs)`,
	}
	d.claimStart, d.claimAfter = layoutClaims(sqlLayoutClaim, "jobs", "", "")
	return d
}

func layoutPartitioned() layoutDef {
	d := layoutDef{
		name: LayoutPartitioned,
		describe: "one table list-partitioned on finished (bool): partition jobs_hot (false) with the claim, lease, due, " +
			"kind and unique-key indexes, jobs_history (true) with finished_at and (kind, id); primary key (id, finished), " +
			"ids from a sequence; completion UPDATEs finished, moving the row across partitions",
		ddl: append(append([]string{sqlLayoutMaskFunction,
			"CREATE SEQUENCE jobs_id_seq",
			"CREATE TABLE jobs (id bigint NOT NULL DEFAULT nextval('jobs_id_seq')," + layoutColumns +
				", finished boolean NOT NULL DEFAULT false, PRIMARY KEY (id, finished)) PARTITION BY LIST (finished)",
			"CREATE TABLE jobs_hot PARTITION OF jobs FOR VALUES IN (false)",
			"CREATE TABLE jobs_history PARTITION OF jobs FOR VALUES IN (true)"},
			indexes("jobs_hot", idxClaim, idxLease, idxDue, idxKind, idxUnique)...),
			historyIndexes...),
		tables: []string{"jobs"},
		hot:    []string{"jobs_hot"},
		retain: fmt.Sprintf(sqlRetainJobs, "jobs", "finished, ", "true, "),
		fill:   sqlFillJobs,
		complete: fmt.Sprintf(sqlLayoutCompleteUpdate, "jobs", ", finished = true",
			" AND NOT j.finished"),
		verify: sqlLayoutVerify,
	}
	d.claimStart, d.claimAfter = layoutClaims(sqlLayoutClaim, "jobs", " AND NOT finished", " AND NOT j.finished")
	return d
}

func layoutNarrow() layoutDef {
	d := layoutDef{
		name: LayoutNarrow,
		describe: "single's table without the claim index, plus a narrow table ready (queue, priority, run_at, id) " +
			"(primary key in that order) of the available jobs; a claim DELETEs its entries from ready (FOR UPDATE " +
			"SKIP LOCKED) and UPDATEs the job rows; completion as single",
		ddl: append([]string{sqlLayoutMaskFunction,
			"CREATE TABLE jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY," + layoutColumns + ")",
			"CREATE TABLE ready (queue text NOT NULL, priority smallint NOT NULL, run_at timestamptz NOT NULL, " +
				"id bigint NOT NULL, PRIMARY KEY (queue, priority, run_at, id))"},
			indexes("jobs", idxLease, idxDue, idxFinished, idxUnique, idxKind, idxTags)...),
		tables:    []string{"jobs", "ready"},
		hot:       []string{"jobs", "ready"},
		retain:    fmt.Sprintf(sqlRetainJobs, "jobs", "", ""),
		fill:      sqlFillJobs,
		afterFill: `INSERT INTO ready (queue, priority, run_at, id) SELECT queue, priority, run_at, id FROM jobs WHERE state = 'available'`,
		complete:  fmt.Sprintf(sqlLayoutCompleteUpdate, "jobs", "", ""),
		verify: `
SELECT count(*) FILTER (WHERE state = 'completed' AND attempt = 1 AND lease_gen = 1),
       count(*) FILTER (WHERE finished_at IS NULL) + (SELECT count(*) FROM ready)
FROM jobs WHERE (args->>'seq')::bigint >= 0`,
	}
	d.claimStart, d.claimAfter = layoutClaims(sqlNarrowClaim)
	return d
}

// layoutHeapOnly is split with the claim order moved out to a narrow table, as narrow
// does, and no index on the table of unfinished jobs over a column that a claim changes
// (state, lease_expires_at, or one in an index's predicate): only its primary key. The
// table is filled to half its pages, so that a claim finds room for the new row version
// on the row's own page. A claim is then a heap-only (HOT) update, writing no index
// entry. What the engine would lose with it is in docs/design.md: the reaper would
// read the table's heap, and the unique keys and the waiting jobs by kind would need
// tables of their own.
func layoutHeapOnly() layoutDef {
	d := layoutSplit()
	d.name = LayoutHeapOnly
	d.describe = "split's two tables, with no index on the hot table but its primary key (fillfactor 50), plus " +
		"narrow's table ready (queue, priority, run_at, id); a claim DELETEs its entries from ready and UPDATEs " +
		"the job rows, a heap-only update; completion as split"
	d.ddl = append(append(splitTables(" WITH (fillfactor = 50)"),
		"CREATE TABLE ready (queue text NOT NULL, priority smallint NOT NULL, run_at timestamptz NOT NULL, "+
			"id bigint NOT NULL, PRIMARY KEY (queue, priority, run_at, id))"),
		historyIndexes...)
	d.tables = []string{"jobs", "jobs_history", "ready"}
	d.hot = []string{"jobs", "ready"}
	d.afterFill = layoutNarrow().afterFill
	d.verify = `
SELECT (SELECT count(*) FROM jobs_history
        WHERE (args->>'seq')::bigint >= 0 AND state = 'completed' AND attempt = 1 AND lease_gen = 1),
       (SELECT count(*) FROM jobs) + (SELECT count(*) FROM ready)`
	d.claimStart, d.claimAfter = layoutClaims(sqlNarrowClaim)
	return d
}

// sqlNarrowClaim is the claim of the layouts with a ready table; %s is the cursor's
// condition. The job rows are found by primary key (see sqlLayoutClaim).
const sqlNarrowClaim = `
WITH next AS (
    SELECT queue, priority, run_at, id FROM ready
    WHERE queue = 'default' AND run_at <= now()%s
    ORDER BY priority, run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED),
gone AS (
    DELETE FROM ready r USING next
    WHERE r.queue = next.queue AND r.priority = next.priority AND r.run_at = next.run_at AND r.id = next.id
    RETURNING r.id)
UPDATE jobs j
SET state = 'running', attempt = attempt + 1, lease_gen = lease_gen + 1, leased_by = $2,
    heartbeat_at = now(), attempted_at = now(), lease_expires_at = now() + interval '1 minute'
WHERE j.id = ANY (ARRAY(SELECT id FROM gone)) AND j.state = 'available'
RETURNING j.id, j.lease_gen, j.priority, j.run_at`

// layoutLeaseSet is split with a claim that writes no job row. A claimer's lease is one
// row of its own, holding the ids of the jobs it runs; a claim replaces that set under
// the queue's row lock and skips the ids that any lease holds. A job row keeps its
// state (available) and its generation while it runs, so the claim index still lists
// it; the claimer's cursor passes the held ones. The fence is unchanged: the completion
// matches each job's generation as the claim read it, and a job leaving a lease other
// than by its completion (rescued, or retried by its holder) would have its generation
// bumped in its row before it could be claimed again. The completion is split's,
// writing the attempt and the generation the claim of the other layouts writes. What
// the engine would change for it is in docs/design.md.
func layoutLeaseSet() layoutDef {
	d := layoutSplit()
	d.name = LayoutLeaseSet
	d.describe = "split's two tables without the lease index, plus a table leases (claimer primary key, queue, " +
		"expires_at, job_ids bigint[]) and a table queues; a claim locks its queue's row, skips the ids any lease " +
		"holds and replaces the claimer's lease with the ids it takes, writing no job row; completion as split"
	d.ddl = append(append(append(splitTables(""),
		"CREATE TABLE queues (queue text PRIMARY KEY)",
		"INSERT INTO queues VALUES ('default')",
		"CREATE TABLE leases (claimer text PRIMARY KEY, queue text NOT NULL, expires_at timestamptz NOT NULL, "+
			"job_ids bigint[] NOT NULL)",
		"CREATE INDEX ON leases (expires_at)"),
		indexes("jobs", idxClaim, idxDue, idxKind, idxUnique)...),
		historyIndexes...)
	d.tables = []string{"jobs", "jobs_history", "queues", "leases"}
	d.hot = []string{"jobs", "leases"}
	d.claimLock = `SELECT 1 FROM queues WHERE queue = 'default' FOR UPDATE`
	d.complete = fmt.Sprintf(sqlSplitComplete, "available",
		"attempt + 1, max_attempts, lease_gen + 1, NULL, now(), NULL, now()")
	d.claimStart, d.claimAfter = layoutClaims(sqlLeaseSetClaim)
	return d
}

// sqlLeaseSetClaim is the claim of the leaseset layout; %s is the cursor's condition.
const sqlLeaseSetClaim = `
WITH held AS MATERIALIZED (
    SELECT unnest(job_ids) AS id FROM leases WHERE queue = 'default' AND claimer <> $2),
next AS MATERIALIZED (
    SELECT id, lease_gen, priority, run_at FROM jobs
    WHERE state = 'available' AND queue = 'default' AND run_at <= now()%s
      AND id NOT IN (SELECT id FROM held)
    ORDER BY priority, run_at, id
    LIMIT $1),
lease AS (
    INSERT INTO leases (claimer, queue, expires_at, job_ids)
    SELECT $2, 'default', now() + interval '1 minute', array_agg(id) FROM next HAVING count(*) > 0
    ON CONFLICT (claimer) DO UPDATE SET expires_at = excluded.expires_at, job_ids = excluded.job_ids
    RETURNING 1)
SELECT id, lease_gen, priority, run_at FROM next WHERE EXISTS (SELECT FROM lease)`

func layoutByName(name string) (layoutDef, bool) {
	switch name {
	case LayoutSingle:
		return layoutSingle(), true
	case LayoutSplit:
		return layoutSplit(), true
	case LayoutPartitioned:
		return layoutPartitioned(), true
	case LayoutNarrow:
		return layoutNarrow(), true
	case LayoutHeapOnly:
		return layoutHeapOnly(), true
	case LayoutLeaseSet:
		return layoutLeaseSet(), true
	}
	return layoutDef{}, false
}

// validateLayouts checks Config.Layouts.
func (c Config) validateLayouts() error {
	seen := map[string]bool{}
	for _, l := range c.Layouts {
		if _, ok := layoutByName(l); !ok {
			return fmt.Errorf("bench: --layouts: %q is not a layout: use some of %s", l, strings.Join(Layouts, ","))
		}
		if seen[l] {
			return fmt.Errorf("bench: --layouts: %q named twice", l)
		}
		seen[l] = true
	}
	return nil
}

// runLayout runs the layout workload: Runs rounds, each measuring every layout once,
// the order rotating from round to round.
func runLayout(ctx context.Context, cfg Config) (*Report, error) {
	var defs []layoutDef
	for _, name := range cfg.Layouts {
		d, _ := layoutByName(name)
		defs = append(defs, d)
	}
	rep, err := newBaseReport(ctx, cfg)
	if err != nil {
		return nil, err
	}
	for _, d := range defs {
		rep.Systems = append(rep.Systems, &SystemReport{Name: d.name, Config: d.describe})
	}
	cfg.Conns = max(cfg.Conns, cfg.CeilingClaimers+1)
	if err := checkConnections(ctx, cfg); err != nil {
		return nil, err
	}
	ran := 0
	for i := range cfg.Runs {
		for _, d := range rotate(defs, i) {
			progressf(cfg.Progress, "run %d/%d: layout %s…\n", i+1, cfg.Runs, d.name)
			r, err := layoutOnce(ctx, cfg, d)
			if err != nil {
				return rep, fmt.Errorf("run %d of layout %s: %w", i+1, d.name, err)
			}
			ran++
			r.Run, r.Order = i+1, ran
			rep.add(r)
			progressf(cfg.Progress, "run %d/%d: layout %s: %s\n", i+1, cfg.Runs, d.name, r.headline(cfg.Workload))
		}
	}
	rep.finish(ctx, cfg)
	return rep, nil
}

// layoutSample is a reading of the statistics of the layout's schema.
type layoutSample struct {
	heap, idx, dead int64
	// upd and hotUpd are the rows updated in the schema's tables, and of them those
	// updated heap-only (HOT).
	upd, hotUpd int64
}

const sqlLayoutStatio = `
SELECT COALESCE(sum(heap_blks_hit + heap_blks_read), 0)::bigint,
       COALESCE(sum(COALESCE(idx_blks_hit, 0) + COALESCE(idx_blks_read, 0)), 0)::bigint,
       (SELECT COALESCE(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = current_schema()),
       (SELECT COALESCE(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = current_schema()),
       (SELECT COALESCE(sum(n_tup_hot_upd), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = current_schema())
FROM pg_statio_user_tables WHERE schemaname = current_schema()`

const sqlHotPages = `
SELECT COALESCE(sum(pg_total_relation_size(t::regclass)), 0)::bigint / current_setting('block_size')::bigint
FROM unnest($1::text[]) AS t`

// layoutSettled reads the schema's statistics once they stopped moving: the drain's
// backends flush theirs when they exit, the admin connection's on request.
func layoutSettled(ctx context.Context, c *pgx.Conn) (layoutSample, error) {
	read := func() (layoutSample, error) {
		var s layoutSample
		if _, err := c.Exec(ctx, sqlClearSnapshot); err != nil {
			return s, fmt.Errorf("clear statistics snapshot: %w", err)
		}
		if err := c.QueryRow(ctx, sqlLayoutStatio).Scan(&s.heap, &s.idx, &s.dead, &s.upd, &s.hotUpd); err != nil {
			return s, fmt.Errorf("read pg_statio_user_tables: %w", err)
		}
		return s, nil
	}
	if _, err := c.Exec(ctx, sqlForceFlush); err != nil {
		return layoutSample{}, fmt.Errorf("flush statistics: %w", err)
	}
	prev, err := read()
	if err != nil {
		return prev, err
	}
	for i := 0; i < 20; i++ {
		time.Sleep(150 * time.Millisecond)
		cur, err := read()
		if err != nil {
			return cur, err
		}
		if cur == prev && i >= 1 {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

func hotPages(ctx context.Context, c *pgx.Conn, d layoutDef) (float64, error) {
	var n int64
	if err := c.QueryRow(ctx, sqlHotPages, d.hot).Scan(&n); err != nil {
		return 0, fmt.Errorf("size of %v: %w", d.hot, err)
	}
	return float64(n), nil
}

// layoutOnce measures one layout in a fresh schema.
func layoutOnce(ctx context.Context, cfg Config, d layoutDef) (*RunResult, error) {
	e, err := newEnv(ctx, cfg, "layout_"+d.name)
	if err != nil {
		return nil, err
	}
	defer e.close()
	for _, q := range d.ddl {
		if _, err := e.admin.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("create tables: %s: %w", strings.Join(strings.Fields(q), " "), err)
		}
	}
	if n := int64(cfg.Retained); n > 0 {
		t0 := time.Now()
		for from := int64(1); from <= n; from += retainChunk {
			to := min(n, from+retainChunk-1)
			if _, err := e.admin.Exec(ctx, d.retain, from, to); err != nil {
				return nil, fmt.Errorf("retain finished jobs %d–%d: %w", from, to, err)
			}
			if n > retainChunk {
				progressf(cfg.Progress, "  %s: %d/%d finished jobs retained (%s)\n", d.name, to, n, time.Since(t0).Round(time.Second))
			}
		}
		if d.afterRetain != "" {
			if _, err := e.admin.Exec(ctx, d.afterRetain, n); err != nil {
				return nil, fmt.Errorf("after retaining: %w", err)
			}
		}
		if _, err := e.admin.Exec(ctx, "VACUUM ANALYZE "+strings.Join(d.tables, ", ")); err != nil {
			return nil, fmt.Errorf("vacuum the retained jobs: %w", err)
		}
	}
	if _, err := e.admin.Exec(ctx, d.fill, int64(cfg.Jobs)); err != nil {
		return nil, fmt.Errorf("insert %d jobs: %w", cfg.Jobs, err)
	}
	if d.afterFill != "" {
		if _, err := e.admin.Exec(ctx, d.afterFill); err != nil {
			return nil, fmt.Errorf("after inserting: %w", err)
		}
	}
	if _, err := e.admin.Exec(ctx, "VACUUM ANALYZE "+strings.Join(d.tables, ", ")); err != nil {
		return nil, fmt.Errorf("vacuum analyze: %w", err)
	}
	if cfg.Checkpoint {
		if _, err := e.admin.Exec(ctx, sqlCheckpoint); err != nil {
			progressf(cfg.Progress, "  checkpoint before the run failed (%v); measuring anyway\n", err)
		}
	}
	m := map[string]float64{}
	if m[MetricHotPagesBefore], err = hotPages(ctx, e.admin, d); err != nil {
		return nil, err
	}
	before, err := layoutSettled(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	var lsn0, lsn1 string
	if err := e.admin.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn0); err != nil {
		return nil, fmt.Errorf("read wal position: %w", err)
	}
	dr, err := drainLayout(ctx, e, d)
	if err != nil {
		return nil, err
	}
	if err := e.admin.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn1); err != nil {
		return nil, fmt.Errorf("read wal position: %w", err)
	}
	e.closePool()
	after, err := layoutSettled(ctx, e.admin)
	if err != nil {
		return nil, err
	}
	var wal int64
	if err := e.admin.QueryRow(ctx, sqlWALDiff, lsn1, lsn0).Scan(&wal); err != nil {
		return nil, fmt.Errorf("diff wal positions: %w", err)
	}
	if m[MetricHotPagesAfter], err = hotPages(ctx, e.admin, d); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if _, err := e.admin.Exec(ctx, "VACUUM "+strings.Join(d.tables, ", ")); err != nil {
		return nil, fmt.Errorf("vacuum after the drain: %w", err)
	}
	m[MetricVacuumMs] = float64(time.Since(t0).Microseconds()) / 1000
	if m[MetricHotPagesVacuumed], err = hotPages(ctx, e.admin, d); err != nil {
		return nil, err
	}
	var once, unfinished int64
	if err := e.admin.QueryRow(ctx, d.verify).Scan(&once, &unfinished); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if once != int64(cfg.Jobs) || unfinished != 0 {
		return nil, fmt.Errorf("%w: %d of %d jobs completed at their first attempt, %d rows unfinished",
			errVerify, once, cfg.Jobs, unfinished)
	}
	jobs, claims := float64(dr.jobs), float64(dr.claims)
	heap, idx := float64(after.heap-before.heap), float64(after.idx-before.idx)
	m[MetricJobsPerSec] = jobs / dr.elapsed.Seconds()
	m[MetricWALPerJob] = float64(wal) / jobs
	m[MetricHeapBlksPerClaim], m[MetricIdxBlksPerClaim] = heap/claims, idx/claims
	m[MetricHeapBlksPerJob], m[MetricIdxBlksPerJob] = heap/jobs, idx/jobs
	m[MetricDeadTuples] = float64(after.dead)
	m[MetricUpdatesPerJob] = float64(after.upd-before.upd) / jobs
	if upd := after.upd - before.upd; upd > 0 {
		m[MetricHOTPct] = 100 * float64(after.hotUpd-before.hotUpd) / float64(upd)
	}
	if dr.explainBlks > 0 {
		m[MetricExplainBlksPerClaim] = float64(dr.explainBlks)
	}
	m[MetricClaims], m[MetricJobs], m[MetricSeconds] = claims, jobs, dr.elapsed.Seconds()
	m[MetricClaimRetries] = float64(dr.retries)
	return &RunResult{System: d.name, Metrics: m, Schema: e.schema}, nil
}

// layoutDrain is what a drain of a layout did.
type layoutDrain struct {
	jobs, claims int64
	// retries are the claims taken again after a serialization failure: in the
	// partitioned layout, a claim that meets a row a completion moved to the history
	// partition fails ("tuple to be locked was already moved to another partition").
	retries     int64
	elapsed     time.Duration
	explainBlks int64 // shared buffers of the claim explained mid-drain; 0 if none was
}

// drainLayout works the layout's jobs down with CeilingClaimers claimers, and halfway
// explains one claim (in a transaction rolled back, so it claims nothing).
func drainLayout(ctx context.Context, e *env, d layoutDef) (layoutDrain, error) {
	want := int64(e.cfg.Jobs)
	var done, claims, retries atomic.Int64
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, e.cfg.CeilingClaimers+1)
	var wg sync.WaitGroup
	t0 := time.Now()
	var last atomic.Int64 // ns since t0 of the last completion
	var shared lastCursor
	// The claimers stop at half the jobs until the explained claim has run, so that it
	// always runs mid-drain, however fast the drain.
	explained := make(chan struct{})
	for i := range e.cfg.CeilingClaimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := layoutClaimLoop(cctx, e, d, fmt.Sprintf("layout-%d", i), want, &done, &claims, &retries, t0, &last,
				&shared, explained); err != nil && cctx.Err() == nil {
				errs <- err
				cancel()
			}
		}()
	}
	var explainBlks int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(explained)
		for cctx.Err() == nil && done.Load() < want/2 {
			time.Sleep(time.Millisecond)
		}
		if cctx.Err() != nil {
			return
		}
		n, err := explainClaim(cctx, e, d, shared.get())
		if err != nil && cctx.Err() == nil {
			errs <- fmt.Errorf("explain a claim: %w", err)
			cancel()
			return
		}
		explainBlks = n
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	limit := drainLimit(e.cfg.Jobs)
	for {
		select {
		case <-waitDone:
			close(errs)
			if err := <-errs; err != nil {
				return layoutDrain{}, err
			}
			if err := ctx.Err(); err != nil {
				return layoutDrain{}, err
			}
			return layoutDrain{jobs: done.Load(), claims: claims.Load(), retries: retries.Load(),
				elapsed: time.Duration(last.Load()), explainBlks: explainBlks}, nil
		case <-tick.C:
			progressf(e.cfg.Progress, "  %s: %d/%d jobs\n", d.name, done.Load(), want)
			if time.Since(t0) > limit {
				cancel()
				<-waitDone
				return layoutDrain{}, fmt.Errorf("%s: only %d of %d jobs completed after %s", d.name, done.Load(), want, limit)
			}
		}
	}
}

// layoutCursor is the position in the claim order where a claim ended.
type layoutCursor struct {
	priority int16
	runAt    time.Time
	id       int64
}

func (c layoutCursor) after(o layoutCursor) bool {
	if c.priority != o.priority {
		return c.priority > o.priority
	}
	if !c.runAt.Equal(o.runAt) {
		return c.runAt.After(o.runAt)
	}
	return c.id > o.id
}

// lastCursor is the cursor of the most recent claim of any claimer, for the claim
// explained mid-drain.
type lastCursor struct {
	mu  sync.Mutex
	cur *layoutCursor
}

func (l *lastCursor) set(c layoutCursor) {
	l.mu.Lock()
	l.cur = &c
	l.mu.Unlock()
}

func (l *lastCursor) get() *layoutCursor {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}

// claimArgs are the arguments of the claim after cur, or from the start without one.
func (d layoutDef) claimArgs(cur *layoutCursor, claimer string) (string, []any) {
	if cur == nil {
		return d.claimStart, []any{ceilingBatch, claimer}
	}
	return d.claimAfter, []any{ceilingBatch, claimer, cur.priority, cur.runAt, cur.id}
}

// layoutClaimLoop claims and completes until all want jobs are done. Each claim
// starts after the position where the claimer's previous one ended; a claim after it
// that finds nothing is followed by one from the start, which finds the jobs skipped
// behind it (locked then, free now). From half the jobs on, it claims only once
// explained is closed (the claim explained mid-drain has run).
func layoutClaimLoop(ctx context.Context, e *env, d layoutDef, id string, want int64, done, claims, retries *atomic.Int64,
	t0 time.Time, last *atomic.Int64, shared *lastCursor, explained <-chan struct{}) error {
	ids := make([]int64, 0, ceilingBatch)
	gens := make([]int64, 0, ceilingBatch)
	var cur *layoutCursor
	for ctx.Err() == nil && done.Load() < want {
		if done.Load() >= want/2 {
			select {
			case <-explained:
			case <-ctx.Done():
				return nil
			}
		}
		ids, gens = ids[:0], gens[:0]
		q, args := d.claimArgs(cur, id)
		rows, err := d.queryClaim(ctx, e, q, args)
		if isSerializationFailure(err) {
			retries.Add(1)
			continue
		}
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		var end *layoutCursor
		for rows.Next() {
			var jid, gen int64
			var c layoutCursor
			if err := rows.Scan(&jid, &gen, &c.priority, &c.runAt); err != nil {
				rows.Close()
				return fmt.Errorf("claim: %w", err)
			}
			c.id = jid
			if end == nil || c.after(*end) {
				end = &c
			}
			ids, gens = append(ids, jid), append(gens, gen)
		}
		rows.Close()
		if err := rows.Err(); isSerializationFailure(err) {
			// Nothing was claimed, even of the rows already read: the statement rolled
			// back whole.
			retries.Add(1)
			continue
		} else if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		if len(ids) == 0 {
			if cur != nil {
				cur = nil
				continue
			}
			// The other claimers hold the rest, or the explained claim does.
			if err := sleepCtx(ctx, time.Millisecond); err != nil {
				return nil
			}
			continue
		}
		cur = end
		shared.set(*end)
		claims.Add(1)
		tag, err := e.pool.Exec(ctx, d.complete, ids, gens)
		if err != nil {
			return fmt.Errorf("complete: %w", err)
		}
		if tag.RowsAffected() != int64(len(ids)) {
			return errors.Join(errVerify, fmt.Errorf("completed %d of %d claimed jobs", tag.RowsAffected(), len(ids)))
		}
		done.Add(int64(len(ids)))
		last.Store(int64(time.Since(t0)))
	}
	return nil
}

// queryClaim runs the claim q, after the layout's claimLock, if it has one, in the
// same transaction: one round trip, a statement each.
func (d layoutDef) queryClaim(ctx context.Context, e *env, q string, args []any) (pgx.Rows, error) {
	if d.claimLock == "" {
		return e.pool.Query(ctx, q, args...)
	}
	b := &pgx.Batch{}
	b.Queue(d.claimLock)
	b.Queue(q, args...)
	br := e.pool.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("lock the queue: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// batchRows closes the batch, ending its transaction, when its rows are closed; Err
// then reports the batch's error too (the commit's, say).
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if !r.closed {
		r.closed, r.closeErr = true, r.br.Close()
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// isSerializationFailure reports whether err is PostgreSQL's serialization_failure.
func isSerializationFailure(err error) bool { return store.PgCode(err) == store.CodeSerialization }

// explainClaim runs one claim after cur under EXPLAIN (ANALYZE, BUFFERS) in a
// transaction it rolls back, and returns the shared buffers (hit and read) of its
// plan.
func explainClaim(ctx context.Context, e *env, d layoutDef, cur *layoutCursor) (int64, error) {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var out string
	q, args := d.claimArgs(cur, "explain")
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q, args...).Scan(&out); err != nil {
		return 0, err
	}
	var plans []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) == 0 {
		return 0, fmt.Errorf("parse the plan: %v: %s", err, out)
	}
	return plans[0].Plan.Hit + plans[0].Plan.Read, nil
}
