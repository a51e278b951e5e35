package fenceqweb

import (
	"context"
	"net/http"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/queue"
)

// overviewWindow is how far back the overview's chart and finished counts look, in
// overviewBuckets intervals.
const (
	overviewWindow  = time.Hour
	overviewBuckets = 60
	overviewEvents  = 12
	// countersStale is how old the job counters' last roll-up may be before a page that
	// reads them runs one itself: workers roll up every ReaperInterval (5 s by default),
	// so a dashboard beside running workers leaves it to them.
	countersStale = 15 * time.Second
)

func overviewSection() section {
	return section{name: "Overview", path: "/", routes: func(h *Handler, rt *router) {
		rt.page("GET /{$}", h.overview)
	}}
}

type overviewData struct {
	Clock  clock
	Health *health.Report
	Counts *queue.QueueCounts
	// Totals sums the queues: unfinished by state, and finished within the window.
	Totals      map[queue.State]int64
	Unfinished  []queue.State
	Final       []queue.State
	Chart       chart
	Window      time.Duration
	Events      []queue.LeaseEvent
	EventCounts map[queue.LeaseEventKind]int64
	EventKinds  []queue.LeaseEventKind
	Workers     int
	// Errors are the errors per kind over the window: discarded jobs and the failed
	// attempts of finished jobs, from the counters.
	Errors []queue.KindErrors
	// Counters says how far the counters of finished jobs have been rolled up.
	Counters queue.CountersState
}

func (h *Handler) overview(ctx context.Context, _ *http.Request) (*page, error) {
	db := h.cfg.DB
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	d := &overviewData{Clock: h.clockAt(now), Window: overviewWindow, Unfinished: queue.UnfinishedStates(),
		Final: queue.FinalStates(), EventKinds: queue.LeaseEventKinds(), Totals: map[queue.State]int64{}}
	if d.Counters, err = h.freshCounters(ctx); err != nil {
		return nil, err
	}
	if d.Health, err = health.Check(ctx, db, h.cfg.Health); err != nil {
		return nil, err
	}
	if d.Counts, err = fenceq.CountJobs(ctx, db, queue.CountParams{Window: overviewWindow}); err != nil {
		return nil, err
	}
	for _, q := range d.Counts.Queues {
		for st, n := range q.Unfinished {
			d.Totals[st] += n
		}
		for st, n := range q.Finished {
			d.Totals[st] += n
		}
	}
	tp, err := fenceq.JobThroughput(ctx, db, queue.CountParams{Window: overviewWindow}, overviewBuckets)
	if err != nil {
		return nil, err
	}
	d.Chart = buildChart(tp, h.cfg.Location)
	if d.Errors, err = fenceq.CountErrorsByKind(ctx, db, overviewWindow); err != nil {
		return nil, err
	}
	if d.EventCounts, err = fenceq.CountLeaseEvents(ctx, db, overviewWindow); err != nil {
		return nil, err
	}
	if d.Events, err = fenceq.ListLeaseEvents(ctx, db, 0, overviewEvents); err != nil {
		return nil, err
	}
	ws, err := fenceq.ListWorkers(ctx, db)
	if err != nil {
		return nil, err
	}
	d.Workers = len(ws)
	return &page{title: "Overview", template: "overview", nav: "/", data: d}, nil
}

// freshCounters returns the state of the job counters, after rolling them up when no
// roll-up ran within countersStale (no worker runs, or none is up to date). A roll-up
// that fails, for a role that may not write fenceq's tables, is logged and the counters
// are shown as they are.
func (h *Handler) freshCounters(ctx context.Context) (queue.CountersState, error) {
	if _, err := fenceq.RollupJobCountsIfStale(ctx, h.cfg.DB, countersStale); err != nil {
		h.cfg.Logger.Warn("dashboard: job counter roll-up failed; counts of finished jobs may be behind", "err", err)
	}
	return fenceq.JobCountersState(ctx, h.cfg.DB)
}

// IsCapped reports whether a state's count stopped at the cap (a lower bound).
func (d *overviewData) IsCapped(st queue.State) bool {
	for _, c := range d.Counts.Capped {
		if c == st {
			return true
		}
	}
	return false
}
