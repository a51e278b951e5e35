package fenceqweb

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// jobEventLimit bounds the lease events read for one job's timeline.
const jobEventLimit = 500

type jobData struct {
	Clock    clock
	Job      *queue.JobRow
	Timeline *timeline
	// The actions that apply to the job's state.
	CanRetry, CanCancel, CanRequeue bool
	// Audit are the operator actions that named the job, newest first.
	Audit []queue.AuditRecord
	// Flow is the state of the job's flow partition (nil under no limit, or when the
	// limit was deleted since), FlowRunning its running count against the limit's.
	Flow        *queue.FlowPartition
	FlowRunning string
	// Workflow is the workflow or batch the job belongs to (0: none).
	Workflow int64
}

// jobAuditLimit bounds the audit records shown on a job's page.
const jobAuditLimit = 50

// Running reports whether the job is leased now.
func (d *jobData) Running() bool { return d.Job.State == queue.StateRunning }

func (h *Handler) job(ctx context.Context, r *http.Request) (*page, error) {
	id, err := pathID(r, "id", "job")
	if err != nil {
		return nil, err
	}
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	j, err := fenceq.GetJob(ctx, h.cfg.DB, id)
	if err != nil {
		return nil, err
	}
	events, err := fenceq.ListLeaseEvents(ctx, h.cfg.DB, id, jobEventLimit+1)
	if err != nil {
		return nil, err
	}
	truncated := len(events) > jobEventLimit
	if truncated {
		events = events[:jobEventLimit]
	}
	audit, err := fenceq.ListAudit(ctx, h.cfg.DB, queue.AuditParams{JobID: id, Limit: jobAuditLimit})
	if err != nil {
		return nil, err
	}
	tl := buildTimeline(j, events)
	tl.Truncated = truncated
	d := &jobData{Clock: h.clockAt(now), Job: j, Timeline: tl, Audit: audit,
		CanRetry:   j.State.Final() || slices.Contains([]queue.State{queue.StateScheduled, queue.StateRetryable}, j.State),
		CanCancel:  !j.State.Final(),
		CanRequeue: j.State != queue.StateAvailable,
	}
	if j.FlowKey != nil {
		if d.Flow, d.FlowRunning, err = h.jobFlow(ctx, *j.FlowKey); err != nil {
			return nil, err
		}
	}
	if d.Workflow, err = fenceq.WorkflowOfJob(ctx, h.cfg.DB, id); err != nil {
		return nil, err
	}
	return &page{title: fmt.Sprintf("Job %d", id), template: "job", nav: "/jobs", data: d}, nil
}

// jobFlow reads the partition of a flow key and shows its running count against its
// limit; nil for a key whose limit was deleted.
func (h *Handler) jobFlow(ctx context.Context, key string) (*queue.FlowPartition, string, error) {
	p, err := fenceq.FlowPartitionOf(ctx, h.cfg.DB, key)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	ls, err := fenceq.ListFlowLimits(ctx, h.cfg.DB)
	if err != nil {
		return nil, "", err
	}
	for _, l := range ls {
		if l.Name == p.Limit {
			return p, flowRunning(*p, l), nil
		}
	}
	return p, strconv.Itoa(p.Running), nil
}

// confirmData is the confirmation step of a destructive action: a page whose form
// posts the same action again with confirm=yes. It needs no script.
type confirmData struct {
	Heading string
	Lines   []string
	// Action is the form's target below the root; Button its label; Back the page to
	// return to below the root.
	Action, Button, Back string
}

// confirmed reports whether the POST carries the confirmation.
func confirmed(r *http.Request) bool { return r.PostFormValue("confirm") == "yes" }

func confirmPage(title string, d confirmData) *page {
	return &page{title: title, template: "confirm", data: d}
}

func (h *Handler) retryJob(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
	id, err := pathID(r, "id", "job")
	if err != nil {
		return nil, nil, err
	}
	if _, err := fenceq.RetryJob(ctx, h.cfg.DB, id); err != nil {
		return nil, nil, explainWrongState(err, fmt.Sprintf(" (requeue job %d to force it)", id))
	}
	h.cfg.Logger.Info("dashboard: job retried", "job_id", id)
	return &redirect{to: fmt.Sprintf("jobs/%d", id), flash: "retried"}, nil, nil
}

func (h *Handler) cancelJob(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
	id, err := pathID(r, "id", "job")
	if err != nil {
		return nil, nil, err
	}
	if !confirmed(r) {
		j, err := fenceq.GetJob(ctx, h.cfg.DB, id)
		if err != nil {
			return nil, nil, err
		}
		lines := []string{fmt.Sprintf("Job %d (%s on queue %s) is %s. Cancelling it is final: it will not run again unless retried.",
			id, j.Kind, j.Queue, j.State)}
		if j.State == queue.StateRunning {
			lines = append(lines, revokeLine(j))
		}
		return nil, confirmPage("Cancel job", confirmData{Heading: fmt.Sprintf("Cancel job %d?", id), Lines: lines,
			Action: fmt.Sprintf("jobs/%d/cancel", id), Button: "Cancel the job", Back: fmt.Sprintf("jobs/%d", id)}), nil
	}
	if _, err := fenceq.CancelJob(ctx, h.cfg.DB, id, ""); err != nil {
		return nil, nil, explainWrongState(err, "")
	}
	h.cfg.Logger.Info("dashboard: job cancelled", "job_id", id)
	return &redirect{to: fmt.Sprintf("jobs/%d", id), flash: "cancelled"}, nil, nil
}

func (h *Handler) requeueJob(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
	id, err := pathID(r, "id", "job")
	if err != nil {
		return nil, nil, err
	}
	if !confirmed(r) {
		j, err := fenceq.GetJob(ctx, h.cfg.DB, id)
		if err != nil {
			return nil, nil, err
		}
		lines := []string{fmt.Sprintf("Job %d (%s on queue %s) is %s. Requeueing makes it available now.",
			id, j.Kind, j.Queue, j.State)}
		if j.State == queue.StateRunning {
			lines = append(lines, revokeLine(j), "The job will run again: what its first holder did outside its fenced writes may happen twice.")
		}
		return nil, confirmPage("Requeue job", confirmData{Heading: fmt.Sprintf("Requeue job %d?", id), Lines: lines,
			Action: fmt.Sprintf("jobs/%d/requeue", id), Button: "Requeue the job", Back: fmt.Sprintf("jobs/%d", id)}), nil
	}
	if _, err := fenceq.RequeueJob(ctx, h.cfg.DB, id); err != nil {
		return nil, nil, explainWrongState(err, "")
	}
	h.cfg.Logger.Info("dashboard: job requeued", "job_id", id)
	return &redirect{to: fmt.Sprintf("jobs/%d", id), flash: "requeued"}, nil, nil
}

func revokeLine(j *queue.JobRow) string {
	return fmt.Sprintf("It is running under lease generation %d held by %s: that lease is revoked (generation %d → %d), "+
		"and every later write of its holder is rejected by the database.", j.LeaseGen, orDash(deref(j.LeasedBy)), j.LeaseGen, j.LeaseGen+1)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// explainWrongState turns the engine's wrong-state error into a 409 with a hint.
func explainWrongState(err error, hint string) error {
	if !errors.Is(err, queue.ErrWrongState) {
		return err
	}
	return &httpError{status: http.StatusConflict, msg: err.Error() + hint}
}
