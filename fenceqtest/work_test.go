package fenceqtest_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

type workBundle struct {
	ctx context.Context
	db  *fenceqtest.DB
	hs  *fenceq.Handlers
	obs *recordingObserver
}

func setupWork(t *testing.T) *workBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 4, Migrations: []migrations.Set{migrations.Core(), appMigrations()}})
	return &workBundle{ctx: ctx, db: db, hs: fenceq.NewHandlers(), obs: &recordingObserver{}}
}

func (b *workBundle) config() fenceq.Config {
	return fenceq.Config{Handlers: b.hs, ID: "test-worker", Logger: fenceqtest.QuietLogger(), Hooks: []fenceq.Hook{b.obs},
		Backoff: queue.Backoff{Base: time.Hour, Max: 2 * time.Hour, Jitter: 0.01}}
}

func (b *workBundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// recordingObserver is a hook that keeps the outcomes and rejected writes the worker
// reports.
type recordingObserver struct {
	mu       sync.Mutex
	claimed  int
	outcomes []fenceq.Outcome
	stale    []string
}

func (o *recordingObserver) JobStarted(context.Context, *queue.JobRow) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.claimed++
}

func (o *recordingObserver) JobFinished(_ context.Context, _ *queue.JobRow, res fenceq.AttemptResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes = append(o.outcomes, res.Outcome)
}

func (o *recordingObserver) StaleWriteRejected(_ context.Context, _ *queue.JobRow, op string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stale = append(o.stale, op)
}

func (o *recordingObserver) seen() (int, []fenceq.Outcome, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.claimed, append([]fenceq.Outcome(nil), o.outcomes...), append([]string(nil), o.stale...)
}

type stepArgs struct {
	Do string `json:"do"`
}

func (stepArgs) Kind() string { return "step" }

// The handler's fenced Commit writes its row and completes the job under the lease the
// claim gave; the observer hears one claim and one completion; the worker row is gone.
func TestWorkCommit(t *testing.T) {
	t.Parallel()
	b := setupWork(t)
	b.hs = greetHandlers()
	row, err := fenceqtest.Work(b.ctx, t, b.db.Pool, b.config(), GreetArgs{Name: "ada"}, nil)
	if err != nil {
		t.Fatalf("handler error: %v", err)
	}
	if row.State != queue.StateCompleted || row.Attempt != 1 || row.LeaseGen != 1 || row.LeasedBy == nil ||
		*row.LeasedBy != "test-worker" || row.FinishedAt == nil {
		t.Fatalf("row %+v: want completed at attempt 1 under generation 1 by test-worker", row)
	}
	var text string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT text FROM greetings WHERE job_id = $1`, row.ID).Scan(&text); err != nil || text != "hello, ada" {
		t.Fatalf("greeting %q %v", text, err)
	}
	claimed, outcomes, stale := b.obs.seen()
	if claimed != 1 || len(outcomes) != 1 || outcomes[0] != fenceq.OutcomeCompleted || len(stale) != 0 {
		t.Fatalf("observer: %d claims, outcomes %v, stale %v; want 1, [completed], none", claimed, outcomes, stale)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_workers`); n != 0 {
		t.Fatalf("%d worker rows after Work, want none", n)
	}
}

