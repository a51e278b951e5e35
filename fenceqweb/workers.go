package fenceqweb

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// maxLeasesShown bounds the running jobs the workers page reads.
const maxLeasesShown = 2000

func workersSection() section {
	return section{name: "Workers", path: "/workers", routes: func(h *Handler, rt *router) {
		rt.page("GET /workers", h.workers)
	}}
}

type workerRow struct {
	queue.WorkerInfo
	Leases []*queue.JobRow
}

type workersData struct {
	Clock   clock
	Workers []workerRow
	// Orphans are running jobs whose holder has no fenceq_workers row: it stopped
	// without deregistering (a crash), and the reaper revokes them once they expire.
	Orphans []*queue.JobRow
	// Truncated is true when more than maxLeasesShown jobs run.
	Truncated bool
}

// lateHeartbeat is the heartbeat age from which a worker is shown as late: a whole
// default lease (fenceq.Config.LeaseDuration) without a heartbeat, which workers send
// every third of a lease.
const lateHeartbeat = time.Minute

// Late reports whether the worker's last heartbeat is older than lateHeartbeat.
func (w workerRow) Late() bool { return w.HeartbeatAge > lateHeartbeat }

func (h *Handler) workers(ctx context.Context, _ *http.Request) (*page, error) {
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	ws, err := fenceq.ListWorkers(ctx, h.cfg.DB)
	if err != nil {
		return nil, err
	}
	listed, err := fenceq.ListJobs(ctx, h.cfg.DB, queue.ListParams{JobFilter: queue.JobFilter{State: queue.StateRunning}, Limit: maxLeasesShown + 1})
	if err != nil {
		return nil, err
	}
	running := listed.Jobs
	d := &workersData{Clock: h.clockAt(now), Truncated: len(running) > maxLeasesShown}
	if d.Truncated {
		running = running[:maxLeasesShown]
	}
	byHolder := map[string][]*queue.JobRow{}
	for _, j := range running {
		byHolder[deref(j.LeasedBy)] = append(byHolder[deref(j.LeasedBy)], j)
	}
	for _, w := range ws {
		d.Workers = append(d.Workers, workerRow{WorkerInfo: w, Leases: byHolder[w.ID]})
		delete(byHolder, w.ID)
	}
	for _, js := range byHolder {
		d.Orphans = append(d.Orphans, js...)
	}
	slices.SortFunc(d.Orphans, func(a, b *queue.JobRow) int { return cmp.Compare(b.ID, a.ID) })
	return &page{title: "Workers", template: "workers", nav: "/workers", data: d}, nil
}
