package queue

import "time"

// AuditRecord is one row of fenceq_audit: an operator action, who took it and what it
// named. It is written in the transaction of the action itself, so a record exists
// exactly when the action committed. A bulk action writes one record per batch, with
// the ids it changed.
type AuditRecord struct {
	ID int64     `json:"id"`
	At time.Time `json:"at"`
	// Actor is who acted: "dashboard:USER" (basic auth), "dashboard:token" (bearer
	// token), "dashboard:loopback" (a dashboard without auth, which listens on loopback
	// only), "cli:OSUSER", or what an application set with fenceq.WithActor ("api" when
	// it set nothing).
	Actor string `json:"actor"`
	// Action is what was done: one of the AuditAction constants.
	Action AuditAction `json:"action"`
	// JobIDs are the jobs the action changed.
	JobIDs []int64 `json:"job_ids"`
	// Names are the queues or schedules the action named.
	Names []string `json:"names"`
	// Filter is the filter of a bulk action by filter, nil otherwise.
	Filter *JobFilter `json:"filter,omitempty"`
	// Matched is how many jobs the batch of a bulk action examined (changed and
	// skipped); 0 for other actions.
	Matched int `json:"matched"`
	// Detail is free text: a cancellation's reason, a confirmed count.
	Detail string `json:"detail,omitempty"`
}

// AuditAction names an operator action in the audit trail.
type AuditAction string

// The actions recorded in fenceq_audit.
const (
	AuditRetry           AuditAction = "retry"
	AuditCancel          AuditAction = "cancel"
	AuditRequeue         AuditAction = "requeue"
	AuditDelete          AuditAction = "delete"
	AuditPauseQueue      AuditAction = "pause_queue"
	AuditResumeQueue     AuditAction = "resume_queue"
	AuditAddQueue        AuditAction = "add_queue"
	AuditRemoveQueue     AuditAction = "remove_queue"
	AuditPausePeriodic   AuditAction = "pause_periodic"
	AuditResumePeriodic  AuditAction = "resume_periodic"
	AuditRemovePeriodic  AuditAction = "remove_periodic"
	AuditTriggerPeriodic AuditAction = "trigger_periodic"
	AuditSetQueueLimit   AuditAction = "set_queue_limit"
)

// AuditParams selects audit records for fenceq.ListAudit, newest first.
type AuditParams struct {
	// JobID keeps the records naming this job; 0 for all.
	JobID int64
	// BeforeID pages backwards (keyset): only records with a smaller id.
	BeforeID int64
	// Limit defaults to 100; at most 1000.
	Limit int
}