// Each way a handler can end is written as a worker writes it.
func TestWorkOutcomes(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	cases := []struct {
		name    string
		do      string
		opts    *fenceq.InsertOpts
		state   queue.State
		outcome fenceq.Outcome
		check   func(t *testing.T, row *queue.JobRow, err error)
	}{
		{name: "Success", do: "ok", state: queue.StateCompleted, outcome: fenceq.OutcomeCompleted,
			check: func(t *testing.T, row *queue.JobRow, err error) {
				if err != nil || row.FinishedAt == nil {
					t.Fatalf("err %v, finished_at %v", err, row.FinishedAt)
				}
			}},
		{name: "FailRetriesWithBackoff", do: "fail", state: queue.StateRetryable, outcome: fenceq.OutcomeRetried,
			check: func(t *testing.T, row *queue.JobRow, err error) {
				if !errors.Is(err, boom) {
					t.Fatalf("handler error %v, want boom", err)
				}
				if len(row.Errors) != 1 || row.Errors[0].Error != "boom" || row.Errors[0].Attempt != 1 {
					t.Fatalf("errors %+v, want boom at attempt 1", row.Errors)
				}
				// The configured backoff: an hour (1 % jitter) after the failure.
				if wait := time.Until(row.RunAt); wait < 58*time.Minute || wait > 61*time.Minute {
					t.Fatalf("retry in %s, want about an hour (Config.Backoff)", wait)
				}
			}},
		{name: "LastAttemptDiscards", do: "fail", opts: &fenceq.InsertOpts{MaxAttempts: 1},
			state: queue.StateDiscarded, outcome: fenceq.OutcomeDiscarded},
		{name: "Snooze", do: "snooze", state: queue.StateScheduled, outcome: fenceq.OutcomeSnoozed,
			check: func(t *testing.T, row *queue.JobRow, err error) {
				if wait := time.Until(row.RunAt); wait < 9*time.Minute || wait > 11*time.Minute {
					t.Fatalf("snoozed until %s from now, want 10m", wait)
				}
			}},
		{name: "Cancel", do: "cancel", state: queue.StateCancelled, outcome: fenceq.OutcomeCancelled},
		{name: "Discard", do: "discard", state: queue.StateDiscarded, outcome: fenceq.OutcomeDiscarded,
			check: func(t *testing.T, row *queue.JobRow, err error) {
				if row.Attempt != 1 || row.MaxAttempts != 25 {
					t.Fatalf("attempt %d of %d: want discarded at the first of 25", row.Attempt, row.MaxAttempts)
				}
			}},
		{name: "Panic", do: "panic", state: queue.StateRetryable, outcome: fenceq.OutcomeRetried,
			check: func(t *testing.T, row *queue.JobRow, err error) {
				var pe *fenceq.PanicError
				if !errors.As(err, &pe) || pe.Value != "kaput" {
					t.Fatalf("handler error %v, want a PanicError of kaput", err)
				}
				if len(row.Errors) != 1 || !strings.Contains(row.Errors[0].Trace, "work_test.go") {
					t.Fatalf("errors %+v: want the panic's stack recorded", row.Errors)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setupWork(t)
			fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[stepArgs]) error {
				switch job.Args.Do {
				case "fail":
					return boom
				case "snooze":
					return fenceq.JobSnooze(10 * time.Minute)
				case "cancel":
					return fenceq.JobCancel(errors.New("not wanted"))
				case "discard":
					return fenceq.JobDiscard(errors.New("hopeless"))
				case "panic":
					panic("kaput")
				}
				return nil
			}, nil)
			row, err := fenceqtest.Work(b.ctx, t, b.db.Pool, b.config(), stepArgs{Do: c.do}, c.opts)
			if row.State != c.state {
				t.Fatalf("state %s (errors %+v), want %s", row.State, row.Errors, c.state)
			}
			if _, outcomes, _ := b.obs.seen(); len(outcomes) != 1 || outcomes[0] != c.outcome {
				t.Fatalf("outcomes %v, want [%s]", outcomes, c.outcome)
			}
			if c.check != nil {
				c.check(t, row, err)
			}
		})
	}
}

