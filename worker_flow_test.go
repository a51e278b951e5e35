package fenceq_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

type custTaskArgs struct {
	CustomerID string `json:"customer_id"`
	N          int    `json:"n"`
}

func (custTaskArgs) Kind() string { return "cust_task" }

type freeTaskArgs struct {
	N int `json:"n"`
}

func (freeTaskArgs) Kind() string { return "free_task" }

// flowTally records, under its mutex, what the handlers of a flow test saw.
type flowTally struct {
	mu sync.Mutex
	// running and maxRunning count the attempts running at once per partition.
	running, maxRunning map[string]int
	// attempts counts the attempts of each job.
	attempts map[int64]int
	// wrongKey lists the jobs whose FlowKey was not the one their args give.
	wrongKey []int64
}

func newFlowTally() *flowTally {
	return &flowTally{running: map[string]int{}, maxRunning: map[string]int{}, attempts: map[int64]int{}}
}

// start counts an attempt of job id in partition p in, and returns how many of p run now.
func (f *flowTally) start(id int64, p string) int {
	f.running[p]++
	f.maxRunning[p] = max(f.maxRunning[p], f.running[p])
	f.attempts[id]++
	return f.running[p]
}

// Three workers (three Worker instances on one schema, as three processes would be),
// each with the limit in Config.FlowLimits, run the jobs of several customers under
// {MaxRunning: 1} per customer_id, and jobs under no limit in the same queue. The first
// job of each customer holds its slot until every customer has one running at once and
// every unlimited job has completed: so one customer's running job blocks neither the
// other customers nor the unlimited jobs, while the workers, with free slots and more of
// that customer's jobs waiting, keep claiming. No customer ever has two jobs running,
// and every job completes exactly once.
func TestFlowConcurrencyLimitAcrossWorkers(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "flow limits are refused on a distributed schema (their counts are kept by triggers)")
	b := setup(t)
	customers := []string{"acme", "globex", "initech"}
	const perCustomer, free = 6, 12
	tally := newFlowTally()
	freeDone := 0
	gate := make(chan struct{})
	var gateOnce sync.Once
	// openGate opens the gate once every customer runs a job and every unlimited job
	// completed; tally.mu is held.
	openGate := func() {
		for _, c := range customers {
			if tally.running[c] == 0 {
				return
			}
		}
		if freeDone == free {
			gateOnce.Do(func() { close(gate) })
		}
	}
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[custTaskArgs]) error {
		c := job.Args.CustomerID
		tally.mu.Lock()
		tally.start(job.ID, c)
		if job.FlowKey == nil || *job.FlowKey != "cust:"+c {
			tally.wrongKey = append(tally.wrongKey, job.ID)
		}
		openGate()
		tally.mu.Unlock()
		defer func() {
			tally.mu.Lock()
			tally.running[c]--
			tally.mu.Unlock()
		}()
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, nil)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[freeTaskArgs]) error {
		tally.mu.Lock()
		defer tally.mu.Unlock()
		tally.start(job.ID, "")
		tally.running[""]--
		if job.FlowKey != nil {
			tally.wrongKey = append(tally.wrongKey, job.ID)
		}
		freeDone++
		openGate()
		return nil
	}, nil)

	cfg := b.fastConfig(10 * time.Second)
	cfg.ReaperInterval = 200 * time.Millisecond
	cfg.Queues = map[string]fenceq.QueueConfig{queue.DefaultQueue: {MaxWorkers: 4}}
	cfg.FlowLimits = []queue.FlowLimit{{Name: "cust", MaxRunning: 1}}
	for range 3 {
		b.startWorker(t, cfg)
	}
	var ids []int64
	flow := &fenceq.InsertOpts{Flow: queue.FlowOpts{Limit: "cust", PartitionBy: []string{"customer_id"}}}
	for n := range perCustomer {
		for _, c := range customers {
			res, err := fenceq.Enqueue(b.ctx, b.db.Pool, custTaskArgs{CustomerID: c, N: n}, flow)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, res.Job.ID)
		}
	}
	for n := range free {
		res, err := fenceq.Enqueue(b.ctx, b.db.Pool, freeTaskArgs{N: n}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Job.ID)
	}
	for _, id := range ids {
		fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, time.Minute)
	}

	tally.mu.Lock()
	defer tally.mu.Unlock()
	for _, c := range customers {
		if tally.maxRunning[c] != 1 {
			t.Errorf("customer %s had up to %d jobs running at once, want 1", c, tally.maxRunning[c])
		}
	}
	for _, id := range ids {
		if tally.attempts[id] != 1 {
			t.Errorf("job %d ran %d times, want once", id, tally.attempts[id])
		}
	}
	if len(tally.wrongKey) > 0 {
		t.Errorf("jobs with a wrong flow key: %v", tally.wrongKey)
	}
	// Every slot was counted out when its lease ended.
	var running, held int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT COALESCE(sum(running), 0), count(holder) FROM fenceq_flow_keys`).Scan(&running, &held); err != nil {
		t.Fatal(err)
	}
	if running != 0 || held != 0 {
		t.Fatalf("after every job completed, fenceq_flow_keys counts %d running and %d holders, want none", running, held)
	}
}

type ledgerArgs struct {
	Account string `json:"account"`
	N       int    `json:"n"`
}

func (ledgerArgs) Kind() string { return "ledger" }

// Under a sequence, the jobs of one account run one at a time and complete in enqueue
// order across two workers, and a job that fails keeps its place: the jobs after it wait
// through its retry. Another account's sequence goes on meanwhile.
func TestFlowSequenceRunsInEnqueueOrder(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "flow limits are refused on a distributed schema (their counts are kept by triggers)")
	b := setup(t)
	const perAccount = 6
	accounts := []string{"a", "b"}
	tally := newFlowTally()
	starts := map[string][]int{}
	completions := map[string][]int{}
	failed := false
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[ledgerArgs]) error {
		acct := job.Args.Account
		tally.mu.Lock()
		defer tally.mu.Unlock()
		tally.start(job.ID, acct)
		defer func() { tally.running[acct]-- }()
		starts[acct] = append(starts[acct], job.Args.N)
		if acct == "a" && job.Args.N == 2 && !failed {
			failed = true
			return errors.New("first attempt fails")
		}
		completions[acct] = append(completions[acct], job.Args.N)
		return nil
	}, nil)

	cfg := b.fastConfig(10 * time.Second)
	cfg.ReaperInterval = 200 * time.Millisecond
	cfg.Backoff = queue.Backoff{Base: time.Millisecond, Max: time.Millisecond}
	cfg.Queues = map[string]fenceq.QueueConfig{queue.DefaultQueue: {MaxWorkers: 4}}
	cfg.FlowLimits = []queue.FlowLimit{{Name: "ledger", Sequence: true}}
	for range 2 {
		b.startWorker(t, cfg)
	}
	var ids []int64
	for n := range perAccount {
		for _, acct := range accounts {
			res, err := fenceq.Enqueue(b.ctx, b.db.Pool, ledgerArgs{Account: acct, N: n},
				&fenceq.InsertOpts{Flow: queue.FlowOpts{Limit: "ledger", Partition: acct}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, res.Job.ID)
		}
	}
	for _, id := range ids {
		fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, time.Minute)
	}

	tally.mu.Lock()
	defer tally.mu.Unlock()
	inOrder := []int{0, 1, 2, 3, 4, 5}
	for _, acct := range accounts {
		if !slices.Equal(completions[acct], inOrder) {
			t.Errorf("account %s completed %v, want %v", acct, completions[acct], inOrder)
		}
		if tally.maxRunning[acct] != 1 {
			t.Errorf("account %s had up to %d jobs running at once, want 1", acct, tally.maxRunning[acct])
		}
	}
	if want := []int{0, 1, 2, 2, 3, 4, 5}; !slices.Equal(starts["a"], want) {
		t.Errorf("account a started %v, want %v: the failed job is retried before the next starts", starts["a"], want)
	}
	if !slices.Equal(starts["b"], inOrder) {
		t.Errorf("account b started %v, want %v", starts["b"], inOrder)
	}
	if t.Failed() {
		t.Logf("attempts per job: %v", tally.attempts)
	}
}
