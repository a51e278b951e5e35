-- A job's recorded output: the JSON value its handler recorded, written by the fenced
-- completion (NULL when it recorded none or has not completed). Its size is bounded by
-- the writers (queue.MaxOutputBytes), not here: a CHECK would re-encode the value on
-- every completion.
ALTER TABLE fenceq_jobs ADD COLUMN output jsonb;
