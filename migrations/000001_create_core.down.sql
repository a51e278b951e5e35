DROP TABLE IF EXISTS fenceq_lease_events;
DROP TABLE IF EXISTS fenceq_queues;
DROP TABLE IF EXISTS fenceq_workers;
-- DROP TABLE drops the notify trigger with the table (Citus refuses DROP TRIGGER on a
-- distributed table, which has none).
DROP TABLE IF EXISTS fenceq_jobs;
DROP FUNCTION IF EXISTS fenceq_jobs_notify();
