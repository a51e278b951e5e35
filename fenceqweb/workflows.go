package fenceqweb

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func workflowsSection() section {
	return section{name: "Workflows", path: "/workflows", routes: func(h *Handler, rt *router) {
		rt.page("GET /workflows", h.workflows)
		rt.page("GET /workflows/{id}", h.workflow)
		rt.page("GET /jobs/{id}/workflow", h.jobWorkflow)
	}}
}

type workflowsData struct {
	Clock     clock
	Workflows []*queue.Workflow
	// Next is the id to list before for the next page (0: no more).
	Next int64
}

// workflowsPageSize is how many workflows one page lists.
const workflowsPageSize = 50

// workflows lists the newest workflows and batches with their tasks' counts by state,
// as `fenceq workflows list` does.
func (h *Handler) workflows(ctx context.Context, r *http.Request) (*page, error) {
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	var before int64
	if s := r.URL.Query().Get("before"); s != "" {
		if before, err = strconv.ParseInt(s, 10, 64); err != nil || before < 0 {
			return nil, &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("invalid before %q: want a workflow id", s)}
		}
	}
	wfs, err := fenceq.ListWorkflows(ctx, h.cfg.DB, queue.WorkflowListParams{BeforeID: before, Limit: workflowsPageSize + 1})
	if err != nil {
		return nil, err
	}
	d := &workflowsData{Clock: h.clockAt(now), Workflows: wfs}
	if len(wfs) > workflowsPageSize {
		d.Workflows = wfs[:workflowsPageSize]
		d.Next = d.Workflows[workflowsPageSize-1].ID
	}
	return &page{title: "Workflows", template: "workflows", nav: "/workflows", data: d}, nil
}

type workflowData struct {
	Clock    clock
	Workflow *queue.Workflow
	// Names are the task names by job id, to name the dependencies in the workflow.
	Names map[int64]string
}

// workflow shows one workflow or batch: each task, its job, its state and its
// dependencies, as `fenceq workflows show` does.
func (h *Handler) workflow(ctx context.Context, r *http.Request) (*page, error) {
	id, err := pathID(r, "id", "workflow")
	if err != nil {
		return nil, err
	}
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	wf, err := fenceq.GetWorkflow(ctx, h.cfg.DB, id)
	if err != nil {
		return nil, err
	}
	names := make(map[int64]string, len(wf.Tasks))
	for _, t := range wf.Tasks {
		names[t.JobID] = t.Name
	}
	return &page{title: fmt.Sprintf("Workflow %d", id), template: "workflow", nav: "/workflows",
		data: &workflowData{Clock: h.clockAt(now), Workflow: wf, Names: names}}, nil
}

// jobWorkflow shows the workflow a job belongs to: the job page links here.
func (h *Handler) jobWorkflow(ctx context.Context, r *http.Request) (*page, error) {
	id, err := pathID(r, "id", "job")
	if err != nil {
		return nil, err
	}
	wf, err := fenceq.WorkflowOfJob(ctx, h.cfg.DB, id)
	if err != nil {
		return nil, err
	}
	if wf == 0 {
		return nil, &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("job %d belongs to no workflow or batch", id)}
	}
	r.SetPathValue("id", strconv.FormatInt(wf, 10))
	return h.workflow(ctx, r)
}
