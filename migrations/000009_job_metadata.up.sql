-- Job metadata: what produced a job and what travels with it (a periodic schedule's
-- name and slot, a trace context), apart from the args its handler decodes.
ALTER TABLE fenceq_jobs ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}'
    CONSTRAINT fenceq_jobs_metadata_object CHECK (jsonb_typeof(metadata) = 'object');
