package fenceqweb

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func periodicSection() section {
	return section{name: "Periodic", path: "/periodic", routes: func(h *Handler, rt *router) {
		rt.page("GET /periodic", h.periodic)
		rt.action("POST /periodic/{name}/pause", h.pausePeriodic(true))
		rt.action("POST /periodic/{name}/resume", h.pausePeriodic(false))
		rt.action("POST /periodic/{name}/trigger", h.triggerPeriodic)
	}}
}

type periodicData struct {
	Clock     clock
	Schedules []fenceq.PeriodicInfo
}

// periodic lists the schedules with their next and last slot and lag, as
// `fenceq periodic list` does. The table is small (one row per schedule).
func (h *Handler) periodic(ctx context.Context, _ *http.Request) (*page, error) {
	now, err := h.dbNow(ctx)
	if err != nil {
		return nil, err
	}
	ss, err := fenceq.ListPeriodic(ctx, h.cfg.DB)
	if err != nil {
		return nil, err
	}
	return &page{title: "Periodic schedules", template: "periodic", nav: "/periodic",
		data: &periodicData{Clock: h.clockAt(now), Schedules: ss}}, nil
}

// schedule reads the schedule an action names, so that an unknown name is a 404 and a
// bad one a 400 before anything is written.
func (h *Handler) schedule(ctx context.Context, r *http.Request) (*fenceq.PeriodicInfo, error) {
	name := r.PathValue("name")
	if err := queue.ValidateName("name", name, queue.MaxPeriodicNameLen); err != nil {
		return nil, err
	}
	return fenceq.GetPeriodic(ctx, h.cfg.DB, name)
}

func (h *Handler) pausePeriodic(paused bool) actionFunc {
	return func(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
		s, err := h.schedule(ctx, r)
		if err != nil {
			return nil, nil, err
		}
		if paused && !confirmed(r) {
			return nil, confirmPage("Pause schedule", confirmData{
				Heading: fmt.Sprintf("Pause schedule %s?", s.Name),
				Lines: []string{"No slot of a paused schedule is enqueued, by any worker, until it is resumed.",
					"Resuming passes over the slots of the pause: it does not catch them up."},
				Action: "periodic/" + s.Name + "/pause", Button: "Pause the schedule", Back: "periodic"}), nil
		}
		setPaused := fenceq.ResumePeriodic
		if paused {
			setPaused = fenceq.PausePeriodic
		}
		if _, err := setPaused(ctx, h.cfg.DB, s.Name); err != nil {
			return nil, nil, err
		}
		flash := "periodic-resumed"
		if paused {
			flash = "periodic-paused"
		}
		h.cfg.Logger.Info("dashboard: "+flash, "schedule", s.Name)
		return &redirect{to: "periodic", flash: flash}, nil, nil
	}
}

// triggerPeriodic enqueues one job of the schedule now, outside its slots, and shows it.
func (h *Handler) triggerPeriodic(ctx context.Context, _ http.ResponseWriter, r *http.Request) (*redirect, *page, error) {
	s, err := h.schedule(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	// A schedule whose stored spec, zone or kind no longer holds (a row written by hand
	// or by another version) enqueues nothing on its slots; running it by hand is
	// refused as well, with the reason.
	if s.Error != "" {
		return nil, nil, &httpError{status: http.StatusConflict,
			msg: fmt.Sprintf("schedule %s cannot run: its spec does not parse: %s", s.Name, s.Error)}
	}
	if err := queue.ValidateKind(s.Kind); err != nil {
		return nil, nil, &httpError{status: http.StatusConflict,
			msg: fmt.Sprintf("schedule %s cannot run: its kind is not valid: %v", s.Name, err)}
	}
	if err := queue.ValidateQueue(s.Queue); err != nil {
		return nil, nil, &httpError{status: http.StatusConflict,
			msg: fmt.Sprintf("schedule %s cannot run: its queue is not valid: %v", s.Name, err)}
	}
	if !confirmed(r) {
		return nil, confirmPage("Trigger schedule", confirmData{
			Heading: fmt.Sprintf("Run schedule %s now?", s.Name),
			Lines: []string{fmt.Sprintf("One %s job is enqueued on queue %s now, marked as triggered.", s.Kind, s.Queue),
				"The schedule's slots are unchanged."},
			Action: "periodic/" + s.Name + "/trigger", Button: "Enqueue a job now", Back: "periodic"}), nil
	}
	job, err := fenceq.TriggerPeriodic(ctx, h.cfg.DB, s.Name)
	if err != nil {
		return nil, nil, err
	}
	h.cfg.Logger.Info("dashboard: periodic schedule triggered", "schedule", s.Name, "job_id", job.ID)
	return &redirect{to: "jobs/" + strconv.FormatInt(job.ID, 10), flash: "periodic-triggered"}, nil, nil
}
