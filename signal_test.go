package fenceq_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type approvalArgs struct {
	Timeout time.Duration `json:"timeout,omitempty"`
}

func (approvalArgs) Kind() string { return "approval" }

type approval struct {
	By string `json:"by"`
}

// signalBundle runs approvalArgs jobs whose handler waits for the signal "approved"
// (with the job's timeout) and records what each attempt saw.
type signalBundle struct {
	*testBundle
	mu    sync.Mutex
	seen  map[int64][]string // per job: "wait", "approved by X", "timeout" per attempt
	waits atomic.Int64
}

func setupSignals(t *testing.T) *signalBundle {
	t.Helper()
	fenceqtest.SkipOnCitus(t, "signals are refused on a Citus distributed schema")
	b := &signalBundle{testBundle: setup(t), seen: map[int64][]string{}}
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[approvalArgs]) error {
		var a approval
		err := job.Signal(ctx, "approved", &a)
		note := ""
		switch {
		case err == nil:
			note = "approved by " + a.By
		case errors.Is(err, fenceq.ErrSignalTimeout):
			note = "timeout"
		case errors.Is(err, fenceq.ErrNoSignal):
			note = "wait"
		default:
			return err
		}
		b.mu.Lock()
		b.seen[job.ID] = append(b.seen[job.ID], note)
		b.mu.Unlock()
		if note == "wait" {
			b.waits.Add(1)
			return fenceq.WaitForSignal("approved", job.Args.Timeout)
		}
		return fenceq.RecordOutput(ctx, note)
	}, nil)
	return b
}

func (b *signalBundle) seenOf(id int64) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.seen[id]...)
}

func (b *signalBundle) enqueue(t *testing.T, timeout time.Duration) int64 {
	t.Helper()
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, approvalArgs{Timeout: timeout}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.Job.ID
}

// A job waits for a signal holding no lease; many senders race to send it: exactly one
// delivers it, the others find it sent, and the job runs once more and sees it.
func TestSignalDeliveredOnceToRacingSenders(t *testing.T) {
	t.Parallel()
	b := setupSignals(t)
	b.startWorker(t, b.fastConfig(5*time.Second))
	id := b.enqueue(t, 0)
	j := fenceqtest.WaitState(t, b.db.Pool, id, queue.StatePending, 30*time.Second)
	if j.LeasedBy != nil || j.LeaseExpiresAt != nil || j.Attempt != 1 || j.MaxAttempts != queue.DefaultMaxAttempts+1 {
		t.Fatalf("waiting job: %+v; want no lease and the attempt not counted", j)
	}
	var delivered, dup atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := fenceq.SendSignal(b.ctx, b.db.Pool, id, "approved", approval{By: string(rune('a' + i))})
			switch {
			case err != nil:
				t.Error(err)
			case r == queue.SignalDelivered:
				delivered.Add(1)
			case r == queue.SignalDuplicate:
				dup.Add(1)
			default:
				t.Errorf("send: %s", r)
			}
		}()
	}
	wg.Wait()
	if delivered.Load() != 1 || dup.Load() != 7 {
		t.Fatalf("delivered %d, duplicates %d; want 1 and 7", delivered.Load(), dup.Load())
	}
	done := fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, 30*time.Second)
	seen := b.seenOf(id)
	if len(seen) != 2 || seen[0] != "wait" || len(seen[1]) < len("approved by a") {
		t.Fatalf("attempts saw %v, want a wait, then the approval", seen)
	}
	sigs, err := fenceq.ListSignals(b.ctx, b.db.Pool, id)
	if err != nil || len(sigs) != 1 || sigs[0].DeliveredGen == nil || *sigs[0].DeliveredGen != 1 {
		t.Fatalf("signals: %+v %v; want one, delivered to the wait of generation 1", sigs, err)
	}
	if done.LeaseGen != 2 || string(done.Output) != `"`+seen[1]+`"` {
		t.Fatalf("completed job: gen %d output %s", done.LeaseGen, done.Output)
	}
}

