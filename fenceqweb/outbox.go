package fenceqweb

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/fenceq/fenceq/outbox"
)

func outboxSection() section {
	return section{name: "Outbox", path: "/outbox", routes: func(h *Handler, rt *router) {
		rt.page("GET /outbox", h.outbox)
		rt.action("POST /outbox/{id}/retry", h.retryOutbox)
	}}
}

type outboxData struct {
	Clock   clock
	Backlog outbox.Backlog
	// State is the tab shown: a row state, or "" for every row.
	State  string
	States []outbox.State
	Rows   []*outbox.Row
	// Next is the before id of the next, older page; 0 when none.
	Next   int64
	Before int64
}

// Retryable reports whether Retry applies to the row: failed, or pending with no
// unfinished delivery job (an orphan).
func (d *outboxData) Retryable(o *outbox.Row) bool {
	if o.State == outbox.StateFailed {
		return true
	}
	return o.State == outbox.StatePending && (o.DeliveryJobState == "" || o.DeliveryJobState.Final())
}

func (h *Handler) outbox(ctx context.Context, r *http.Request) (*page, error) {
	q := r.URL.Query()
	st := outbox.State(q.Get("state"))
	if !q.Has("state") {
		st = outbox.StatePending
	}
	if st == "all" {
		st = ""
	}
	if st != "" && !st.Valid() {
		return nil, invalid("state", "%q is not an outbox state", st)
	}
	var before int64
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return nil, invalid("before", "%q is not an outbox row id", s)
		}
		before = n
	}
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	backlog, err := outbox.Stats(ctx, h.cfg.DB)
	if err != nil {
		return nil, err
	}
	rows, err := outbox.List(ctx, h.cfg.DB, outbox.ListParams{State: st, BeforeID: before, Limit: h.cfg.PageSize + 1})
	if err != nil {
		return nil, err
	}
	d := &outboxData{Clock: h.clockAt(now), Backlog: backlog, State: string(st), States: outbox.States(),
		Rows: rows, Before: before}
	if len(rows) > h.cfg.PageSize {
		d.Rows = rows[:h.cfg.PageSize]
		d.Next = d.Rows[len(d.Rows)-1].ID
	}
	return &page{title: "Outbox", template: "outbox", nav: "/outbox", data: d}, nil
}

func (h *Handler) retryOutbox(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
	id, err := pathID(r, "id", "outbox row")
	if err != nil {
		return nil, nil, err
	}
	if _, err := outbox.Retry(ctx, h.cfg.DB, id); err != nil {
		return nil, nil, explainWrongState(err, "; only failed rows and pending rows no job will deliver can be retried")
	}
	h.cfg.Logger.Info("dashboard: outbox row retried", "outbox_id", id)
	return &redirect{to: fmt.Sprintf("outbox?state=%s", outbox.StatePending), flash: "outbox-retried"}, nil, nil
}
