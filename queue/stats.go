package queue

import "time"

// DefaultCountCap is the most jobs of one group of states fenceq.CountJobs and fenceq.JobThroughput
// read before they stop and report the count as a lower bound.
const DefaultCountCap = 100_000

// QueueCount is one queue's jobs as fenceq.CountJobs counts them.
type QueueCount struct {
	Name   string `json:"name"`
	Paused bool   `json:"paused"`
	// Unfinished counts the queue's available, scheduled, running and retryable jobs.
	Unfinished map[State]int64 `json:"unfinished"`
	// Finished counts the queue's jobs that finished within the window, by final state.
	Finished map[State]int64 `json:"finished"`
}

// QueueCounts is the outcome of fenceq.CountJobs.
type QueueCounts struct {
	Queues []QueueCount `json:"queues"`
	// Window is how far back Finished counts.
	Window time.Duration `json:"window"`
	// Capped lists the states whose counting stopped at the cap: their counts are lower
	// bounds.
	Capped []State `json:"capped"`
}

// CountParams tunes fenceq.CountJobs and fenceq.JobThroughput.
type CountParams struct {
	// Window is how far back finished jobs count. Defaults to an hour.
	Window time.Duration
	// Cap bounds the jobs read per group of states. Defaults to DefaultCountCap.
	Cap int
}

// ThroughputBucket is one interval of fenceq.JobThroughput, by the database's clock.
type ThroughputBucket struct {
	Start     time.Time `json:"start"`
	Completed int64     `json:"completed"`
	Discarded int64     `json:"discarded"`
	Cancelled int64     `json:"cancelled"`
	// Failed counts failed attempts (the errors of jobs), lease expiries included,
	// operator and handler cancellations not: those of jobs that finished in the
	// interval, and those recorded in the interval by jobs that have not finished.
	Failed int64 `json:"failed"`
}

// Throughput is the outcome of fenceq.JobThroughput.
type Throughput struct {
	// Now is the database's now() when the buckets were read.
	Now time.Time `json:"now"`
	// Bucket is each interval's length.
	Bucket  time.Duration      `json:"bucket"`
	Buckets []ThroughputBucket `json:"buckets"`
	// Capped is true when a scan stopped at the cap: the figures are lower bounds.
	Capped bool `json:"capped"`
}

// Rollup is the outcome of one roll-up of the job counters (fenceq.RollupJobCounts).
type Rollup struct {
	// Skipped is true when another roll-up held the counters' cursor: this one counted
	// nothing.
	Skipped bool `json:"skipped"`
	// From and To bound the finish times counted, From excluded and To included.
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Jobs is how many finished jobs were counted.
	Jobs int64 `json:"jobs"`
}

// CountersState is how far the job counters have been rolled up.
type CountersState struct {
	// RolledTo is the counters' cursor: jobs finished at or before it are counted. Zero
	// before the first roll-up.
	RolledTo time.Time `json:"rolled_to"`
	// RolledAt is when the last roll-up ran, by the database's clock; zero before the
	// first.
	RolledAt time.Time `json:"rolled_at"`
}

// KindErrors is one kind's errors over a window, as fenceq.CountErrorsByKind counts
// them from the job counters.
type KindErrors struct {
	Kind string `json:"kind"`
	// Discarded counts the kind's jobs discarded in the window.
	Discarded int64 `json:"discarded"`
	// Failed counts the failed attempts of the kind's jobs that finished in the window:
	// handler errors, panics and lease expiries, not cancellations.
	Failed int64 `json:"failed"`
}

// Activity is what pg_stat_activity says about the database's open transactions.
type Activity struct {
	// OldestTransactionAge is the age of the oldest open client transaction (idle ones
	// included), 0 when none. Without the pg_read_all_stats role, other users' sessions
	// are invisible.
	OldestTransactionAge time.Duration `json:"oldest_transaction_age"`
	// IdleInTransaction counts client sessions idle in an open transaction.
	IdleInTransaction int64 `json:"idle_in_transaction"`
}