// A signal sent before the job runs is kept and seen at once; one sent while the job
// runs (before it waits) ends its wait at once.
func TestSignalBeforeWait(t *testing.T) {
	t.Parallel()
	b := setupSignals(t)
	early := b.enqueue(t, 0)
	if r, err := fenceq.SendSignal(b.ctx, b.db.Pool, early, "approved", approval{By: "early"}); err != nil || r != queue.SignalKept {
		t.Fatalf("send before the job ran: %s %v, want kept", r, err)
	}
	// A job that runs and decides to wait, with the signal landing between its check
	// and its wait: claimed by hand, the signal sent, then the wait.
	ins, err := fenceq.Enqueue(b.ctx, b.db.Pool, approvalArgs{}, &fenceq.InsertOpts{Queue: "mid"})
	if err != nil {
		t.Fatal(err)
	}
	mid := ins.Job.ID
	rows, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "mid", WorkerID: "test", Limit: 1, Lease: time.Minute})
	if err != nil || len(rows) != 1 || rows[0].ID != mid {
		t.Fatalf("claim: %v %v", rows, err)
	}
	if r, err := fenceq.SendSignal(b.ctx, b.db.Pool, mid, "approved", approval{By: "mid"}); err != nil || r != queue.SignalKept {
		t.Fatalf("send while running: %s %v, want kept", r, err)
	}
	st, err := store.Wait(b.ctx, b.db.Pool, store.LeaseOf(rows[0]), store.WaitParams{Signal: "approved"})
	if err != nil || st != queue.StateAvailable {
		t.Fatalf("wait for a signal already sent: %s %v, want available at once", st, err)
	}
	cfg := b.fastConfig(5 * time.Second)
	cfg.Queues = map[string]fenceq.QueueConfig{queue.DefaultQueue: {}, "mid": {}}
	b.startWorker(t, cfg)
	for id, want := range map[int64]string{early: "approved by early", mid: "approved by mid"} {
		fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, 30*time.Second)
		if seen := b.seenOf(id); len(seen) != 1 || seen[0] != want {
			t.Errorf("job %d saw %v, want [%s]", id, seen, want)
		}
	}
}

// A wait with a timeout that passes ends without the signal; a signal sent afterwards is
// kept but the attempt that timed out sees the timeout.
func TestSignalTimeout(t *testing.T) {
	t.Parallel()
	b := setupSignals(t)
	cfg := b.fastConfig(5 * time.Second)
	cfg.ReaperInterval = 50 * time.Millisecond // the promotion pass that ends the wait
	b.startWorker(t, cfg)
	id := b.enqueue(t, 100*time.Millisecond)
	fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, 30*time.Second)
	if seen := b.seenOf(id); len(seen) != 2 || seen[0] != "wait" || seen[1] != "timeout" {
		t.Fatalf("attempts saw %v, want a wait, then the timeout", seen)
	}
	if _, err := fenceq.SendSignal(b.ctx, b.db.Pool, id, "approved", nil); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("signal to a completed job: %v, want ErrWrongState", err)
	}
	if _, err := fenceq.SendSignal(b.ctx, b.db.Pool, 999999, "approved", nil); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("signal to no job: %v, want ErrNotFound", err)
	}
	if _, err := fenceq.SendSignal(b.ctx, b.db.Pool, id, "not a name", nil); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("signal with a bad name: %v, want ErrInvalid", err)
	}
}

