package fenceqweb

import (
	"context"
	"net/http"
	"strconv"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// flowPartitionLimit bounds the partitions the flow page shows: the busiest.
const flowPartitionLimit = 50

func flowSection() section {
	return section{name: "Flow", path: "/flow", routes: func(h *Handler, rt *router) {
		rt.page("GET /flow", h.flow)
	}}
}

type flowData struct {
	Clock  clock
	Limits []queue.FlowLimit
	// Partitions are the busiest partitions of every limit, at most flowPartitionLimit;
	// Truncated is set when there may be more.
	Partitions []queue.FlowPartition
	Truncated  bool
	// ByName finds a partition's limit.
	ByName map[string]queue.FlowLimit
}

// Running shows a partition's running count against its limit's maximum ("1 / 2"), as
// `fenceq flow show` does.
func (d *flowData) Running(p queue.FlowPartition) string { return flowRunning(p, d.ByName[p.Limit]) }

// flow lists the flow limits and their busiest partitions, read-only: limits are set
// by code and by `fenceq flow set`.
func (h *Handler) flow(ctx context.Context, _ *http.Request) (*page, error) {
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	ls, err := fenceq.ListFlowLimits(ctx, h.cfg.DB)
	if err != nil {
		return nil, err
	}
	d := &flowData{Clock: h.clockAt(now), Limits: ls, ByName: make(map[string]queue.FlowLimit, len(ls))}
	for _, l := range ls {
		d.ByName[l.Name] = l
	}
	if len(ls) > 0 {
		if d.Partitions, err = fenceq.FlowPartitions(ctx, h.cfg.DB, "", flowPartitionLimit+1); err != nil {
			return nil, err
		}
		if len(d.Partitions) > flowPartitionLimit {
			d.Partitions, d.Truncated = d.Partitions[:flowPartitionLimit], true
		}
	}
	return &page{title: "Flow limits", template: "flow", nav: "/flow", data: d}, nil
}

// flowRunning is a partition's running count, over its limit's maximum when it has one
// (a sequence's is 1).
func flowRunning(p queue.FlowPartition, l queue.FlowLimit) string {
	switch {
	case l.MaxRunning > 0:
		return strconv.Itoa(p.Running) + " / " + strconv.Itoa(l.MaxRunning)
	case l.Sequence:
		return strconv.Itoa(p.Running) + " / 1"
	}
	return strconv.Itoa(p.Running)
}
