// Package chaos is fenceq's fault-injection harness: it proves fenceq's guarantees (no
// lost jobs, fenced leases, exactly-once outcomes, the outbox, liveness) end to end with
// real processes and real faults, the way distributed-systems tests do.
//
// # What a run does
//
//   - Starts N real `fenceq worker` processes (separate OS processes, each in its own
//     process group) against one schema, each behind its own TCP fault proxy
//     (internal/faultproxy) and with its own application_name, with a short lease.
//   - Gives them work in waves: a billing run over new customers (jobs/invoice, with a
//     tax-service latency tail past the lease), an order retry storm (clients retrying
//     the same idempotency keys every 300 ms against the orders HTTP API served in this
//     process, plus order.place jobs with the same keys), and sleep jobs longer than the
//     lease that must keep their lease by heartbeating.
//   - Injects faults one after another, drawn from a seed or given as a schedule:
//     pause (SIGSTOP past the lease, then SIGCONT), kill (SIGKILL and restart),
//     terminate (pg_terminate_backend of the worker's sessions), blackhole, reset and
//     latency at the worker's proxy, commit-drop (the proxy lets a COMMIT through and
//     drops the reply, so the outcome is unknown to the worker), and pg-restart
//     (pg_ctl restart -m immediate, only when the harness runs its own throwaway
//     cluster). Each injection records proof that it happened. A fault whose effect
//     is a revoked lease (pause, kill, blackhole, link-down) waits for a worker to hold
//     a lease of the kind it needs and fires on that worker; when none comes to hold
//     one, the fault is recorded as not fired, with the reason.
//   - Lets the work settle, stops the workers, runs internal/verify's invariants and
//     reports: jobs by state, faults scheduled and fired by type, stale writes
//     rejected, leases that expired while their holder lived, duplicates, lost work,
//     and the longest wait from a revocation to the next claim.
//
// A run passes when there are no duplicates, nothing was lost, every scheduled fault
// type fired, and no worker crashed.
//
// # Beyond one machine
//
// With EnvConfig.Hosts (`fenceq chaos --hosts N`) every worker process runs on a host
// of its own: a network namespace per worker and one for PostgreSQL (a throwaway
// cluster listening on that host's address), cabled to a bridge in a switch namespace
// (internal/netns; nothing is added to the harness's own namespace, which reaches the
// server over its Unix socket). Each worker's proxy runs inside the worker's namespace,
// so its traffic crosses the worker's own link. Three faults cut links: link-down (a
// worker's link past the lease; once healed, the worker must record the leases it
// lost), commit-cut (the link cut the moment a COMMIT's reply comes back; the worker
// must settle the commit by looking, the landed check) and db-partition (the database host
// cut off from every worker). Namespaces carry the creating pid in their names, so a
// run removes the leftovers of a crashed one.
//
// With EnvConfig.Failover (`--failover`) the harness runs a primary and a synchronous
// streaming standby and workers use a multi-host URL with
// target_session_attrs=read-write. The failover fault revokes a lease, holds every
// COMMIT reply for a moment, kills the primary (pg_ctl stop -m immediate) and promotes
// the standby. The harness keeps outside the database every enqueue, completion,
// order, invoice and delivery whose commit was acknowledged (tagged, since a promoted
// standby that lost WAL hands the same ids out again) and checks them all on the
// promoted standby, with the revoked lease still revoked there and the commits in
// flight settled by looking. With AsyncReplication (`--async`) the same is measured
// and reported, not asserted.
//
// # The naive baseline
//
// With EnvConfig.Naive the same run uses the naive worker of this package instead
// (RunNaiveWorker, `fenceq chaos naive-worker`): the incidents' design, with leases that
// carry no generation, unconditional completion and release, check-then-insert
// idempotency and no business unique constraints. The same verifier must then report
// duplicates: proof that it can fail.
//
// # Instrumentation
//
// The harness adds one table and trigger to the run's schema, chaos_lease_log, which
// records every claim, revocation and release with the database's time; the report
// measures revocation-to-claim waits from it. The queue never reads it.
package chaos
