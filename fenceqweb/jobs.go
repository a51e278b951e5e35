package fenceqweb

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func jobsSection() section {
	return section{name: "Jobs", path: "/jobs", routes: func(h *Handler, rt *router) {
		rt.page("GET /jobs", h.jobs)
		rt.page("GET /jobs/{id}", h.job)
		rt.action("POST /jobs/bulk", h.bulkJobs)
		rt.action("POST /jobs/{id}/retry", h.retryJob)
		rt.action("POST /jobs/{id}/cancel", h.cancelJob)
		rt.action("POST /jobs/{id}/requeue", h.requeueJob)
	}}
}

// timeInput is the form of the time range inputs (an HTML datetime-local), read in
// the dashboard's configured location.
const timeInput = "2006-01-02T15:04"

// jobFilter is the job list's form: what the URL's query (or a bulk action's form)
// says, as typed.
type jobFilter struct {
	State, Queue, Kind, Tag string
	// Args and Meta are JSON objects the job's args and metadata must contain.
	Args, Meta string
	// Error holds words of the job's last error.
	Error string
	// From and To bound created_at, as timeInput.
	From, To string
	Before   int64
	// f is the engine's filter.
	f queue.JobFilter
}

// filterFields are the form fields of a filter, in the order links spell them.
var filterFields = []string{"state", "queue", "kind", "tag", "args", "meta", "error", "from", "to"}

// parseJobFilter reads a filter from form values (a URL's query or a POST's form). Bad
// values are a 400 naming the field.
func (h *Handler) parseJobFilter(v url.Values) (jobFilter, error) {
	f := jobFilter{State: v.Get("state"), Queue: strings.TrimSpace(v.Get("queue")),
		Kind: strings.TrimSpace(v.Get("kind")), Tag: strings.TrimSpace(v.Get("tag")),
		Args: strings.TrimSpace(v.Get("args")), Meta: strings.TrimSpace(v.Get("meta")),
		Error: strings.TrimSpace(v.Get("error")), From: v.Get("from"), To: v.Get("to")}
	f.f = queue.JobFilter{State: queue.State(f.State), Queue: f.Queue, Kind: f.Kind, Tag: f.Tag, Error: f.Error}
	if f.Args != "" {
		f.f.Args = json.RawMessage(f.Args)
	}
	if f.Meta != "" {
		f.f.Metadata = json.RawMessage(f.Meta)
	}
	for _, tm := range []struct {
		field, s string
		to       *time.Time
	}{{"from", f.From, &f.f.CreatedAfter}, {"to", f.To, &f.f.CreatedBefore}} {
		if tm.s == "" {
			continue
		}
		t, err := time.ParseInLocation(timeInput, tm.s, h.cfg.Location)
		if err != nil {
			return f, invalid(tm.field, "%q is not a time like 2026-01-31T14:05", tm.s)
		}
		*tm.to = t
	}
	if err := f.f.Validate(); err != nil {
		return f, err
	}
	if s := v.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return f, invalid("before", "%q is not a job id", s)
		}
		f.Before = n
	}
	return f, nil
}

// values are the filter's form values, without the page position.
func (f jobFilter) values() url.Values {
	v := url.Values{}
	for i, s := range []string{f.State, f.Queue, f.Kind, f.Tag, f.Args, f.Meta, f.Error, f.From, f.To} {
		if s != "" {
			v.Set(filterFields[i], s)
		}
	}
	return v
}

// Link is the job list's query for this filter, from the page below before (0: the
// newest).
func (f jobFilter) Link(before int64) string {
	v := f.values()
	if before > 0 {
		v.Set("before", strconv.FormatInt(before, 10))
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// Fields are the filter's form values as hidden fields of a bulk action's form.
func (f jobFilter) Fields() [][2]string {
	var out [][2]string
	v := f.values()
	for _, k := range filterFields {
		if s := v.Get(k); s != "" {
			out = append(out, [2]string{k, s})
		}
	}
	return out
}

// Filtered reports whether any filter is set.
func (f jobFilter) Filtered() bool { return !f.f.Empty() }

type jobsData struct {
	Clock   clock
	Filter  jobFilter
	Page    *queue.JobPage
	States  []queue.State
	Actions []string
}

func (h *Handler) jobs(ctx context.Context, r *http.Request) (*page, error) {
	f, err := h.parseJobFilter(r.URL.Query())
	if err != nil {
		return nil, err
	}
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	pg, err := fenceq.ListJobs(ctx, h.cfg.DB, queue.ListParams{JobFilter: f.f, BeforeID: f.Before, Limit: h.cfg.PageSize})
	if err != nil {
		return nil, err
	}
	d := &jobsData{Clock: h.clockAt(now), Filter: f, Page: pg, States: queue.JobStates(), Actions: bulkActionNames}
	return &page{title: "Jobs", template: "jobs", nav: "/jobs", data: d}, nil
}

// LastError is the text of a job's last recorded error, "" when it has none.
func lastError(j *queue.JobRow) string {
	if len(j.Errors) == 0 {
		return ""
	}
	return j.Errors[len(j.Errors)-1].Error
}
