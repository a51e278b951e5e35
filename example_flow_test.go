package fenceq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// SyncArgs are the arguments of a job that syncs one customer's account with a partner.
type SyncArgs struct {
	CustomerID int64 `json:"customer_id"`
	Page       int   `json:"page"`
}

// Kind names the handler of SyncArgs jobs.
func (SyncArgs) Kind() string { return "sync" }

// flowExampleSchema is exampleSchema for the flow, workflow, batch and signal examples.
// On a Citus coordinator the schema is created with schema-based sharding off, so that
// its tables stay local to the coordinator: flow limits, dependencies, batches and
// signals keep their state with triggers, which a distributed table cannot have, and
// fenceq refuses them on a distributed schema.
func flowExampleSchema(ctx context.Context) (*pgxpool.Pool, func()) {
	return newExampleSchema(ctx, true)
}

// startExampleWorker starts a worker with hs and the flow limits, and returns its stop.
func startExampleWorker(ctx context.Context, pool *pgxpool.Pool, hs *fenceq.Handlers, limits ...queue.FlowLimit) func() {
	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, FlowLimits: limits,
		ReaperInterval: 100 * time.Millisecond, Backoff: queue.Backoff{Base: time.Millisecond, Max: time.Millisecond},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := w.Stop(stopCtx); err != nil {
			log.Fatal(err)
		}
	}
}

// A concurrency limit: at most one sync runs per customer, across every worker, while
// the worker's other slots run other customers' syncs.
func ExampleSetFlowLimit() {
	ctx := context.Background()
	pool, cleanup := flowExampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	// The limit lives in the database; a worker may set it too (Config.FlowLimits).
	if err := fenceq.SetFlowLimit(ctx, pool, queue.FlowLimit{Name: "per-customer", MaxRunning: 1}); err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex
	running, most := map[int64]int{}, map[int64]int{}
	var done sync.WaitGroup
	eightRan := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[SyncArgs]) error {
		defer done.Done()
		c := job.Args.CustomerID
		mu.Lock()
		running[c]++
		most[c] = max(most[c], running[c])
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[c]--
			mu.Unlock()
		}()
		// … call the partner's API for this page …
		if c == 8 {
			close(eightRan)
			return nil
		}
		// Customer 7's first sync holds its slot until customer 8's has run: a busy
		// customer does not hold up the others.
		select {
		case <-eightRan:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, nil)
	stop := startExampleWorker(ctx, pool, hs)

	// The partition is the customer_id field of the args: customer 7's three syncs
	// count against one slot, customer 8's against another.
	opts := &fenceq.InsertOpts{Flow: queue.FlowOpts{Limit: "per-customer", PartitionBy: []string{"customer_id"}}}
	var keys []string
	for _, a := range []SyncArgs{{CustomerID: 7, Page: 1}, {CustomerID: 7, Page: 2}, {CustomerID: 7, Page: 3}, {CustomerID: 8, Page: 1}} {
		done.Add(1)
		res, err := fenceq.Enqueue(ctx, pool, a, opts)
		if err != nil {
			log.Fatal(err)
		}
		keys = append(keys, *res.Job.FlowKey)
	}
	done.Wait()
	stop()

	p, err := fenceq.FlowPartitionOf(ctx, pool, keys[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("flow keys:", keys)
	fmt.Println("customer 7: at most", most[7], "running at once")
	fmt.Printf("partition %s now: %d running, %d waiting\n", p.Key, p.Running, p.Waiting)
	// Output:
	// flow keys: [per-customer:7 per-customer:7 per-customer:7 per-customer:8]
	// customer 7: at most 1 running at once
	// partition per-customer:7 now: 0 running, 0 waiting
}

// PostingArgs are the arguments of a job that posts one entry to an account's ledger.
type PostingArgs struct {
	Account string `json:"account"`
	Entry   int    `json:"entry"`
}

// Kind names the handler of PostingArgs jobs.
func (PostingArgs) Kind() string { return "posting" }

// A sequence: the postings of one account run one at a time, in enqueue order. The
// head holds its account through its retries, so entry 3 waits while entry 2 is retried.
func ExampleSetFlowLimit_sequence() {
	ctx := context.Background()
	pool, cleanup := flowExampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}

	var mu sync.Mutex
	var log1 []string
	var done sync.WaitGroup
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[PostingArgs]) error {
		mu.Lock()
		defer mu.Unlock()
		if job.Args.Entry == 2 && job.Attempt == 1 {
			log1 = append(log1, fmt.Sprintf("entry %d, attempt %d: fails", job.Args.Entry, job.Attempt))
			return errors.New("ledger busy")
		}
		log1 = append(log1, fmt.Sprintf("entry %d, attempt %d: posted", job.Args.Entry, job.Attempt))
		done.Done()
		return nil
	}, nil)
	stop := startExampleWorker(ctx, pool, hs, queue.FlowLimit{Name: "ledger", Sequence: true})

	for entry := 1; entry <= 3; entry++ {
		done.Add(1)
		_, err := fenceq.Enqueue(ctx, pool, PostingArgs{Account: "acct-42", Entry: entry},
			&fenceq.InsertOpts{Flow: queue.FlowOpts{Limit: "ledger", Partition: "acct-42"}})
		if err != nil {
			log.Fatal(err)
		}
	}
	done.Wait()
	stop()
	for _, l := range log1 {
		fmt.Println(l)
	}
	// Output:
	// entry 1, attempt 1: posted
	// entry 2, attempt 1: fails
	// entry 2, attempt 2: posted
	// entry 3, attempt 1: posted
}

// NotifyArgs are the arguments of a job that sends one message through a mail domain.
type NotifyArgs struct {
	Domain string `json:"domain"`
	To     string `json:"to"`
}

// Kind names the handler of NotifyArgs jobs.
func (NotifyArgs) Kind() string { return "notify" }

// A rate limit: at most 2 starts per hour per mail domain. The third message waits,
// available, until the hour since the first start has passed; FlowPartitionOf tells
// when that is.
func ExampleFlowPartitionOf() {
	ctx := context.Background()
	pool, cleanup := flowExampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}

	var done sync.WaitGroup
	done.Add(2)
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[NotifyArgs]) error {
		defer done.Done()
		return nil // … send the message …
	}, nil)
	stop := startExampleWorker(ctx, pool, hs, queue.FlowLimit{Name: "smtp", Rate: 2, Per: time.Hour})

	opts := &fenceq.InsertOpts{Flow: queue.FlowOpts{Limit: "smtp", PartitionBy: []string{"domain"}}}
	var third *queue.JobRow
	for _, to := range []string{"ann", "bob", "cy"} {
		res, err := fenceq.Enqueue(ctx, pool, NotifyArgs{Domain: "example.com", To: to}, opts)
		if err != nil {
			log.Fatal(err)
		}
		third = res.Job
	}
	done.Wait() // two messages sent; the rate allows no third start this hour
	stop()

	p, err := fenceq.FlowPartitionOf(ctx, pool, *third.FlowKey)
	if err != nil {
		log.Fatal(err)
	}
	job, err := fenceq.GetJob(ctx, pool, third.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("partition %s: %d starts this period, %d waiting\n", p.Key, p.StartsInPeriod, p.Waiting)
	fmt.Println("third message:", job.State)
	fmt.Println("next start within the hour ahead:", p.NextStart.After(time.Now()) && time.Until(*p.NextStart) <= time.Hour)
	// Output:
	// partition smtp:example.com: 2 starts this period, 1 waiting
	// third message: available
	// next start within the hour ahead: true
}
