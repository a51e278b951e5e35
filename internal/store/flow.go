package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/queue"
)

// Flow limits (migration 000020): jobs under a limit carry a flow key (limit name, ":",
// partition). The ordinary claims leave them out (their index has flow_key IS NULL);
// ClaimFlow takes them while their key has room, and counts them on the key's row in
// the same statement. The triggers of migration 000020 count a lease out in the
// transaction that ends it.

// FlowKeyLimit returns the limit's name of a flow key.
func FlowKeyLimit(key string) string {
	name, _, _ := strings.Cut(key, ":")
	return name
}

// validateFlowKey checks a flow key as InsertParams carries it.
func validateFlowKey(key string) error {
	name, partition, ok := strings.Cut(key, ":")
	if !ok {
		return invalid("flow.key", "%q has no ':' between the limit's name and the partition", key)
	}
	return queue.FlowOpts{Limit: name, Partition: partition}.Validate(partition)
}

// sqlEnsureFlowKey creates a flow key's row ($1 key, $2 limit) unless it exists; the
// foreign key refuses a limit that is not set.
const sqlEnsureFlowKey = `INSERT INTO fenceq_flow_keys (key, limit_name) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`

// sqlEnsureStagedFlowKeys is sqlEnsureFlowKey for the keys of an InsertMany's staging table.
const sqlEnsureStagedFlowKeys = `
INSERT INTO fenceq_flow_keys (key, limit_name)
SELECT DISTINCT flow_key, split_part(flow_key, ':', 1) FROM fenceq_jobs_staging WHERE flow_key IS NOT NULL
ORDER BY 1
ON CONFLICT (key) DO NOTHING`

// sqlMissingStagedFlowLimit names a limit that jobs of an InsertMany's staging table are
// under but that is not set (NULL when every one is).
const sqlMissingStagedFlowLimit = `
SELECT min(split_part(s.flow_key, ':', 1)) FROM fenceq_jobs_staging s
WHERE s.flow_key IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM fenceq_flow_limits l WHERE l.name = split_part(s.flow_key, ':', 1))`

// ensureFlowKey runs sqlEnsureFlowKey, turning a missing limit into a ValidationError.
func ensureFlowKey(ctx context.Context, db queue.DBTX, key string) error {
	if _, err := db.Exec(ctx, sqlEnsureFlowKey, key, FlowKeyLimit(key)); err != nil {
		return flowKeyError(err, key)
	}
	return nil
}

func flowKeyError(err error, key string) error {
	if PgCode(err) == CodeForeignKeyViolation {
		return limitNotSet(FlowKeyLimit(key))
	}
	return fmt.Errorf("create flow key %q: %w", key, err)
}

// limitNotSet is the error of an enqueue under a flow limit that is not set.
func limitNotSet(name string) error {
	return invalid("flow.limit", "flow limit %q is not set (set it with fenceq.SetFlowLimit, Config.FlowLimits "+
		"or `fenceq flow set` before enqueueing under it)", name)
}

// ErrFlowUnsupported is returned by SetFlowLimit on a schema without the triggers that
// count leases out (a Citus distributed one).
var ErrFlowUnsupported = errors.New("flow limits need the triggers of migration 000020 on fenceq_jobs_hot, " +
	"which this schema does not have (a Citus distributed table cannot have triggers)")

// SetFlowLimit creates or changes a flow limit. A change applies to the next claim.
func SetFlowLimit(ctx context.Context, db queue.DBTX, l queue.FlowLimit) error {
	if err := l.Validate(); err != nil {
		return err
	}
	var ok bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger
WHERE tgname = 'fenceq_flow_limit_release_update' AND tgrelid = to_regclass('fenceq_jobs_hot'))`).Scan(&ok); err != nil {
		return fmt.Errorf("set flow limit %q: %w", l.Name, err)
	}
	if !ok {
		return fmt.Errorf("set flow limit %q: %w", l.Name, ErrFlowUnsupported)
	}
	if _, err := db.Exec(ctx, `
