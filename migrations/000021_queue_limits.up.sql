-- A queue's limit: at most max_running jobs of the queue running at once across every
-- worker process, set and changed at runtime (fenceq.SetQueueLimit, `fenceq queues limit`),
-- whatever the jobs were enqueued with. The ordinary claim and the flow claim leave a
-- limited queue out; a worker claims from it in a transaction that takes the queue's
-- advisory lock and then counts the queue's running jobs in a statement of its own (a
-- snapshot taken after the lock), so two claims never both fill one slot.
ALTER TABLE fenceq_queues ADD COLUMN max_running integer;
ALTER TABLE fenceq_queues ADD CONSTRAINT fenceq_queues_max_running_check CHECK (max_running >= 1);
