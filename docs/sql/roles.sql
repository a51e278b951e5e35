-- Two least-privilege roles for fenceq's SQL functions (docs/other-languages.md).
--
-- Roles belong to the whole cluster, so no migration creates them: an operator runs
-- this file once per schema, as a role that may create roles (CREATEROLE) and that owns
-- fenceq's schema (the role that ran the migrations), with psql:
--
--   psql "$DATABASE_URL" -v schema=app -v enqueue_role=app_enqueue -v worker_role=app_sql_worker \
--        -f docs/sql/roles.sql
--
-- Both roles are NOLOGIN: grant them to the login roles of your services
-- (GRANT app_enqueue TO billing_api), or make them log in themselves
-- (ALTER ROLE app_enqueue LOGIN PASSWORD '...').
--
-- Neither role gets any privilege on fenceq's tables: the functions are SECURITY
-- DEFINER and do their work as the schema's owner, after checking their input and,
-- for a worker's writes, the lease.

-- enqueue_role may enqueue jobs and workflows and send signals, and nothing else: it
-- cannot read a job's args nor complete a job.
CREATE ROLE :"enqueue_role" NOLOGIN;
GRANT USAGE ON SCHEMA :"schema" TO :"enqueue_role";
GRANT EXECUTE ON FUNCTION
    :"schema".fenceq_enqueue(text, jsonb, text, timestamptz, int, text, int, text[], jsonb),
    :"schema".fenceq_enqueue_workflow(text, jsonb),
    :"schema".fenceq_send_signal(bigint, text, jsonb)
    TO :"enqueue_role";

-- worker_role is for workers written in other languages: it completes and heartbeats
-- the jobs it holds a lease on, writes outbox messages, records its rejected writes
-- and may enqueue follow-up jobs. Grant it, besides, what its handlers need on your
-- application's own tables (the result rows it writes in the completing transaction).
CREATE ROLE :"worker_role" NOLOGIN;
GRANT USAGE ON SCHEMA :"schema" TO :"worker_role";
GRANT EXECUTE ON FUNCTION
    :"schema".fenceq_enqueue(text, jsonb, text, timestamptz, int, text, int, text[], jsonb),
    :"schema".fenceq_complete(bigint, bigint, jsonb),
    :"schema".fenceq_heartbeat(bigint, bigint),
    :"schema".fenceq_record_stale(bigint, bigint, text, text),
    :"schema".fenceq_outbox_add(text, jsonb, text, bigint, int),
    :"schema".fenceq_enqueue_workflow(text, jsonb),
    :"schema".fenceq_send_signal(bigint, text, jsonb),
    :"schema".fenceq_wait(bigint, bigint, text, timestamptz)
    TO :"worker_role";