INSERT INTO fenceq_flow_limits (name, max_running, rate_limit, rate_period_us, sequence, hold_on_discard)
VALUES ($1, NULLIF($2, 0), NULLIF($3, 0), NULLIF($4::bigint, 0), $5, $6)
ON CONFLICT (name) DO UPDATE SET max_running = EXCLUDED.max_running, rate_limit = EXCLUDED.rate_limit,
    rate_period_us = EXCLUDED.rate_period_us, sequence = EXCLUDED.sequence,
    hold_on_discard = EXCLUDED.hold_on_discard, updated_at = now()`,
		l.Name, l.MaxRunning, l.Rate, micros(l.Per), l.Sequence, l.HoldOnDiscard); err != nil {
		return fmt.Errorf("set flow limit %q: %w", l.Name, err)
	}
	return nil
}

// DeleteFlowLimit removes a limit with no partitions in use: no unfinished job under it
// and none running. It returns queue.ErrNotFound for a limit that is not set and
// queue.ErrWrongState while jobs still run or wait under it.
func DeleteFlowLimit(ctx context.Context, db queue.DBTX, name string) error {
	var found, busy bool
	err := db.QueryRow(ctx, `
WITH l AS (SELECT name FROM fenceq_flow_limits WHERE name = $1 FOR UPDATE),
busy AS (SELECT EXISTS (SELECT 1 FROM fenceq_jobs_hot j JOIN fenceq_flow_keys k ON k.key = j.flow_key
                        WHERE k.limit_name = $1 AND j.state IN `+sqlUnfinished+`) AS b),
dk AS (DELETE FROM fenceq_flow_keys k WHERE k.limit_name = $1 AND NOT (SELECT b FROM busy) RETURNING 1),
dl AS (DELETE FROM fenceq_flow_limits x USING l WHERE x.name = l.name AND NOT (SELECT b FROM busy)
       AND (SELECT count(*) FROM dk) >= 0 RETURNING 1)
SELECT EXISTS (SELECT 1 FROM l), (SELECT b FROM busy)`, name).Scan(&found, &busy)
	switch {
	case err != nil:
		return fmt.Errorf("delete flow limit %q: %w", name, err)
	case !found:
		return fmt.Errorf("flow limit %q: %w", name, queue.ErrNotFound)
	case busy:
		return fmt.Errorf("flow limit %q still has unfinished jobs: %w", name, queue.ErrWrongState)
	}
	return nil
}

// ListFlowLimits returns every flow limit, by name.
func ListFlowLimits(ctx context.Context, db queue.DBTX) ([]queue.FlowLimit, error) {
	rows, err := db.Query(ctx, `
SELECT name, COALESCE(max_running, 0), COALESCE(rate_limit, 0), COALESCE(rate_period_us, 0), sequence, hold_on_discard
FROM fenceq_flow_limits ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list flow limits: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queue.FlowLimit, error) {
		var l queue.FlowLimit
		var per int64
		err := r.Scan(&l.Name, &l.MaxRunning, &l.Rate, &per, &l.Sequence, &l.HoldOnDiscard)
		l.Per = time.Duration(per) * time.Microsecond
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("list flow limits: %w", err)
	}
	return out, nil
}

// sqlFlowPartitions reads flow keys: those of limit $1 (every limit when NULL), or the
// one key $2, busiest first, at most $3.
var sqlFlowPartitions = `
SELECT k.key, k.limit_name, k.running, k.holder,
       (SELECT count(*) FROM unnest(k.starts) s WHERE s > now() - l.rate_period_us * interval '1 microsecond')::int,
       CASE WHEN l.rate_limit IS NULL THEN NULL
            WHEN (SELECT count(*) FROM unnest(k.starts) s WHERE s > now() - l.rate_period_us * interval '1 microsecond') < l.rate_limit
            THEN now()
            ELSE (SELECT s FROM unnest(k.starts) s WHERE s > now() - l.rate_period_us * interval '1 microsecond'
                  ORDER BY s DESC OFFSET l.rate_limit - 1 LIMIT 1) + l.rate_period_us * interval '1 microsecond' END,
       (SELECT count(*) FROM fenceq_jobs_hot j WHERE j.flow_key = k.key AND j.state = ` + sqlAvailable + `)
FROM fenceq_flow_keys k JOIN fenceq_flow_limits l ON l.name = k.limit_name
WHERE ($1::text IS NULL OR k.limit_name = $1) AND ($2::text IS NULL OR k.key = $2)
ORDER BY k.running DESC, k.key
LIMIT $3`

