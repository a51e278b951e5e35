package fenceqweb

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// Bulk actions from the job list: on the jobs selected on a page (their ids) or on
// every job the list's filter matches. Both show a confirmation page with the count
// first. The confirmation carries the count and the highest id counted; the action then
// leaves out jobs enqueued since (BulkOptions.UpToID), counts again, and asks again only
// if the count grew by more than a tenth (and more than bulkRecountSlack jobs): acting
// on fewer jobs than confirmed (some finished, were deleted or changed state) is within
// what the operator agreed to, acting on many more is not.

// bulkActionNames are the actions, as the form names them.
var bulkActionNames = []string{"retry", "cancel", "requeue", "delete"}

// bulkCountCap bounds the count a confirmation shows: beyond it the page says "at
// least", and the action is confirmed on that lower bound.
const bulkCountCap = 100_000

// bulkRecountSlack is how many more jobs than confirmed an action may find without
// asking again, whatever the tenth.
const bulkRecountSlack = 10

type bulkConfirmData struct {
	Action  string
	Count   int
	AtLeast bool
	UpTo    int64
	// Changed is the count confirmed before, when the count grew and is asked again.
	Changed  int
	IDs      []int64
	Filter   jobFilter
	Describe []string
}

// Button is the label of the confirming button.
func (d *bulkConfirmData) Button() string {
	return fmt.Sprintf("%s %d job%s", map[string]string{"retry": "Retry", "cancel": "Cancel", "requeue": "Requeue",
		"delete": "Delete"}[d.Action], d.Count, plural(d.Count))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func (h *Handler) bulkJobs(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
	if err := r.ParseForm(); err != nil {
		return nil, nil, invalid("form", "%v", err)
	}
	action := r.PostForm.Get("action")
	if !slices.Contains(bulkActionNames, action) {
		return nil, nil, invalid("action", "%q is not one of %v", action, bulkActionNames)
	}
	var ids []int64
	for _, s := range r.PostForm["id"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id < 1 {
			return nil, nil, invalid("id", "%q is not a job id", s)
		}
		ids = append(ids, id)
	}
	var f jobFilter
	if r.PostForm.Get("scope") == "selected" {
		if len(ids) == 0 {
			return nil, nil, invalid("id", "no job selected: tick the jobs to act on")
		}
		f.f = queue.JobFilter{IDs: ids}
	} else {
		var err error
		if f, err = h.parseJobFilter(r.PostForm); err != nil {
			return nil, nil, err
		}
		if !f.Filtered() {
			return nil, nil, invalid("filter", "a bulk action needs a filter: it would act on every job")
		}
	}
	if err := f.f.Validate(); err != nil {
		return nil, nil, err
	}
	d := &bulkConfirmData{Action: action, IDs: ids, Filter: f, Describe: describeFilter(f, ids)}
	var upTo int64
	if confirmed(r) {
		n, err := strconv.Atoi(r.PostForm.Get("count"))
		if err != nil || n < 0 {
			return nil, nil, invalid("count", "%q is not a confirmed count", r.PostForm.Get("count"))
		}
		if upTo, err = strconv.ParseInt(r.PostForm.Get("upto"), 10, 64); err != nil || upTo < 0 {
			return nil, nil, invalid("upto", "%q is not a job id", r.PostForm.Get("upto"))
		}
		now, _, err := fenceq.CountMatching(ctx, h.cfg.DB, f.f, upTo, bulkCountCap)
		if err != nil {
			return nil, nil, err
		}
		if now > n+max(n/10, bulkRecountSlack) {
			d.Changed, d.Count, d.AtLeast, d.UpTo = n, now, now >= bulkCountCap, upTo
			return nil, &page{title: "Confirm bulk action", template: "bulkconfirm", nav: "/jobs", data: d}, nil
		}
		res, err := h.runBulk(ctx, action, f.f, &fenceq.BulkOptions{UpToID: upTo,
			Detail: fmt.Sprintf("confirmed %d job%s", n, plural(n))})
		if err != nil {
			return nil, nil, err
		}
		h.cfg.Logger.Info("dashboard: bulk action", "action", action, "actor", fenceq.ActorFrom(ctx),
			"matched", res.Matched, "changed", len(res.Changed), "skipped", res.Skipped)
		back := "jobs" + f.Link(0)
		if len(ids) > 0 {
			back = "jobs"
		}
		return &redirect{to: back, flash: "bulk-" + action}, nil, nil
	}
	n, top, err := fenceq.CountMatching(ctx, h.cfg.DB, f.f, 0, bulkCountCap)
	if err != nil {
		return nil, nil, err
	}
	d.Count, d.AtLeast, d.UpTo = n, n >= bulkCountCap, top
	return nil, &page{title: "Confirm bulk action", template: "bulkconfirm", nav: "/jobs", data: d}, nil
}

func (h *Handler) runBulk(ctx context.Context, action string, f queue.JobFilter, o *fenceq.BulkOptions) (*fenceq.BulkResult, error) {
	switch action {
	case "retry":
		return fenceq.RetryJobs(ctx, h.cfg.DB, f, o)
	case "cancel":
		return fenceq.CancelJobs(ctx, h.cfg.DB, f, o)
	case "requeue":
		return fenceq.RequeueJobs(ctx, h.cfg.DB, f, o)
	default:
		return fenceq.DeleteJobs(ctx, h.cfg.DB, f, o)
	}
}

// describeFilter says in words what a bulk action selects.
func describeFilter(f jobFilter, ids []int64) []string {
	if len(ids) > 0 {
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = strconv.FormatInt(id, 10)
		}
		return []string{"the selected jobs " + joinShort(s, 20)}
	}
	var out []string
	for _, kv := range f.Fields() {
		out = append(out, kv[0]+" = "+kv[1])
	}
	return out
}

func joinShort(s []string, n int) string {
	if len(s) <= n {
		return fmt.Sprint(s)
	}
	return fmt.Sprintf("%v and %d more", s[:n], len(s)-n)
}
