package fenceqweb

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func jobsSection() section {
	return section{name: "Jobs", path: "/jobs", routes: func(h *Handler, rt *router) {
		rt.page("GET /jobs", h.jobs)
		rt.page("GET /jobs/{id}", h.job)
		rt.action("POST /jobs/{id}/retry", h.retryJob)
		rt.action("POST /jobs/{id}/cancel", h.cancelJob)
		rt.action("POST /jobs/{id}/requeue", h.requeueJob)
	}}
}

// jobFilter is the job list's form: what the URL's query says.
type jobFilter struct {
	State  string
	Queue  string
	Kind   string
	Args   string
	Tag    string
	Before int64
}

// parseJobFilter reads the query. Bad values are a 400 naming the field.
func parseJobFilter(r *http.Request) (jobFilter, error) {
	q := r.URL.Query()
	f := jobFilter{State: q.Get("state"), Queue: strings.TrimSpace(q.Get("queue")),
		Kind: strings.TrimSpace(q.Get("kind")), Args: q.Get("q"), Tag: strings.TrimSpace(q.Get("tag"))}
	if f.State != "" && !queue.State(f.State).Valid() {
		return f, invalid("state", "%q is not a job state", f.State)
	}
	if f.Queue != "" {
		if err := queue.ValidateQueue(f.Queue); err != nil {
			return f, err
		}
	}
	if f.Kind != "" {
		if err := queue.ValidateKind(f.Kind); err != nil {
			return f, err
		}
	}
	if f.Tag != "" {
		if err := queue.ValidateName("tag", f.Tag, queue.MaxTagLen); err != nil {
			return f, err
		}
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return f, invalid("before", "%q is not a job id", s)
		}
		f.Before = n
	}
	return f, nil
}

// params are the engine's list parameters for the filter.
func (h *Handler) listParams(f jobFilter) queue.ListParams {
	p := queue.ListParams{State: queue.State(f.State), Queue: f.Queue, Kind: f.Kind, Args: f.Args, Tag: f.Tag,
		BeforeID: f.Before, Limit: h.cfg.PageSize, ScanLimit: h.cfg.ScanLimit}
	if f.Args != "" {
		p.ScanLimit = h.cfg.ArgsScanLimit
	}
	return p
}

type jobsData struct {
	Clock  clock
	Filter jobFilter
	Page   *queue.JobPage
	// Scanned is how many jobs a filtered page examines at most.
	Scanned int
	States  []queue.State
}

// Filtered reports whether any filter is set.
func (d *jobsData) Filtered() bool {
	f := d.Filter
	return f.State != "" || f.Queue != "" || f.Kind != "" || f.Args != "" || f.Tag != ""
}

func (h *Handler) jobs(ctx context.Context, r *http.Request) (*page, error) {
	f, err := parseJobFilter(r)
	if err != nil {
		return nil, err
	}
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	p := h.listParams(f)
	pg, err := fenceq.ListJobs(ctx, h.cfg.DB, p)
	if err != nil {
		return nil, err
	}
	d := &jobsData{Clock: h.clockAt(now), Filter: f, Page: pg, Scanned: p.ScanLimit, States: queue.JobStates()}
	return &page{title: "Jobs", template: "jobs", nav: "/jobs", data: d}, nil
}
