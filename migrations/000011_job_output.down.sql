ALTER TABLE fenceq_jobs DROP COLUMN output;
