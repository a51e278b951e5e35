package store

// SQL for fenceq_workers.

const sqlRegisterWorker = `
INSERT INTO fenceq_workers (id, host, pid, queues, kinds, heartbeat_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid,
    queues = EXCLUDED.queues, kinds = EXCLUDED.kinds, heartbeat_at = EXCLUDED.heartbeat_at`

const sqlDeregisterWorker = `DELETE FROM fenceq_workers WHERE id = $1`

// Stale workers are removed only when they hold no running job.
var sqlDeleteStaleWorkers = `
DELETE FROM fenceq_workers w
WHERE w.heartbeat_at < now() - $1::bigint * interval '1 microsecond'
  AND NOT EXISTS (SELECT 1 FROM fenceq_jobs j WHERE j.state = ` + sqlRunning + ` AND j.leased_by = w.id)`

var sqlListWorkers = `
SELECT w.id, w.host, w.pid, w.queues, w.kinds, w.started_at, w.heartbeat_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8,
       (SELECT count(*) FROM fenceq_jobs j WHERE j.state = ` + sqlRunning + ` AND j.leased_by = w.id)
FROM fenceq_workers w ORDER BY w.started_at, w.id`
