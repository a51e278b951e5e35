package queue

import "time"

// QueueInfo is one queue: its settings and job counts by state.
type QueueInfo struct {
	Name   string `json:"name"`
	Paused bool   `json:"paused"`
	// Counts holds the unfinished jobs by state and, for the final states, the jobs
	// that reached them within the last day (fenceq.ListQueues).
	Counts map[State]int64 `json:"counts"`
}

// WorkerInfo is one row of fenceq_workers plus what the database derives from it.
type WorkerInfo struct {
	ID     string   `json:"id"`
	Host   string   `json:"host"`
	PID    int      `json:"pid"`
	Queues []string `json:"queues"`
	// Kinds are the job kinds the worker has handlers for: the only ones it claims.
	Kinds       []string  `json:"kinds"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// HeartbeatAge is now() - heartbeat_at by the database's clock.
	HeartbeatAge time.Duration `json:"heartbeat_age"`
	RunningJobs  int64         `json:"running_jobs"`
}
