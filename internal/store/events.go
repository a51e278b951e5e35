package store

import (
	"context"
	"fmt"
	"time"

	"github.com/fenceq/fenceq/queue"
)

const sqlRecordEvents = `
INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
SELECT id, gen, $3, $4, $5 FROM unnest($1::bigint[], $2::bigint[]) AS l(id, gen)`

// RecordLeaseEvents records one event of the given kind for each lease.
func RecordLeaseEvents(ctx context.Context, db queue.DBTX, kind queue.LeaseEventKind, holder, detail string, leases []queue.Lease) error {
	if len(leases) == 0 {
		return nil
	}
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		if dist {
			evs := make([]eventRow, len(leases))
			for i, l := range leases {
				evs[i] = eventRow{jobID: l.JobID, gen: l.Gen, worker: &holder, kind: kind, detail: detail}
			}
			return insertEvents(ctx, db, evs)
		}
		ids, gens := leaseArrays(leases)
		_, err := db.Exec(ctx, sqlRecordEvents, ids, gens, holder, string(kind), detail)
		return err
	})
	if err != nil {
		return fmt.Errorf("record %d %s lease events: %w", len(leases), kind, err)
	}
	return nil
}

const sqlCountEvents = `
SELECT kind, count(*) FROM fenceq_lease_events
WHERE at > now() - $1::bigint * interval '1 microsecond'
GROUP BY kind`

// CountLeaseEvents counts lease events by kind over the last window, by the database's
// clock. Every kind is present in the result, zero when none happened.
func CountLeaseEvents(ctx context.Context, db queue.DBTX, window time.Duration) (map[queue.LeaseEventKind]int64, error) {
	rows, err := db.Query(ctx, sqlCountEvents, micros(window))
	if err != nil {
		return nil, fmt.Errorf("count lease events: %w", err)
	}
	defer rows.Close()
	out := make(map[queue.LeaseEventKind]int64, len(queue.LeaseEventKinds()))
	for _, k := range queue.LeaseEventKinds() {
		out[k] = 0
	}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return nil, fmt.Errorf("count lease events: %w", err)
		}
		out[queue.LeaseEventKind(k)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count lease events: %w", err)
	}
	return out, nil
}

const sqlListEvents = `
SELECT id, job_id, lease_gen, worker_id, kind, detail, at FROM fenceq_lease_events
WHERE ($1::bigint = 0 OR job_id = $1)
ORDER BY id DESC LIMIT $2`

// ListLeaseEvents returns the newest lease events, of one job when jobID is not 0.
func ListLeaseEvents(ctx context.Context, db queue.DBTX, jobID int64, limit int) ([]queue.LeaseEvent, error) {
	rows, err := db.Query(ctx, sqlListEvents, jobID, limit)
	if err != nil {
		return nil, fmt.Errorf("list lease events: %w", err)
	}
	defer rows.Close()
	var out []queue.LeaseEvent
	for rows.Next() {
		var e queue.LeaseEvent
		var k string
		if err := rows.Scan(&e.ID, &e.JobID, &e.LeaseGen, &e.WorkerID, &k, &e.Detail, &e.At); err != nil {
			return nil, fmt.Errorf("list lease events: %w", err)
		}
		e.Kind = queue.LeaseEventKind(k)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list lease events: %w", err)
	}
	return out, nil
}

// leaseLostReads are the CTEs both forms of recording lost leases read: the leases
// ($1 ids, $2 generations), their revocations for expiry and their earlier
// expired_holder_alive events, as joins rather than correlated subqueries (Citus plans
// none next to a CTE).
var leaseLostReads = `
WITH l AS (SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS l(lid, lgen)),
rev AS (
    SELECT DISTINCT job_id AS rid, lease_gen AS rgen FROM fenceq_lease_events
    WHERE job_id = ANY($1::bigint[]) AND kind = ` + sqlEventRevoked + `
      AND detail LIKE ` + sqlLit(detailExpired+"%") + `),
seen AS (
    SELECT DISTINCT job_id AS sid, lease_gen AS sgen FROM fenceq_lease_events
    WHERE job_id = ANY($1::bigint[]) AND kind = ` + sqlEventHolderAlive + `)`

// leaseLostAlive selects the leases revoked for expiry that have no
// expired_holder_alive event yet.
const leaseLostAlive = `
FROM l
JOIN rev ON rev.rid = l.lid AND rev.rgen = l.lgen
LEFT JOIN seen ON seen.sid = l.lid AND seen.sgen = l.lgen
WHERE seen.sid IS NULL`

// sqlRecordLeaseLost records the lost leases ($3 the holder) in one statement. Every
// part of it sees the same snapshot, so the heartbeat_lost rows it inserts are not
// among those read.
var sqlRecordLeaseLost = leaseLostReads + `,
hb AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT lid, lgen, $3, ` + sqlEventHeartbeatLost + `, ` + sqlLit(detailHeartbeatLost) + ` FROM l),
alive AS (
    INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail)
    SELECT l.lid, l.lgen, $3, ` + sqlEventHolderAlive + `, ` + sqlLit(detailHolderWasAlive) + leaseLostAlive + `
    RETURNING job_id)
SELECT COALESCE(array_agg(job_id), '{}')::bigint[] FROM alive`

// sqlLeasesLostAlive is the read of sqlRecordLeaseLost alone, for Citus (see fencedSQL).
var sqlLeasesLostAlive = leaseLostReads + `
SELECT COALESCE(array_agg(l.lid), '{}')::bigint[], COALESCE(array_agg(l.lgen), '{}')::bigint[]` + leaseLostAlive

// RecordLeasesLost records a heartbeat_lost event for each lease a live holder found
// gone, and an expired_holder_alive event for each of them that the reaper revoked for
// expiry (unless the reaper already recorded one). It returns the job ids of the latter:
// a holder that was alive, still running the job, when its lease expired.
func RecordLeasesLost(ctx context.Context, db queue.DBTX, holder string, leases []queue.Lease) ([]int64, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	ids, gens := leaseArrays(leases)
	var alive []int64
	err := onConn(ctx, db, func(db queue.DBTX, dist bool) error {
		if !dist {
			return db.QueryRow(ctx, sqlRecordLeaseLost, ids, gens, holder).Scan(&alive)
		}
		return inTx(ctx, db, func(tx queue.DBTX) error {
			var aliveGens []int64
			if err := tx.QueryRow(ctx, sqlLeasesLostAlive, ids, gens).Scan(&alive, &aliveGens); err != nil {
				return err
			}
			evs := make([]eventRow, 0, len(leases)+len(alive))
			for _, l := range leases {
				evs = append(evs, eventRow{jobID: l.JobID, gen: l.Gen, worker: &holder, kind: queue.EventHeartbeatLost, detail: detailHeartbeatLost})
			}
			for i, id := range alive {
				evs = append(evs, eventRow{jobID: id, gen: aliveGens[i], worker: &holder, kind: queue.EventExpiredHolderAlive, detail: detailHolderWasAlive})
			}
			return insertEvents(ctx, tx, evs)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("record %d lost leases: %w", len(leases), err)
	}
	return alive, nil
}
