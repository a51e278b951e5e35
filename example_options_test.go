package fenceq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// DigestArgs are the arguments of a digest job: one per customer and hour, even once it
// ran.
type DigestArgs struct {
	CustomerID int64  `json:"customer_id" unique:"true"`
	Requester  string `json:"requester"` // not part of the uniqueness
}

// Kind names the handler of DigestArgs jobs.
func (DigestArgs) Kind() string { return "digest" }

// Jobs unique by their tagged args, per hour of run_at, and while completed too: a second
// enqueue returns the first job; a batch skips its duplicates.
func ExampleUniqueOpts() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	opts := &fenceq.InsertOpts{Unique: queue.UniqueOpts{
		ByArgs:   true,      // the fields tagged unique:"true": customer_id
		ByPeriod: time.Hour, // one per hour of run_at, by the database's clock
		ByState:  append(queue.UnfinishedStates(), queue.StateCompleted),
	}}
	first, err := fenceq.Enqueue(ctx, pool, DigestArgs{CustomerID: 7, Requester: "ann"}, opts)
	if err != nil {
		log.Fatal(err)
	}
	again, err := fenceq.Enqueue(ctx, pool, DigestArgs{CustomerID: 7, Requester: "bob"}, opts)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("second enqueue returns the first job:", again.Existing && again.Job.ID == first.Job.ID)
	n, err := fenceq.EnqueueMany(ctx, pool, []fenceq.EnqueueItem{
		{Args: DigestArgs{CustomerID: 7}, Opts: opts}, // held by the first job
		{Args: DigestArgs{CustomerID: 8}, Opts: opts},
		{Args: DigestArgs{CustomerID: 8}, Opts: opts}, // a duplicate inside the batch
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("batch inserted:", n)
	fmt.Println("holds its key while:", first.Job.UniqueStates)
	// Output:
	// second enqueue returns the first job: true
	// batch inserted: 1
	// holds its key while: [available scheduled running retryable completed pending]
}

// Tags label jobs; operators find them with `fenceq jobs list --tag T`, code with
// fenceq.ListJobs.
func ExampleInsertOpts_tags() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	for _, tags := range [][]string{{"tenant-42", "import"}, {"tenant-7"}, {"tenant-42"}} {
		if _, err := fenceq.Enqueue(ctx, pool, GreetArgs{Name: "x"}, &fenceq.InsertOpts{Tags: tags}); err != nil {
			log.Fatal(err)
		}
	}
	jobs, err := store.ListJobs(ctx, pool, queue.ListParams{JobFilter: queue.JobFilter{Tag: "tenant-42"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, j := range jobs {
		fmt.Println(j.ID, j.Tags)
	}
	_, err = fenceq.Enqueue(ctx, pool, GreetArgs{}, &fenceq.InsertOpts{Tags: []string{"no spaces"}})
	fmt.Println(errors.Is(err, queue.ErrInvalid))
	// Output:
	// 3 [tenant-42]
	// 1 [tenant-42 import]
	// true
}

// FlakyArgs are the arguments of a job whose retries follow a schedule of its own.
type FlakyArgs struct{}

// Kind names the handler of FlakyArgs jobs.
func (FlakyArgs) Kind() string { return "flaky" }

// A kind decides when it is retried: NextRetry returns an instant computed from the
// row's times, and the database schedules the retry at that instant by its own clock.
func ExampleHandlerOpts_nextRetry() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	failed := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[FlakyArgs]) error {
		defer close(failed)
		return errors.New("upstream is down")
	}, &fenceq.HandlerOpts{NextRetry: func(job *queue.JobRow) time.Time {
		// Ten minutes per attempt so far, from the start of this attempt.
		return job.AttemptedAt.Add(time.Duration(job.Attempt) * 10 * time.Minute)
	}})
	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	res, err := fenceq.Enqueue(ctx, pool, FlakyArgs{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	<-failed
	if err := w.Stop(ctx); err != nil { // waits for the failure to be written
		log.Fatal(err)
	}
	j, err := store.GetJob(ctx, pool, res.Job.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(j.State, "in", j.RunAt.Sub(*j.AttemptedAt), "from the attempt")
	// Output: retryable in 10m0s from the attempt
}

// Queues are added, resized and removed on a running worker.
func ExampleWorker_AddQueue() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	done := make(chan string, 1)
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		done <- job.Queue
		return nil
	}, nil)
	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = w.Stop(ctx) }()

	if err := w.AddQueue(ctx, "mail", fenceq.QueueConfig{MaxWorkers: 5}); err != nil {
		log.Fatal(err)
	}
	if _, err := fenceq.Enqueue(ctx, pool, GreetArgs{Name: "x"}, &fenceq.InsertOpts{Queue: "mail"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("worked in", <-done)
	if err := w.SetQueueConcurrency("mail", 20); err != nil { // from the next claim on
		log.Fatal(err)
	}
	// Claiming stops; jobs still running finish, their leases renewed until they do.
	if err := w.RemoveQueue(ctx, "default"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(w.Queues(), w.Config().Queues["mail"].MaxWorkers)
	// Output:
	// worked in mail
	// [mail] 20
}