// A signal and the timeout of the wait it ends race, many times: exactly one of them
// ends the wait.
func TestSignalTimeoutRace(t *testing.T) {
	t.Parallel()
	b := setupSignals(t)
	for i := range 30 {
		id := b.enqueue(t, 0)
		rows := claimAll(t, b.testBundle, 1)
		if _, err := store.Wait(b.ctx, b.db.Pool, rows[0], store.WaitParams{Signal: "approved", Timeout: time.Hour}); err != nil {
			t.Fatal(err)
		}
		// The deadline is made due now, so that the promotion pass and the signal race.
		if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs_hot SET run_at = now() WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		var promoted int64
		var res queue.SignalResult
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			n, err := store.PromoteDue(b.ctx, b.db.Pool, 10)
			if err != nil {
				t.Error(err)
			}
			promoted = n
		}()
		go func() {
			defer wg.Done()
			r, err := fenceq.SendSignal(b.ctx, b.db.Pool, id, "approved", nil)
			if err != nil {
				t.Error(err)
			}
			res = r
		}()
		wg.Wait()
		won := map[bool]int{promoted == 1: 1}
		won[res == queue.SignalDelivered]++
		if won[true] != 1 || (res != queue.SignalDelivered && res != queue.SignalKept) {
			t.Fatalf("iteration %d: promoted %d and signal %s; want exactly one to end the wait", i, promoted, res)
		}
		j, err := fenceq.GetJob(b.ctx, b.db.Pool, id)
		if err != nil || j.State != queue.StateAvailable {
			t.Fatalf("iteration %d: job %v %v, want available", i, j, err)
		}
		var delivered bool
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT delivered_at IS NOT NULL FROM fenceq_signals WHERE job_id = $1`, id).Scan(&delivered); err != nil {
			t.Fatal(err)
		}
		if delivered != (res == queue.SignalDelivered) {
			t.Fatalf("iteration %d: signal recorded delivered=%v, send said %s", i, delivered, res)
		}
		if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, id, "done"); err != nil {
			t.Fatal(err)
		}
	}
}

// The holder of a job pauses past its lease; the job is revoked, run again elsewhere and
// waits for the signal under the new lease. The paused holder's wait and completion are
// rejected; the signal wakes the job once, and the job completes once.
func TestSignalPausedHolder(t *testing.T) {
	t.Parallel()
	b := setupSignals(t)
	id := b.enqueue(t, 0)
	stale := claimAll(t, b.testBundle, 1)[0]
	if _, err := fenceq.RequeueJob(b.ctx, b.db.Pool, id); err != nil { // the revocation
		t.Fatal(err)
	}
	b.startWorker(t, b.fastConfig(5*time.Second))
	waiting := fenceqtest.WaitState(t, b.db.Pool, id, queue.StatePending, 30*time.Second)
	if _, err := store.Wait(b.ctx, b.db.Pool, stale, store.WaitParams{Signal: "approved"}); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("the stale holder's wait: %v, want ErrLeaseLost", err)
	}
	if err := store.Complete(b.ctx, b.db.Pool, stale); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("the stale holder's completion: %v, want ErrLeaseLost", err)
	}
	if r, err := fenceq.SendSignal(b.ctx, b.db.Pool, id, "approved", approval{By: "ops"}); err != nil || r != queue.SignalDelivered {
		t.Fatalf("send: %s %v", r, err)
	}
	done := fenceqtest.WaitState(t, b.db.Pool, id, queue.StateCompleted, 30*time.Second)
	if seen := b.seenOf(id); len(seen) != 2 || seen[1] != "approved by ops" {
		t.Fatalf("attempts saw %v, want a wait, then the approval", seen)
	}
	var gen int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT delivered_gen FROM fenceq_signals WHERE job_id = $1`, id).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	if gen != waiting.LeaseGen || done.LeaseGen != gen+1 {
		t.Fatalf("signal delivered to generation %d (the wait was at %d), completed at %d", gen, waiting.LeaseGen, done.LeaseGen)
	}
	if n := b.countEvents(t, queue.EventStaleWriteRejected, id, stale.Gen); n != 2 {
		t.Fatalf("stale_write_rejected events for the paused holder = %d, want 2 (wait, complete)", n)
	}
}

type sleeperArgs struct{}

func (sleeperArgs) Kind() string { return "sleeper" }

// A durable sleep: the handler sleeps once, holding no lease, then runs again and
// finds its sleep.
func TestSleep(t *testing.T) {
	t.Parallel()
	b := setupSignals(t)
	var runs atomic.Int64
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[sleeperArgs]) error {
		runs.Add(1)
		w, err := job.LastWait(ctx)
		if err != nil {
			return err
		}
		if w == nil {
			return fenceq.Sleep(100 * time.Millisecond)
		}
		if w.Signal != "" || w.Deadline == nil || w.Deadline.Sub(w.WaitedAt) != 100*time.Millisecond {
			return errors.New("unexpected wait")
		}
		return nil
	}, nil)
	cfg := b.fastConfig(5 * time.Second)
	cfg.ReaperInterval = 50 * time.Millisecond
	b.startWorker(t, cfg)
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, sleeperArgs{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	j := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 30*time.Second)
	if runs.Load() != 2 || len(j.Errors) != 0 {
		t.Fatalf("ran %d times with errors %+v, want twice without errors", runs.Load(), j.Errors)
	}
}