// A handler whose lease was revoked (here: an operator requeued the job while it ran)
// can write nothing: its Commit is rejected by the database and recorded.
func TestWorkLeaseLost(t *testing.T) {
	t.Parallel()
	b := setupWork(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		if _, err := store.RequeueJob(ctx, b.db.Pool, job.ID); err != nil {
			return err
		}
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO greetings (job_id, text) VALUES ($1, 'stale')`, job.ID)
			return err
		})
	}, nil)
	row, err := fenceqtest.Work(b.ctx, t, b.db.Pool, b.config(), GreetArgs{Name: "late"}, nil)
	if !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("handler error %v, want ErrLeaseLost", err)
	}
	if row.State != queue.StateAvailable || row.LeaseGen != 2 {
		t.Fatalf("row %s at generation %d, want available at 2 (requeued, generation bumped)", row.State, row.LeaseGen)
	}
	if n := b.count(t, `SELECT count(*) FROM greetings`); n != 0 {
		t.Fatalf("%d greetings written by the revoked holder", n)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND lease_gen = 1 AND kind = $2`,
		row.ID, queue.EventStaleWriteRejected); n != 1 {
		t.Fatalf("%d stale_write_rejected events for generation 1, want 1", n)
	}
	if _, outcomes, stale := b.obs.seen(); len(outcomes) != 1 || outcomes[0] != fenceq.OutcomeLeaseLost ||
		len(stale) != 1 || stale[0] != "commit" {
		t.Fatalf("observer: outcomes %v, stale writes %v; want [lease_lost] and [commit]", outcomes, stale)
	}
}

// Job.WithLease writes under the lease without completing; the job completes after.
func TestWorkWithLease(t *testing.T) {
	t.Parallel()
	b := setupWork(t)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		return job.WithLease(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var state string
			if err := tx.QueryRow(ctx, `SELECT state FROM fenceq_jobs WHERE id = $1`, job.ID).Scan(&state); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO greetings (job_id, text) VALUES ($1, $2)`, job.ID, "while "+state)
			return err
		})
	}, nil)
	row, err := fenceqtest.Work(b.ctx, t, b.db.Pool, b.config(), GreetArgs{}, nil)
	if err != nil || row.State != queue.StateCompleted {
		t.Fatalf("%s, %v: want completed", row.State, err)
	}
	var text string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT text FROM greetings WHERE job_id = $1`, row.ID).Scan(&text); err != nil || text != "while running" {
		t.Fatalf("greeting %q %v, want written while running", text, err)
	}
}

// A handler that runs past its lease keeps it: Work heartbeats like a worker.
func TestWorkHeartbeats(t *testing.T) {
	t.Parallel()
	b := setupWork(t)
	b.hs = greetHandlers()
	slow := fenceq.NewHandlers()
	fenceq.AddHandler(slow, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		select {
		case <-time.After(1500 * time.Millisecond): // past the 1s lease
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error { return nil })
	}, nil)
	cfg := b.config()
	cfg.Handlers = slow
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.LeaseMargin = time.Second, 200*time.Millisecond, 100*time.Millisecond
	row, err := fenceqtest.Work(b.ctx, t, b.db.Pool, cfg, GreetArgs{}, nil)
	if err != nil || row.State != queue.StateCompleted || row.LeaseGen != 1 {
		t.Fatalf("%s at generation %d, %v: want completed under the first lease", row.State, row.LeaseGen, err)
	}
	if row.HeartbeatAt == nil || row.AttemptedAt == nil || row.HeartbeatAt.Sub(*row.AttemptedAt) < 800*time.Millisecond {
		t.Fatalf("heartbeat_at %v, attempted_at %v: want heartbeats while the handler ran", row.HeartbeatAt, row.AttemptedAt)
	}
}

