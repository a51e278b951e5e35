package fenceq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// StepArgs are the arguments of one step of the examples' workflows.
type StepArgs struct {
	Step string `json:"step"`
}

// Kind names the handler of StepArgs jobs.
func (StepArgs) Kind() string { return "step" }

// waitFinished polls the job until it has reached a final state.
func waitFinished(ctx context.Context, pool *pgxpool.Pool, id int64) *queue.JobRow {
	for {
		j, err := fenceq.GetJob(ctx, pool, id)
		if err != nil {
			log.Fatal(err)
		}
		if j.State.Final() {
			return j
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A workflow fans out from "fetch" to two tasks and back in to "report", which reads
// its dependencies' outputs. Each task starts only once every task it runs after has
// completed.
func ExampleWorkflow() {
	ctx := context.Background()
	pool, cleanup := flowExampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[StepArgs]) error {
		out := job.Args.Step
		if job.Args.Step == "report" {
			var a, b string
			if err := job.DependencyOutput(ctx, "resize", &a); err != nil {
				return err
			}
			if err := job.DependencyOutput(ctx, "scan", &b); err != nil {
				return err
			}
			out = "report of " + a + " and " + b
		}
		return fenceq.RecordOutput(ctx, out)
	}, nil)

	wf := fenceq.NewWorkflow("upload").
		Add("fetch", StepArgs{Step: "fetch"}, nil).
		Add("resize", StepArgs{Step: "resize"}, &fenceq.TaskOpts{After: []string{"fetch"}}).
		Add("scan", StepArgs{Step: "scan"}, &fenceq.TaskOpts{After: []string{"fetch"}}).
		Add("report", StepArgs{Step: "report"}, &fenceq.TaskOpts{After: []string{"resize", "scan"}})
	res, err := wf.Enqueue(ctx, pool) // one transaction; pass a pgx.Tx to make it yours
	if err != nil {
		log.Fatal(err)
	}
	stop := startExampleWorker(ctx, pool, hs)
	defer stop()
	report := waitFinished(ctx, pool, res.Jobs["report"])
	fmt.Println(report.State, string(report.Output))
	// Output:
	// completed "report of resize and scan"
}

// A batch's callback runs once, after every job of the batch has finished, with the
// counts of their final states.
func ExampleBatch() {
	ctx := context.Background()
	pool, cleanup := flowExampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[StepArgs]) error {
		if job.Args.Step == "done" {
			c, _ := fenceq.BatchOutcome(job.JobRow)
			return fenceq.RecordOutput(ctx, fmt.Sprintf("%d sent, %d failed", c.Completed, c.Discarded))
		}
		if strings.HasPrefix(job.Args.Step, "bad") {
			return fenceq.JobDiscard(errors.New("no such address"))
		}
		return nil
	}, nil)
	b := fenceq.NewBatch("newsletter", StepArgs{Step: "done"}, nil)
	for _, to := range []string{"ann", "bob", "bad-cid", "dee"} {
		b.Add(StepArgs{Step: to}, nil)
	}
	res, err := b.Enqueue(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	stop := startExampleWorker(ctx, pool, hs)
	defer stop()
	done := waitFinished(ctx, pool, res.CallbackID)
	fmt.Println(done.State, string(done.Output))
	// Output:
	// completed "3 sent, 1 failed"
}

// A handler waits for an approval signal holding no lease and no worker slot; the
// signal, sent from any process in its own transaction, wakes it once.
func ExampleWaitForSignal() {
	ctx := context.Background()
	pool, cleanup := flowExampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	type approval struct {
		By string `json:"by"`
	}
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[StepArgs]) error {
		var a approval
		err := job.Signal(ctx, "approved", &a)
		switch {
		case errors.Is(err, fenceq.ErrNoSignal):
			return fenceq.WaitForSignal("approved", 24*time.Hour)
		case errors.Is(err, fenceq.ErrSignalTimeout):
			return fenceq.RecordOutput(ctx, "escalated")
		case err != nil:
			return err
		}
		return fenceq.RecordOutput(ctx, "approved by "+a.By)
	}, nil)
	stop := startExampleWorker(ctx, pool, hs)
	defer stop()
	res, err := fenceq.Enqueue(ctx, pool, StepArgs{Step: "refund"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	for { // until the job waits: scheduled at its timeout (pending, for a wait without one)
		j, err := fenceq.GetJob(ctx, pool, res.Job.ID)
		if err != nil {
			log.Fatal(err)
		}
		if j.State == queue.StateScheduled {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	r, err := fenceq.SendSignal(ctx, pool, res.Job.ID, "approved", approval{By: "ops"})
	if err != nil {
		log.Fatal(err)
	}
	done := waitFinished(ctx, pool, res.Job.ID)
	fmt.Println(r, done.State, string(done.Output))
	// Output:
	// delivered completed "approved by ops"
}
