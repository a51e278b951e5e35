// Package queue is fenceq's data model: the types that the root package fenceq, the
// operator API, the dashboard and the test helpers share, as River's rivertype is for
// River. It defines what a job row, a lease, a job state, a schedule and a queue are,
// the limits and validators of what may be stored, and the sentinel errors every fenceq
// call returns. It runs no SQL: the functions that read and write these rows are in the
// root package (Enqueue, GetJob, ListJobs, CancelJob, PauseQueue, ...).
//
// # Errors
//
// Compare with errors.Is: ErrLeaseLost (a write under a lease that is no longer held was
// rejected by the database; nothing was written), ErrNotFound, ErrExists, ErrWrongState
// (an operator action that does not apply to the job's state) and ErrInvalid, which
// every *ValidationError matches; a ValidationError names the field that was wrong.
//
// # Job states
//
//	enqueue, run_at in the future ──> scheduled ──(run_at passes)──┐
//	enqueue, due now ───────────────────────────────────────────────┴──> available
//	available ──(a worker claims it: lease_gen+1)──> running
//	running ──> completed | retryable (failed, attempts left) | discarded | cancelled
//	running ──> available (lease expired and revoked, or released at shutdown)
//	running ──> scheduled (snoozed)
//	retryable ──(run_at passes)──> available
//	enqueue behind a dependency, a sequence or a limit ──> pending ──(its turn)──> available
//	running ──> pending (waits for a signal, holding no lease) ──(the signal)──> available
//	running ──> scheduled (waits for a timer, or for a signal with a timeout) ──(signal or deadline)──> available
//	pending ──(a dependency discarded or cancelled)──> cancelled ──(its retry)──> pending
//
// completed, discarded and cancelled are final (FinalStates). An operator's RetryJob
// makes a final, scheduled or retryable job available again; RequeueJob and CancelJob on
// a running job revoke its lease in the same statement. Scheduled and retryable jobs
// become available when the worker's promotion pass finds them due, which runs every
// fenceq.Config.ReaperInterval (5 s by default), so a run_at, a retry's backoff and a
// snooze are honoured to within that interval.
//
// # Leases
//
// A running job is held under a Lease: its id, the lease generation its claim produced
// (a fencing token that grows with every claim and every revocation) and the holder's
// worker id. The database checks the generation on every write made under the lease, so
// a holder that was paused past its lease and replaced can write nothing.
package queue
