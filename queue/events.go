package queue

import (
	"slices"
	"time"
)

// LeaseEventKind names what happened to a lease. The kinds are the contract of
// fenceq_lease_events.kind.
type LeaseEventKind string

// Lease event kinds.
const (
	// EventRevoked: the reaper or an operator took the lease away and bumped the generation.
	EventRevoked LeaseEventKind = "revoked"
	// EventStaleWriteRejected: a write under an old generation matched nothing.
	EventStaleWriteRejected LeaseEventKind = "stale_write_rejected"
	// EventExpiredHolderAlive: a lease expired while its holder process still heartbeated.
	EventExpiredHolderAlive LeaseEventKind = "expired_holder_alive"
	// EventHeartbeatLost: a holder's heartbeat found its lease gone.
	EventHeartbeatLost LeaseEventKind = "heartbeat_lost"
)

var leaseEventKinds = [...]LeaseEventKind{EventRevoked, EventStaleWriteRejected, EventExpiredHolderAlive, EventHeartbeatLost}

// LeaseEventKinds returns every lease event kind.
func LeaseEventKinds() []LeaseEventKind { return slices.Clone(leaseEventKinds[:]) }

// LeaseEvent is one row of fenceq_lease_events.
type LeaseEvent struct {
	ID       int64          `json:"id"`
	JobID    int64          `json:"job_id"`
	LeaseGen int64          `json:"lease_gen"`
	WorkerID *string        `json:"worker_id"`
	Kind     LeaseEventKind `json:"kind"`
	Detail   *string        `json:"detail"`
	At       time.Time      `json:"at"`
}
