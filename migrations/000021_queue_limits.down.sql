ALTER TABLE fenceq_queues DROP CONSTRAINT fenceq_queues_max_running_check;
ALTER TABLE fenceq_queues DROP COLUMN max_running;
