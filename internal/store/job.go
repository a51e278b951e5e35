package store

import (
	"encoding/json"
	"time"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// customPlan, passed as a query's first argument, has pgx send the statement unnamed
// (only its description is cached), so PostgreSQL plans every execution for its
// parameters and for the table as it is now. A named prepared statement switches to a
// generic plan after five executions and keeps it until the table is next analyzed or
// vacuumed: planned while fenceq_jobs was small (a fresh schema), claims and completions
// would keep sequential scans as the table grows.
//
// It is used where planning is paid once per batch or per period: claims, heartbeats,
// batched completions and the maintenance statements. The single-row statements of
// each job (the fenced writes, the fenced transaction's lock and completion) stay
// prepared by name, because planning them on every execution costs more than it saves
// on the path every job takes. Their generic plans are right once the table has been
// analyzed or vacuumed at a realistic size, which autovacuum does.
const customPlan = pgx.QueryExecModeCacheDescribe

// LeaseOf returns the lease the row records: its id, its generation and its holder. It
// names a lease that is held only while the row is running.
func LeaseOf(j *queue.JobRow) queue.Lease {
	l := queue.Lease{JobID: j.ID, Gen: j.LeaseGen}
	if j.LeasedBy != nil {
		l.Holder = *j.LeasedBy
	}
	return l
}

const jobColumns = `id, queue, kind, args, state, priority, run_at, attempt, max_attempts,
	lease_gen, leased_by, heartbeat_at, lease_expires_at, attempted_at, unique_key, errors,
	created_at, finished_at, metadata, output, unique_states, NULLIF(tags, '{}'::text[]), flow_key`

func scanJob(row pgx.Row) (*queue.JobRow, error) { return scanJobWith(row) }

// scanJobWith scans jobColumns followed by the columns extra stands for.
func scanJobWith(row pgx.Row, extra ...any) (*queue.JobRow, error) {
	var j queue.JobRow
	var state string
	var args, errs, meta, output []byte
	var mask *int16
	err := row.Scan(append([]any{&j.ID, &j.Queue, &j.Kind, &args, &state, &j.Priority, &j.RunAt, &j.Attempt,
		&j.MaxAttempts, &j.LeaseGen, &j.LeasedBy, &j.HeartbeatAt, &j.LeaseExpiresAt, &j.AttemptedAt,
		&j.UniqueKey, &errs, &j.CreatedAt, &j.FinishedAt, &meta, &output, &mask, &j.Tags, &j.FlowKey}, extra...)...)
	if err != nil {
		return nil, err
	}
	if mask != nil {
		j.UniqueStates = StateMask(*mask).States()
	}
	j.State = queue.State(state)
	j.EncodedArgs = json.RawMessage(args)
	j.Metadata = json.RawMessage(meta)
	if output != nil {
		j.Output = json.RawMessage(output)
	}
	if len(errs) > 2 {
		if err := json.Unmarshal(errs, &j.Errors); err != nil {
			return nil, err
		}
	}
	return &j, nil
}

// claimedColumns are what a claim returns: the columns a claim did not just set. The
// rest (queue, state, leased_by, heartbeat_at, finished_at) follow from the claim, and
// errors comes back only when there are any, so that scanning a claimed row costs one
// allocation besides its args.
const claimedColumns = `id, kind, args, priority, run_at, attempt, max_attempts, lease_gen,
	lease_expires_at, attempted_at, unique_key, NULLIF(errors, '[]'::jsonb), created_at,
	NULLIF(metadata, '{}'::jsonb), unique_states, NULLIF(tags, '{}'::text[])`

// emptyObject is the metadata of a claimed job that has none: the claim returns
// metadata only when there is some, like errors.
var emptyObject = json.RawMessage("{}")

// claimedRow holds a claimed job's row together with the values its pointer fields
// point to, so that each claimed job is one allocation (besides its args).
type claimedRow struct {
	row       queue.JobRow
	leasedBy  string
	heartbeat time.Time
	expires   time.Time
	attempted time.Time
	flowKey   string
}

// collectClaimed reads the rows of a claim of queue by worker (see claimedColumns). With
// qname empty, each row carries its queue in a last column (a claim of many queues).
func collectClaimed(rows pgx.Rows, qname, worker string, limit int) ([]*queue.JobRow, error) {
	return collectClaimedRows(rows, qname, worker, limit, false)
}

// collectClaimedRows is collectClaimed; with flow, each row ends with its flow key,
// after its queue.
func collectClaimedRows(rows pgx.Rows, qname, worker string, limit int, flow bool) ([]*queue.JobRow, error) {
	defer rows.Close()
	out := make([]*queue.JobRow, 0, limit)
	kinds := map[string]string{}  // one string per kind, not per job
	queues := map[string]string{} // and per queue
	// One set of scan targets for every row: a Scan call with the fields of each new
	// row as targets would allocate its argument list per row.
	var (
		r         queue.JobRow
		kind      pgtype.DriverBytes
		expires   time.Time
		attempted time.Time
		errs      []byte
		mask      *int16
	)
	dest := []any{&r.ID, &kind, (*[]byte)(&r.EncodedArgs), &r.Priority, &r.RunAt, &r.Attempt, &r.MaxAttempts,
		&r.LeaseGen, &expires, &attempted, &r.UniqueKey, &errs, &r.CreatedAt, (*[]byte)(&r.Metadata), &mask, &r.Tags}
	var qcol pgtype.DriverBytes
	if qname == "" {
		dest = append(dest, &qcol)
	}
	var fkey string
	if flow {
		dest = append(dest, &fkey)
	}
	for rows.Next() {
		// Scanned as bytes: into a json.RawMessage, pgx would run json.Unmarshal on it.
		r.EncodedArgs, r.UniqueKey, r.Metadata, r.Tags, errs, mask = nil, nil, nil, nil, nil, nil
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		r.UniqueStates = nil
		if mask != nil {
			r.UniqueStates = StateMask(*mask).States()
		}
		c := &claimedRow{row: r, leasedBy: worker, heartbeat: attempted, expires: expires, attempted: attempted}
		j := &c.row
		k, ok := kinds[string(kind)]
		if !ok {
			k = string(kind)
			kinds[k] = k
		}
		j.Kind, j.Queue, j.State = k, qname, queue.StateRunning
		if qname == "" {
			q, ok := queues[string(qcol)]
			if !ok {
				q = string(qcol)
				queues[q] = q
			}
			j.Queue = q
		}
		if j.Metadata == nil {
			j.Metadata = emptyObject
		}
		if flow {
			j.FlowKey = &c.flowKey
			c.flowKey = fkey
		}
		j.LeasedBy, j.HeartbeatAt, j.LeaseExpiresAt, j.AttemptedAt = &c.leasedBy, &c.heartbeat, &c.expires, &c.attempted
		if len(errs) > 0 {
			if err := json.Unmarshal(errs, &j.Errors); err != nil {
				return nil, err
			}
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

func collectJobs(rows pgx.Rows) ([]*queue.JobRow, error) {
	defer rows.Close()
	var out []*queue.JobRow
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

// micros converts a duration to whole microseconds for SQL: `$n * interval '1 microsecond'`.
func micros(d time.Duration) int64 { return d.Microseconds() }
