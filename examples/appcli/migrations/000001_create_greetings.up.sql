CREATE TABLE greetings (
    job_id bigint PRIMARY KEY,
    name   text NOT NULL
);
