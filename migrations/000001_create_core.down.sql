DROP TABLE IF EXISTS fenceq_lease_events;
DROP TABLE IF EXISTS fenceq_queues;
DROP TABLE IF EXISTS fenceq_workers;
DROP TRIGGER IF EXISTS fenceq_jobs_notify_insert ON fenceq_jobs;
DROP TABLE IF EXISTS fenceq_jobs;
DROP FUNCTION IF EXISTS fenceq_jobs_notify();
