package fenceq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// ReportArgs are the arguments of a periodic "report" job.
type ReportArgs struct {
	Scope string `json:"scope"`
}

// Kind names the handler of ReportArgs jobs.
func (ReportArgs) Kind() string { return "report" }

// A schedule defined in code enqueues one job per slot, however many workers run it;
// each job's metadata names the schedule and the slot.
func ExampleNewPeriodicJob() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}

	type run struct {
		scope string
		slot  time.Time
	}
	runs := make(chan run, 16)
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[ReportArgs]) error {
		var meta struct {
			Periodic struct {
				Name string    `json:"name"`
				Slot time.Time `json:"slot"`
			} `json:"periodic"`
		}
		if err := json.Unmarshal(job.Metadata, &meta); err != nil {
			return err
		}
		runs <- run{scope: job.Args.Scope, slot: meta.Periodic.Slot}
		return nil
	}, nil)

	// Every second; a cron spec such as "30 2 * * *" with Timezone "Europe/Berlin"
	// works the same way.
	every := fenceq.NewPeriodicJob("report.each-second", "@every 1s", ReportArgs{Scope: "all"},
		&fenceq.PeriodicOpts{Missed: queue.MissedSkip})
	// Two workers define the same schedule; each slot is still enqueued once.
	var workers []*fenceq.Worker
	for range 2 {
		w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Periodic: []*fenceq.PeriodicJob{every},
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			log.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			log.Fatal(err)
		}
		workers = append(workers, w)
	}
	first, second := <-runs, <-runs
	if second.slot.Before(first.slot) { // the two workers may run them in either order
		first, second = second, first
	}
	for _, w := range workers {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := w.Stop(stopCtx); err != nil {
			log.Fatal(err)
		}
		cancel()
	}
	fmt.Println(first.scope, "then", second.scope, "- one second apart:", second.slot.Sub(first.slot) == time.Second)

	infos, err := fenceq.ListPeriodic(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(infos[0].Name, infos[0].Spec, infos[0].Source)
	// Output:
	// all then all - one second apart: true
	// report.each-second @every 1s code
}
