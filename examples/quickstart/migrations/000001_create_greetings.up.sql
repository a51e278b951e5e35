CREATE TABLE greetings (job_id bigint PRIMARY KEY, text text NOT NULL);
