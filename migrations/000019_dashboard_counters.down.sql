DROP TABLE IF EXISTS fenceq_job_counts_cursor;
DROP TABLE IF EXISTS fenceq_job_counts;