// FlowPartitions returns the partitions of a limit (all limits when limit is empty),
// busiest first, at most max.
func FlowPartitions(ctx context.Context, db queue.DBTX, limit string, max int) ([]queue.FlowPartition, error) {
	return flowPartitions(ctx, db, nullString(limit), nil, max)
}

// FlowPartition returns the state of one flow key, or queue.ErrNotFound.
func FlowPartition(ctx context.Context, db queue.DBTX, key string) (*queue.FlowPartition, error) {
	ps, err := flowPartitions(ctx, db, nil, &key, 1)
	if err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("flow key %q: %w", key, queue.ErrNotFound)
	}
	return &ps[0], nil
}

func flowPartitions(ctx context.Context, db queue.DBTX, limit, key *string, max int) ([]queue.FlowPartition, error) {
	rows, err := db.Query(ctx, sqlFlowPartitions, limit, key, max)
	if err != nil {
		return nil, fmt.Errorf("read flow partitions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queue.FlowPartition, error) {
		var p queue.FlowPartition
		err := r.Scan(&p.Key, &p.Limit, &p.Running, &p.Holder, &p.StartsInPeriod, &p.NextStart, &p.Waiting)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("read flow partitions: %w", err)
	}
	return out, nil
}

// FlowCursor is the last key a flow claim took jobs from: the next claim's walk over the
// keys starts after it (and wraps around to it), so that every key gets its turn.
type FlowCursor struct {
	Queue, Key string
}

// ClaimFlowParams describes one flow claim over a worker's queues.
type ClaimFlowParams struct {
	WorkerID string
	Lease    time.Duration
	// Kinds, when set, claims only jobs of these kinds.
	Kinds []string
	// Queues are the queues to claim from with the most jobs to take from each.
	Queues []QueueClaim
	// Max is the most jobs in all.
	Max int
	// After starts the walk over the keys after this one; nil starts at the first.
	After *FlowCursor
	// InQueueLimit claims from queues with a limit too: set by ClaimInQueueLimit, which
	// holds the queue's lock; otherwise such queues are left out.
	InQueueLimit bool
}

// less orders cursors by queue, then key.
func (c FlowCursor) less(d FlowCursor) bool {
	return c.Queue < d.Queue || c.Queue == d.Queue && c.Key < d.Key
}

// walkLess orders keys as a walk that starts after at visits them: the keys after at
// first, then the keys from the start up to at.
func walkLess(a, b, at FlowCursor) bool {
	ra, rb := !at.less(a), !at.less(b) // true: visited after wrapping
	if ra != rb {
		return !ra
	}
	return a.less(b)
}

// ClaimFlow claims jobs under flow limits from p.Queues: it walks the keys that have
// available jobs, one step per key however many jobs wait under it, locks the row of
// each key that has room (skipping a key another claim holds), takes up to its room in
// claim order (a sequence: only its head, the key's oldest unfinished job), and counts
// the jobs on the key's row in the same statement. It returns the jobs, with their
// queues, and the cursor for the next claim.
func ClaimFlow(ctx context.Context, db queue.DBTX, p ClaimFlowParams) ([]*queue.JobRow, *FlowCursor, error) {
	if p.Lease <= 0 {
		return nil, nil, invalid("lease", "%s must be positive", p.Lease)
	}
	names := make([]string, 0, len(p.Queues))
	limits := make([]int32, 0, len(p.Queues))
	total := 0
	for _, q := range p.Queues {
		if q.Limit <= 0 {
			continue
		}
		names = append(names, q.Name)
		limits = append(limits, int32(min(q.Limit, 1<<31-1)))
		total += q.Limit
	}
	if p.Max > 0 {
		total = min(total, p.Max)
	}
	if total == 0 {
		return nil, nil, nil
	}
	after := FlowCursor{}
	if p.After != nil {
		after = *p.After
	}
	sql := sqlClaimFlow
	args := []any{names, limits, total, p.WorkerID, micros(p.Lease), after.Queue, after.Key, p.InQueueLimit}
	if p.Kinds != nil {
		sql = sqlClaimFlowKinds
		args = append(args, p.Kinds)
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("claim jobs under flow limits: %w", err)
	}
	jobs, err := collectClaimedRows(rows, "", p.WorkerID, total, true)
	if err != nil {
		return nil, nil, fmt.Errorf("claim jobs under flow limits: %w", err)
	}
	// The next claim starts after the last key this one took from in its walk, or
	// where this one started when it took nothing.
	var last *FlowCursor
	for _, j := range jobs {
		if c := (FlowCursor{Queue: j.Queue, Key: *j.FlowKey}); last == nil || walkLess(*last, c, after) {
			last = &c
		}
	}
	if last == nil {
		last = p.After
	}
	return jobs, last, nil
}

// claimFlowSQL is ClaimFlow's statement: $1 queue names, $2 their limits, $3 the most
// jobs in all, $4 worker id, $5 lease (µs), $6 and $7 the key to start after (empty
// strings for the first), $8 whether queues with a limit are claimed too; with kinds, $9
// the kinds.
//
//   - keys walks the distinct (queue, flow key) pairs with available jobs in index
//     order, one index probe per key (a recursive "skip scan": the next key of the
//     same queue, else the first key of a later queue), so a key with a long backlog
//     costs one step, not one per job. It starts after the cursor (its first row) and,
//     at the end, wraps around to the first key and on up to the cursor, so every key
//     is visited once and the keys after the cursor, claimed longest ago, come first.
//     It is read lazily: the walk stops once enough keys with room were found.
//   - room locks the row of each key whose room (what its concurrency limit, rate and
//     sequence leave) is above zero, skipping rows another claim holds; the room is
//     computed again from the locked row, so two claims never both fill one slot.
//   - picked takes up to the room of each key, in claim order; a sequence takes only
//     its head (its oldest unfinished job), and only when the head is available and
//     the sequence is held by nobody else.
//   - chosen keeps at most each queue's limit; kupd counts the chosen jobs on their
//     keys (a sequence's holder, a rate's start times) in the same statement as the
//     claim itself.
func claimFlowSQL(kinds bool) string {
	kind := ""
	if kinds {
		kind = `
          AND j.kind = ANY($9::text[])`
	}
	const inLimitParam = "8"
	period := `l.rate_period_us * interval '1 microsecond'`
	// room is what a key's concurrency limit, sequence and rate leave it (the least of
	// them; a limit that is off leaves the most an int holds). A rate leaves nothing to
	// a claim whose transaction time is before the key's latest start: that start's
	// claim, by its later clock, may have dropped from the ledger starts that are still
	// within this claim's period, so this claim cannot count them. Starts are therefore
	// recorded in time order, and each claim counts every start of its period.
	room := `LEAST(COALESCE(l.max_running, 2147483647) - fk.running,
                 CASE WHEN l.sequence THEN 1 - fk.running ELSE 2147483647 END,
                 CASE WHEN l.rate_limit IS NULL THEN 2147483647
                      WHEN now() < (SELECT max(s) FROM unnest(fk.starts) s) THEN 0
                      ELSE l.rate_limit - (SELECT count(*) FROM unnest(fk.starts) s WHERE s > now() - ` + period + `) END)`
	return `
WITH RECURSIVE
qs AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::int[]) AS q(name, n)
    WHERE NOT EXISTS (SELECT 1 FROM fenceq_queues p WHERE p.name = q.name
                      AND (p.paused OR (p.max_running IS NOT NULL AND NOT $` + inLimitParam + `::boolean)))),
keys(queue, key, seed, wrap) AS (
    SELECT $6::text, $7::text, true, false
    UNION ALL
    SELECT x.queue, x.flow_key, false, x.wrap FROM keys k CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT j.queue, j.flow_key, k.wrap FROM fenceq_jobs_hot j
             WHERE j.state = ` + sqlAvailable + ` AND j.flow_key IS NOT NULL AND j.queue = k.queue AND j.flow_key > k.key
               AND k.queue = ANY($1::text[])
             ORDER BY j.flow_key LIMIT 1)
            UNION ALL
            (SELECT j.queue, j.flow_key, k.wrap FROM fenceq_jobs_hot j
             WHERE j.state = ` + sqlAvailable + ` AND j.flow_key IS NOT NULL AND j.queue > k.queue AND j.queue = ANY($1::text[])
             ORDER BY j.queue, j.flow_key LIMIT 1)
            UNION ALL
            (SELECT j.queue, j.flow_key, true FROM fenceq_jobs_hot j
             WHERE j.state = ` + sqlAvailable + ` AND j.flow_key IS NOT NULL AND j.queue = ANY($1::text[]) AND NOT k.wrap
             ORDER BY j.queue, j.flow_key LIMIT 1)) y
        LIMIT 1) x
    WHERE NOT x.wrap OR (x.queue, x.flow_key) <= ($6::text, $7::text)),
room AS (
    SELECT k.queue, fk.key, l.sequence, fk.holder,
           ` + room + ` AS n
    FROM keys k JOIN fenceq_flow_keys fk ON fk.key = k.key JOIN fenceq_flow_limits l ON l.name = fk.limit_name
    WHERE NOT k.seed AND ` + room + ` > 0
      AND EXISTS (SELECT 1 FROM qs WHERE qs.name = k.queue)
    LIMIT $3
    FOR UPDATE OF fk SKIP LOCKED),
picked AS (
    SELECT r.queue, r.key, x.id, x.priority, x.run_at FROM room r CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at FROM fenceq_jobs_hot j
        WHERE j.state = ` + sqlAvailable + ` AND j.flow_key = r.key AND j.queue = r.queue AND j.run_at <= now()` + kind + `
        ORDER BY j.priority, j.run_at, j.id
        LIMIT r.n
        FOR UPDATE OF j SKIP LOCKED) x
    WHERE NOT r.sequence
    UNION ALL
    SELECT r.queue, r.key, h.id, h.priority, h.run_at FROM room r CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.state, j.queue, j.kind FROM fenceq_jobs_hot j
        WHERE j.flow_key = r.key AND j.state IN ` + sqlUnfinished + `
        ORDER BY j.id LIMIT 1
        FOR UPDATE OF j SKIP LOCKED) h
    WHERE r.sequence AND h.state = ` + sqlAvailable + ` AND h.queue = r.queue AND h.run_at <= now()
      AND (r.holder IS NULL OR r.holder = h.id)` + strings.ReplaceAll(kind, "j.kind", "h.kind") + `),
chosen AS MATERIALIZED (
    SELECT p.queue, p.key, p.id FROM (
        SELECT p.*, row_number() OVER (PARTITION BY p.queue ORDER BY p.priority, p.run_at, p.id) AS rn FROM picked p) p
    JOIN qs ON qs.name = p.queue
    WHERE p.rn <= qs.n
    ORDER BY p.priority, p.run_at, p.id
    LIMIT $3),
kupd AS (
    UPDATE fenceq_flow_keys fk SET running = fk.running + c.n,
        holder = CASE WHEN l.sequence THEN c.first ELSE fk.holder END,
        starts = CASE WHEN l.rate_limit IS NULL THEN fk.starts ELSE
            ARRAY(SELECT s FROM unnest(fk.starts) s WHERE s > now() - ` + period + ` ORDER BY s)
            || array_fill(now(), ARRAY[c.n::int]) END
    FROM (SELECT key, count(*) AS n, min(id) AS first FROM chosen GROUP BY key) c, fenceq_flow_limits l
    WHERE fk.key = c.key AND l.name = fk.limit_name
    RETURNING fk.key)
UPDATE fenceq_jobs_hot
SET ` + claimSet("$4", "$5") + `
WHERE id = ANY (ARRAY(SELECT id FROM chosen)) AND (SELECT count(*) FROM kupd) >= 0
RETURNING ` + claimedColumns + `, queue, flow_key`
}

var (
	sqlClaimFlow      = claimFlowSQL(false)
	sqlClaimFlowKinds = claimFlowSQL(true)
)
