package fenceqweb

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func queuesSection() section {
	return section{name: "Queues", path: "/queues", routes: func(h *Handler, rt *router) {
		rt.page("GET /queues", h.queues)
		rt.action("POST /queues/{name}/pause", h.pauseQueue(true))
		rt.action("POST /queues/{name}/resume", h.pauseQueue(false))
	}}
}

// queueRow is one queue with what is known of its concurrency: the workers that serve
// it (fenceq_workers.queues) and the jobs running on it now. A worker's per-queue limit
// is its own configuration and is not recorded in the database.
type queueRow struct {
	queue.QueueCount
	Workers []string
}

type queuesData struct {
	Clock      clock
	Queues     []queueRow
	Unfinished []queue.State
	Final      []queue.State
	Capped     []queue.State
	Window     string
	// Counters says how far the counters of finished jobs have been rolled up.
	Counters queue.CountersState
}

func (h *Handler) queues(ctx context.Context, _ *http.Request) (*page, error) {
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	cs, err := h.freshCounters(ctx)
	if err != nil {
		return nil, err
	}
	counts, err := fenceq.CountJobs(ctx, h.cfg.DB, queue.CountParams{Window: overviewWindow})
	if err != nil {
		return nil, err
	}
	ws, err := fenceq.ListWorkers(ctx, h.cfg.DB)
	if err != nil {
		return nil, err
	}
	served := map[string][]string{}
	for _, w := range ws {
		for _, q := range w.Queues {
			served[q] = append(served[q], w.ID)
		}
	}
	d := &queuesData{Clock: h.clockAt(now), Unfinished: queue.UnfinishedStates(), Final: queue.FinalStates(),
		Capped: counts.Capped, Window: "1h", Counters: cs}
	seen := map[string]bool{}
	for _, q := range counts.Queues {
		seen[q.Name] = true
		d.Queues = append(d.Queues, queueRow{QueueCount: q, Workers: served[q.Name]})
	}
	// A queue that workers serve but that has no jobs and no settings yet.
	for name, ids := range served {
		if !seen[name] {
			d.Queues = append(d.Queues, queueRow{QueueCount: queue.QueueCount{Name: name,
				Unfinished: map[queue.State]int64{}, Finished: map[queue.State]int64{}}, Workers: ids})
		}
	}
	slices.SortFunc(d.Queues, func(a, b queueRow) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return &page{title: "Queues", template: "queues", nav: "/queues", data: d}, nil
}

func (h *Handler) pauseQueue(paused bool) actionFunc {
	return func(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
		name := r.PathValue("name")
		// PauseQueue would create a settings row for any name; the dashboard acts only
		// on queues in use (those its pages list), so a mistyped or forged URL creates
		// no queue.
		known, err := fenceq.QueueExists(ctx, h.cfg.DB, name, overviewWindow)
		if err != nil {
			return nil, nil, err
		}
		if !known {
			return nil, nil, &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no queue %q: no job, worker or settings use it", name)}
		}
		if paused && !confirmed(r) {
			return nil, confirmPage("Pause queue", confirmData{
				Heading: fmt.Sprintf("Pause queue %s?", name),
				Lines: []string{"Workers claim nothing from a paused queue until it is resumed; jobs already running continue.",
					"Jobs enqueued meanwhile wait."},
				Action: "queues/" + name + "/pause", Button: "Pause the queue", Back: "queues"}), nil
		}
		setPaused := fenceq.ResumeQueue
		if paused {
			setPaused = fenceq.PauseQueue
		}
		if err := setPaused(ctx, h.cfg.DB, name); err != nil {
			return nil, nil, err
		}
		flash := "resumed"
		if paused {
			flash = "paused"
		}
		h.cfg.Logger.Info("dashboard: queue "+flash, "queue", name)
		back := "queues"
		if r.PostFormValue("back") == "overview" {
			back = ""
		}
		return &redirect{to: back, flash: flash}, nil, nil
	}
}
