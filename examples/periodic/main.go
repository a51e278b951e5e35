// Command periodic runs a periodic job: a schedule that fires every second enqueues one
// job per slot, and the program exits 0 after the first of them has run. The schedule
// lives in the database; the program removes it before it exits.
//
// DATABASE_URL names the database (add ?search_path=SCHEMA for a schema of its own).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
)

// TickArgs are the arguments of a "tick" job.
type TickArgs struct {
	Message string `json:"message"`
}

// Kind names the handler of TickArgs jobs.
func (TickArgs) Kind() string { return "tick" }

// scheduleName names the schedule in fenceq_periodic, the CLI and the dashboard.
const scheduleName = "example.tick"

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	check(err)
	defer pool.Close()
	check(migrations.Up(ctx, pool))

	slots := make(chan string, 1)
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[TickArgs]) error {
		// The job's metadata names its schedule and the slot it was enqueued for.
		var meta struct {
			Periodic struct {
				Name string    `json:"name"`
				Slot time.Time `json:"slot"`
			} `json:"periodic"`
		}
		if err := json.Unmarshal(job.Metadata, &meta); err != nil {
			return err
		}
		select { // the program reads the first run only
		case slots <- fmt.Sprintf("%s %s for slot %s", meta.Periodic.Name, job.Args.Message, meta.Periodic.Slot.Format(time.RFC3339)):
		default:
		}
		return nil
	}, nil)

	// "@every 1s" fires at every whole second; a cron spec such as "30 2 * * *" with
	// Timezone "Europe/Berlin" works the same way. A slot is enqueued once, however
	// many workers define the schedule.
	tick := fenceq.NewPeriodicJob(scheduleName, "@every 1s", TickArgs{Message: "ran"}, nil)
	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Periodic: []*fenceq.PeriodicJob{tick}})
	check(err)
	check(w.Start(ctx))

	select {
	case first := <-slots:
		fmt.Println(first)
	case <-ctx.Done():
		log.Fatalf("no run of %s: %v", scheduleName, ctx.Err())
	}
	check(w.Stop(ctx))
	// A schedule defined in code is written to the database at every start of a worker
	// that defines it, and any worker enqueues its jobs: remove it so that workers
	// without a "tick" handler do not keep enqueueing jobs they cannot run.
	_, err = fenceq.RemovePeriodic(ctx, pool, scheduleName)
	check(err)
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
