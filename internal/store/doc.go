// Package store is fenceq's engine: every statement that enqueues, claims, renews,
// fences, finishes, reaps and prunes jobs in PostgreSQL. It imports pgx and package queue
// (the data model) and nothing of fenceq's root package; the root package's Worker drives
// it, and the root package's operator API wraps its operator statements. Being internal,
// none of its names is a promise to applications.
//
// # Leases and generations
//
// A job is worked under a lease named by (job id, lease_gen). lease_gen is a fencing
// token: it grows by one on every claim and on every revocation (reaper, operator
// requeue or cancel of a running job). Every write a holder makes for a job —
// heartbeat, completion, failure, snooze, cancel, release, and the rows of its fenced
// transaction — carries "id = $1 AND lease_gen = $2 AND state = 'running'" in the same
// statement or transaction as the write, so the database, not the holder, decides
// whether the lease is still held. A write that matches nothing returns ErrLeaseLost
// and leaves a stale_write_rejected row in fenceq_lease_events.
//
// # State machine
//
//	Insert, run_at > now() ───> scheduled ──PromoteDue──┐
//	Insert, run_at <= now() ────────────────────────────┴──> available <──────────┐
//	                                                            │                  │
//	                         Claim: lease_gen+1, attempt+1,     │                  │
//	                         lease_expires_at = now() + lease   │                  │
//	                                                            v                  │
//	retryable ──PromoteDue──> available                      running ──────────────┤
//	    ^                                                       │  Release (same   │
//	    │                                                       │  gen, attempt-1) │
//	    └──────────── Fail, attempts left ──────────────────────┤                  │
//	                                                            │  Reap, expired:  │
//	scheduled <────── Snooze(d > 0) ────────────────────────────┤  lease_gen+1 ────┘
//	completed <────── Complete, CompleteMany, WithLease ────────┤  (discarded when
//	discarded <────── Fail, no attempts left or Discard ────────┤   no attempts left)
//	cancelled <────── Cancel ───────────────────────────────────┘
//
// Every arrow leaving running is a compare-and-set on (id, lease_gen, state =
// 'running').
//
// # The hot set and history
//
// Jobs live in fenceq_jobs_hot until they finish. The statement that finishes a job
// (completed, discarded, cancelled) deletes it from the hot set and inserts it into
// fenceq_jobs_history with its final values, fenced as above: the DELETE carries the
// lease condition. A job whose unique key is held in its final state (its unique_states
// include it) is updated in place and stays hot, so that the one unique index, on the hot
// set, decides every key. RetryJob and RequeueJob move a job in history back. Claims,
// heartbeats, the reaper and the scheduler read and lock only the hot set; reads of any
// job go through fenceq_jobs, the view of both (see hot_sql.go). WithLease completes the job only with LeaseTx{Complete: true}; Snooze(0)
// makes the job available at once. completed, discarded and cancelled are final
// (finished_at is set); RetryJob makes a final, scheduled or retryable job available
// now. RequeueJob (any state) and CancelJob (any unfinished state) on a running job bump
// lease_gen, revoking the holder's lease in the same statement and recording a revoked
// lease event.
//
// # The fenced transaction
//
// WithLease runs a caller's writes in one short transaction fenced by the lease; with
// LeaseTx{Complete: true} the job's completion commits in the same transaction, so a
// handler's results, its outbox rows and its completion commit together or not at all.
// The transaction first locks the job row with
// "SELECT … WHERE id = $1 AND lease_gen = $2 AND state = 'running' FOR UPDATE". No
// row means the lease is gone: roll back, ErrLeaseLost. A row means the lock keeps the
// reaper (which uses SKIP LOCKED and compare-and-set on the generation it read) and
// every other writer out until COMMIT, so a pause between the check and the write
// cannot be exploited: the transaction wins or loses as a whole. On a pipelined
// connection BEGIN and the lock travel with the function's first statement, and a lock
// that finds no row raises, so the server skips that statement: nothing of the
// function's runs before the lock returned the row.
//
// # Liveness
//
// Heartbeat renews every lease of a process in one statement, skipping (not waiting for)
// rows locked by a concurrent fenced commit. The reaper revokes leases whose
// lease_expires_at < now() — the database's clock, never a worker's — so a job whose
// holder stopped heartbeating is offered again within the lease plus the reaper
// interval, and a job whose holder keeps heartbeating keeps its lease however long it
// runs. When the revoked holder still heartbeats its fenceq_workers row, or later finds
// its expired lease revoked while still running the job, an expired_holder_alive event
// is recorded: a paused or stuck process, the alert condition.
//
// # Periodic schedules
//
// fenceq_periodic holds the schedules; last_slot says up to which instant every slot is
// decided. A scheduling pass (fenceq's Worker runs one every PeriodicInterval) is one
// transaction: LockPeriodicClock locks the one row of fenceq_periodic_clock, which
// serializes passes across workers without electing a leader; ReadDuePeriodic reads
// clock_timestamp() and the schedules; for each, EnqueuePeriodic moves last_slot with a
// compare-and-set (from the value read, on the definition read) and inserts the slots'
// jobs in the same statement; TouchPeriodicClock records the pass. A slot is enqueued
// once because last_slot only grows and the job insert commits with it, whether or not
// an earlier job of the slot still exists (a unique key would hold only while that job
// is unfinished). The session's idle_in_transaction_session_timeout, set by the lock,
// disconnects a pass paused mid-transaction so that it cannot hold the lock.
//
// # Times
//
// All decisions use now() in SQL; durations are passed as microseconds. The one time
// that comes from Go is an absolute InsertParams.RunAt an application asks for. Workers
// use monotonic time only for their own local lease deadline.
package store