// Work claims its own job only: more urgent and older jobs of the queue stay untouched.
func TestWorkClaimsOnlyItsJob(t *testing.T) {
	t.Parallel()
	b := setupWork(t)
	b.hs = greetHandlers()
	urgent, err := fenceq.Enqueue(b.ctx, b.db.Pool, GreetArgs{Name: "urgent"}, &fenceq.InsertOpts{Priority: new(0)})
	if err != nil {
		t.Fatal(err)
	}
	older, err := fenceq.Enqueue(b.ctx, b.db.Pool, GreetArgs{Name: "older"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	row, err := fenceqtest.Work(b.ctx, t, b.db.Pool, b.config(), GreetArgs{Name: "mine"}, nil)
	if err != nil || row.State != queue.StateCompleted {
		t.Fatalf("%s %v", row.State, err)
	}
	for _, id := range []int64{urgent.Job.ID, older.Job.ID} {
		j, err := store.GetJob(b.ctx, b.db.Pool, id)
		if err != nil || j.State != queue.StateAvailable || j.Attempt != 0 || j.LeaseGen != 0 {
			t.Fatalf("job %d: %+v %v, want untouched", id, j, err)
		}
	}
	// WorkJob then works one of them.
	row, err = fenceqtest.WorkJob(b.ctx, t, b.db.Pool, b.config(), older.Job.ID)
	if err != nil || row.ID != older.Job.ID || row.State != queue.StateCompleted {
		t.Fatalf("WorkJob: %+v %v", row, err)
	}
}

// What Work cannot run fails the test before anything runs, saying why.
func TestWorkRefuses(t *testing.T) {
	t.Parallel()
	b := setupWork(t)
	b.hs = greetHandlers()
	cases := []struct {
		name, want string
		fn         func(tb testing.TB)
	}{
		{"NoHandler", `no handler for kind "step" in cfg.Handlers (registered: [greet])`, func(tb testing.TB) {
			fenceqtest.Work(b.ctx, tb, b.db.Pool, b.config(), stepArgs{}, nil)
		}},
		{"NilHandlers", "cfg.Handlers is nil", func(tb testing.TB) {
			fenceqtest.Work(b.ctx, tb, b.db.Pool, fenceq.Config{}, GreetArgs{}, nil)
		}},
		{"Scheduled", "is scheduled, not available", func(tb testing.TB) {
			fenceqtest.Work(b.ctx, tb, b.db.Pool, b.config(), GreetArgs{Name: "later"}, &fenceq.InsertOpts{RunIn: time.Hour})
		}},
		{"UniqueKeyTaken", `the unique key "k1" matched job`, func(tb testing.TB) {
			if _, err := fenceq.Enqueue(b.ctx, b.db.Pool, GreetArgs{}, &fenceq.InsertOpts{UniqueKey: "k1"}); err != nil {
				tb.Fatal(err)
			}
			fenceqtest.Work(b.ctx, tb, b.db.Pool, b.config(), GreetArgs{}, &fenceq.InsertOpts{UniqueKey: "k1"})
		}},
		{"PausedQueue", `queue "held" may be paused`, func(tb testing.TB) {
			if err := store.SetQueuePaused(b.ctx, b.db.Pool, "held", true); err != nil {
				tb.Fatal(err)
			}
			fenceqtest.Work(b.ctx, tb, b.db.Pool, b.config(), GreetArgs{}, &fenceq.InsertOpts{Queue: "held"})
		}},
		{"UnknownJob", "job 424242: not found", func(tb testing.TB) {
			fenceqtest.WorkJob(b.ctx, tb, b.db.Pool, b.config(), 424242)
		}},
		{"BadConfig", "HeartbeatInterval: 2m0s must be shorter than LeaseDuration", func(tb testing.TB) {
			cfg := b.config()
			cfg.HeartbeatInterval = 2 * time.Minute
			fenceqtest.Work(b.ctx, tb, b.db.Pool, cfg, GreetArgs{}, nil)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if msg := mustFail(t, c.fn); !strings.Contains(msg, c.want) {
				t.Fatalf("failure %q, want it to contain %q", msg, c.want)
			}
		})
	}
	// Nothing ran: no claim; the refusals that come before enqueueing enqueued nothing.
	if n := b.count(t, `SELECT count(*) FROM fenceq_jobs WHERE attempt > 0`); n != 0 {
		t.Fatalf("%d jobs were claimed by refused Work calls", n)
	}
	// Enqueued: the scheduled job, the unique one and the paused queue's.
	if n := b.count(t, `SELECT count(*) FROM fenceq_jobs`); n != 3 {
		t.Fatalf("%d jobs enqueued by refused Work calls, want 3 (the bad config and missing handlers enqueue none)", n)
	}
}
