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

// SearchIndexArgs are the arguments of a "search.index" job: reindex one document.
type SearchIndexArgs struct {
	Doc      int `json:"doc"`
	Revision int `json:"revision"`
}

// Kind names the handler of SearchIndexArgs jobs.
func (SearchIndexArgs) Kind() string { return "search.index" }

// A burst of edits to one document enqueues one reindex: each enqueue with the same
// debounce key replaces the waiting job's args and moves its run time to the end of the
// window, so only the latest revision is indexed, once the edits stop for 30 seconds.
func ExampleInsertOpts_debounce() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	opts := &fenceq.InsertOpts{Debounce: queue.DebounceOpts{Key: "doc-42", Window: 30 * time.Second}}
	var first int64
	for rev := 1; rev <= 3; rev++ {
		res, err := fenceq.Enqueue(ctx, pool, SearchIndexArgs{Doc: 42, Revision: rev}, opts)
		if err != nil {
			log.Fatal(err)
		}
		if rev == 1 {
			first = res.Job.ID
		}
		fmt.Printf("revision %d: same job %t, replaced %t, %s, waits at least 30s: %t\n", rev,
			res.Job.ID == first, res.Debounced, res.Job.State, res.Job.RunAt.Sub(res.Job.CreatedAt) >= 30*time.Second)
	}
	j, err := fenceq.GetJob(ctx, pool, first)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("waiting job's args:", string(j.EncodedArgs))
	// Output:
	// revision 1: same job true, replaced false, scheduled, waits at least 30s: true
	// revision 2: same job true, replaced true, scheduled, waits at least 30s: true
	// revision 3: same job true, replaced true, scheduled, waits at least 30s: true
	// waiting job's args: {"doc": 42, "revision": 3}
}

// ExportArgs are the arguments of an "export" job that may take longer than its
// schedule's period.
type ExportArgs struct{}

// Kind names the handler of ExportArgs jobs.
func (ExportArgs) Kind() string { return "export" }

// A schedule with NoOverlap skips the slots that fall due while its previous run is
// unfinished: here every second, while the first export takes until the schedule has
// skipped two slots. The next export runs for a slot after it completed.
func ExamplePeriodicOpts_noOverlap() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	// Each export reports its slot; the first also reports the newest slot skipped
	// while it ran.
	type exportRun struct{ slot, skippedWhileRunning time.Time }
	exports := make(chan exportRun, 16)
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[ExportArgs]) error {
		var meta struct {
			Periodic struct {
				Slot time.Time `json:"slot"`
			} `json:"periodic"`
		}
		if err := json.Unmarshal(job.Metadata, &meta); err != nil {
			return err
		}
		e := exportRun{slot: meta.Periodic.Slot}
		if len(exports) == 0 { // the first export: slow, until two slots were skipped
			for {
				info, err := fenceq.GetPeriodic(ctx, pool, "export")
				if err != nil {
					return err
				}
				if info.SkippedSlots >= 2 {
					e.skippedWhileRunning = *info.LastSkippedSlot
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		exports <- e
		return nil
	}, nil)
	export := fenceq.NewPeriodicJob("export", "@every 1s", ExportArgs{}, &fenceq.PeriodicOpts{NoOverlap: true})
	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Periodic: []*fenceq.PeriodicJob{export},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	first, second := <-exports, <-exports
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("the first export ran while slots were skipped:", first.skippedWhileRunning.After(first.slot))
	fmt.Println("the second export's slot came after them:", second.slot.After(first.skippedWhileRunning))
	// Output:
	// the first export ran while slots were skipped: true
	// the second export's slot came after them: true
}
