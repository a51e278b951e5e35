package fenceqweb

import (
	"context"
	"errors"
	"net/http"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/queue"
)

func idempotencySection() section {
	return section{name: "Idempotency keys", path: "/idempotency", routes: func(h *Handler, rt *router) {
		rt.page("GET /idempotency", h.idempotency)
	}}
}

type idempotencyData struct {
	Clock  clock
	Scope  string
	Key    string
	Asked  bool
	Record *idempotency.Record
	// Missing is true when the look-up found no such key.
	Missing bool
}

func (h *Handler) idempotency(ctx context.Context, r *http.Request) (*page, error) {
	q := r.URL.Query()
	d := &idempotencyData{Scope: q.Get("scope"), Key: q.Get("key")}
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	d.Clock = h.clockAt(now)
	if d.Scope != "" || d.Key != "" {
		d.Asked = true
		if err := queue.ValidateName("scope", d.Scope, idempotency.MaxScopeLen); err != nil {
			return nil, err
		}
		if err := queue.ValidateUniqueKey("key", d.Key); err != nil {
			return nil, err
		}
		rec, err := idempotency.Get(ctx, h.cfg.DB, d.Scope, d.Key)
		switch {
		case errors.Is(err, queue.ErrNotFound):
			d.Missing = true
		case err != nil:
			return nil, err
		default:
			d.Record = rec
		}
	}
	return &page{title: "Idempotency keys", template: "idempotency", nav: "/idempotency", data: d}, nil
}
