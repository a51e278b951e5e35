package fenceq_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/faultproxy"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// proxiedPool opens a pool on the test schema whose connections go through a fault proxy.
func (b *testBundle) proxiedPool(t *testing.T) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	p, err := faultproxy.New(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

func (b *testBundle) countEvents(t *testing.T, kind queue.LeaseEventKind, jobID, gen int64) int64 {
	t.Helper()
	var n int64
	err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_lease_events WHERE kind = $1 AND job_id = $2 AND lease_gen = $3`,
		string(kind), jobID, gen).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type resultArgs struct {
	Value string `json:"value"`
}

func (resultArgs) Kind() string { return "result" }

func writeResult(ctx context.Context, job *fenceq.Job[resultArgs]) error {
	return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen, value) VALUES ($1, $2, $3)`,
			job.ID, job.Lease().Gen, job.Args.Value)
		return err
	})
}

// writeResultPipelined is writeResult through CommitWrites: one pipeline.
func writeResultPipelined(ctx context.Context, job *fenceq.Job[resultArgs]) error {
	w := &fenceq.Writes{}
	w.Exec(`INSERT INTO results (job_id, lease_gen, value) VALUES ($1, $2, $3)`, job.ID, job.Lease().Gen, job.Args.Value)
	return job.CommitWrites(ctx, w)
}

// Worker A pauses past its lease (its network goes silent, as
// in a GC pause or SIGSTOP); the reaper revokes the lease; worker B claims a newer
// generation and commits; A resumes and every write it tries is rejected by the
// database. The result row exists once, and the mechanism left its traces.
func TestPausedHolderCannotWriteAfterRevocation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	poolA, proxyA := b.proxiedPool(t)

	var calls atomic.Int64
	aStarted := make(chan *fenceq.Job[resultArgs], 1)
	aResume := make(chan struct{})
	aCommitErr := make(chan error, 1)
	var aCtxCause atomic.Value
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[resultArgs]) error {
		if calls.Add(1) == 1 {
			// Worker A: blocks past its lease, ignoring its context like a stuck call would.
			aStarted <- job
			<-aResume
			aCtxCause.Store(context.Cause(ctx))
			// A fresh context: what stops A must be the database's fence, not a
			// cancelled context.
			err := writeResult(context.Background(), job)
			aCommitErr <- err
			return err
		}
		return writeResult(ctx, job)
	}, nil)
	lease := time.Second
	cfgA := b.fastConfig(lease)
	cfgA.ID = "worker-A"
	cfgA.HeartbeatInterval = 200 * time.Millisecond
	wA, err := fenceq.NewWorker(poolA, cfgA)
	if err != nil {
		t.Fatal(err)
	}
	if err := wA.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = wA.Stop(ctx)
	}()

	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, resultArgs{Value: "once"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	jobA := recv(t, aStarted, 10*time.Second, "worker A to start the job")
	leaseA := jobA.Lease()
	if leaseA.Gen != 1 || leaseA.Holder != "worker-A" {
		t.Fatalf("A's lease = %+v, want generation 1 held by worker-A", leaseA)
	}

	// A pauses: nothing it sends reaches the database any more.
	proxyA.SetBlackhole(true)

	// Worker B (direct connection) reaps the expired lease and runs the job.
	cfgB := b.fastConfig(lease)
	cfgB.ID = "worker-B"
	b.startWorker(t, cfgB)
	done := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 15*time.Second)
	if done.LeaseGen != 3 || done.LeasedBy == nil || *done.LeasedBy != "worker-B" {
		t.Fatalf("completed job: gen %d by %v; want gen 3 (claim, revoke, claim) by worker-B", done.LeaseGen, done.LeasedBy)
	}
	if n := b.countEvents(t, queue.EventRevoked, leaseA.JobID, leaseA.Gen); n != 1 {
		t.Fatalf("revoked events for A's lease = %d, want 1", n)
	}
	if proxyA.Dropped() == 0 {
		t.Fatal("the pause did not drop any of A's traffic: the fault did not happen")
	}

	// A's network comes back while its handler is still stuck: A's own heartbeat loop
	// finds the lease gone and raises the alert. (Waited for before the handler goes on,
	// so that a heartbeat slowed by a loaded machine cannot miss the lease, which leaves
	// the heartbeat's set once the handler has returned.)
	proxyA.SetBlackhole(false)
	fenceqtest.WaitFor(t, "expired_holder_alive event for A's lease", 10*time.Second, func() bool {
		return b.countEvents(t, queue.EventExpiredHolderAlive, leaseA.JobID, leaseA.Gen) == 1
	})

	// A's handler resumes.
	close(aResume)
	if err := recv(t, aCommitErr, 10*time.Second, "A's commit"); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("A's fenced commit after revocation: %v, want ErrLeaseLost", err)
	}
	if cause, _ := aCtxCause.Load().(error); !errors.Is(cause, fenceq.ErrLeaseDeadline) && !errors.Is(cause, queue.ErrLeaseLost) {
		t.Errorf("A's context cause = %v, want lease deadline or lease lost", cause)
	}
	// Every other write A could make is rejected too.
	if err := store.Complete(b.ctx, b.db.Pool, leaseA); !errors.Is(err, queue.ErrLeaseLost) {
		t.Errorf("A's completion: %v", err)
	}
	if err := store.Release(b.ctx, b.db.Pool, leaseA); !errors.Is(err, queue.ErrLeaseLost) {
		t.Errorf("A's release: %v", err)
	}
	hb, err := store.Heartbeat(b.ctx, b.db.Pool, "worker-A", []queue.Lease{leaseA}, lease)
	if err != nil || len(hb.Lost) != 1 || len(hb.Renewed) != 0 {
		t.Errorf("A's heartbeat: %+v %v, want the lease reported lost", hb, err)
	}

	var rows int
	var gen int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*), max(lease_gen) FROM results WHERE job_id = $1`, res.Job.ID).Scan(&rows, &gen); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || gen != 3 {
		t.Fatalf("result rows = %d (gen %d), want exactly one, written under generation 3", rows, gen)
	}
	if n := b.countEvents(t, queue.EventStaleWriteRejected, leaseA.JobID, leaseA.Gen); n < 3 {
		t.Errorf("stale_write_rejected events for A's lease = %d, want at least 3 (commit, complete, release)", n)
	}
	if n := b.countEvents(t, queue.EventExpiredHolderAlive, leaseA.JobID, leaseA.Gen); n != 1 {
		t.Errorf("expired_holder_alive events for A's lease = %d, want exactly 1", n)
	}
}

// Test 3: when renewals cannot be confirmed (the database is unreachable), the job's
// context is cancelled by the local monotonic deadline, before the lease expires by the
// database's clock.
func TestHeartbeatLossCancelsContextBeforeLeaseExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, proxy := b.proxiedPool(t)

	started := make(chan queue.Lease, 1)
	type cancelled struct {
		cause           error
		leaseStillValid bool
		err             error
	}
	got := make(chan cancelled, 1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[resultArgs]) error {
		started <- job.Lease()
		<-ctx.Done()
		// Ask the database (directly, not through the cut link) whether the lease is
		// still valid at the moment the worker gave up.
		var valid bool
		err := b.db.Pool.QueryRow(context.Background(),
			`SELECT lease_expires_at > now() FROM fenceq_jobs WHERE id = $1 AND lease_gen = $2`,
			job.ID, job.Lease().Gen).Scan(&valid)
		got <- cancelled{cause: context.Cause(ctx), leaseStillValid: valid, err: err}
		return ctx.Err()
	}, nil)
	cfg := b.fastConfig(3 * time.Second)
	cfg.HeartbeatInterval = 300 * time.Millisecond
	cfg.LeaseMargin = 500 * time.Millisecond
	cfg.WriteTimeout = 250 * time.Millisecond
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	}()
	if _, err := fenceq.Enqueue(b.ctx, b.db.Pool, resultArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	recv(t, started, 10*time.Second, "the job to start")
	proxy.SetBlackhole(true)
	// The network heals before the pools close; connections opened during the cut
	// (pgx's cancel requests, waiting for replies that were dropped) are reset.
	t.Cleanup(func() { proxy.SetBlackhole(false); proxy.ResetAll() })
	c := recv(t, got, 15*time.Second, "the job's context to be cancelled")
	if proxy.Dropped() == 0 {
		t.Fatal("no heartbeat traffic was dropped: the fault did not happen")
	}
	if !errors.Is(c.cause, fenceq.ErrLeaseDeadline) {
		t.Fatalf("context cause = %v, want ErrLeaseDeadline", c.cause)
	}
	if c.err != nil || !c.leaseStillValid {
		t.Fatalf("lease still valid in the database when the job was cancelled = %v (%v); the worker must give up first", c.leaseStillValid, c.err)
	}
}

// Test 3, second half: a heartbeat that finds the lease revoked (here by an operator's
// requeue) cancels the job's context at once, long before the lease would run out.
func TestHeartbeatReportingLostLeaseCancelsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan queue.Lease, 1)
	causes := make(chan error, 1)
	var runs atomic.Int64
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[resultArgs]) error {
		if runs.Add(1) > 1 {
			return nil
		}
		started <- job.Lease()
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}, nil)
	cfg := b.fastConfig(time.Minute)
	cfg.HeartbeatInterval = 100 * time.Millisecond
	b.startWorker(t, cfg)
	if _, err := fenceq.Enqueue(b.ctx, b.db.Pool, resultArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	l := recv(t, started, 10*time.Second, "the job to start")
	if _, err := store.RequeueJob(b.ctx, b.db.Pool, l.JobID); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, queue.ErrLeaseLost) {
			t.Fatalf("cause = %v, want ErrLeaseLost", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("job context not cancelled after its lease was revoked")
	}
	// The event is written right after the context is cancelled.
	fenceqtest.WaitFor(t, "a heartbeat_lost event", 10*time.Second, func() bool {
		return b.countEvents(t, queue.EventHeartbeatLost, l.JobID, l.Gen) == 1
	})
}

// Test 4: a job that keeps heartbeating keeps its lease however long it runs: it runs
// past its first lease's expiry, the reaper runs every 100ms, and it is never revoked:
// completed at generation 1.
func TestLongJobThatHeartbeatsIsNeverReaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The lease leaves a heartbeat (every third of it) more than three seconds to land,
	// so that only heartbeats that do not work, not a loaded machine, lose it. The
	// handler runs until the test has seen its first lease's expiry pass with the job
	// still running under that lease, renewed.
	const lease = 5 * time.Second
	var firstExpiry atomic.Value
	outlived := make(chan struct{})
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[resultArgs]) error {
		firstExpiry.Store(*job.LeaseExpiresAt)
		select {
		case <-outlived:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		return writeResult(ctx, job)
	}, nil)
	cfg := b.fastConfig(lease)
	cfg.ReaperInterval = 100 * time.Millisecond
	b.startWorker(t, cfg)
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, resultArgs{Value: "long"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fenceqtest.WaitFor(t, "the job to outlive its first lease, renewed", time.Minute, func() bool {
		mid, err := store.GetJob(b.ctx, b.db.Pool, res.Job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if mid.State != queue.StateRunning && mid.State != queue.StateAvailable || mid.LeaseGen > 1 {
			t.Fatalf("mid-run: job is %s at generation %d before its handler was let finish; want running at 1 (never revoked)",
				mid.State, mid.LeaseGen)
		}
		first, ok := firstExpiry.Load().(time.Time)
		return ok && time.Now().After(first) && mid.State == queue.StateRunning && mid.LeaseGen == 1 &&
			mid.LeaseExpiresAt != nil && mid.LeaseExpiresAt.After(first)
	})
	close(outlived)
	done := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, time.Minute)
	if done.LeaseGen != 1 || done.Attempt != 1 {
		t.Fatalf("completed at gen %d attempt %d; want 1 and 1 (never revoked)", done.LeaseGen, done.Attempt)
	}
	if n := b.countEvents(t, queue.EventRevoked, res.Job.ID, 1); n != 0 {
		t.Fatalf("revoked events = %d, want 0", n)
	}
}

// Graceful shutdown: a job still running when the shutdown deadline passes is cancelled
// and its lease released (fenced); its handler's late commit is rejected, and the job is
// available again without an attempt used up.
func TestShutdownReleasesLeasesOfUnfinishedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan struct{}, 1)
	commitErr := make(chan error, 1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[resultArgs]) error {
		started <- struct{}{}
		<-ctx.Done()
		err := writeResult(context.Background(), job)
		commitErr <- err
		return err
	}, nil)
	w, err := fenceq.NewWorker(b.db.Pool, b.fastConfig(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, resultArgs{Value: "late"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, started, 10*time.Second, "the job to start")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := recv(t, commitErr, 10*time.Second, "the late commit"); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("commit after release: %v, want ErrLeaseLost", err)
	}
	j, err := store.GetJob(b.ctx, b.db.Pool, res.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != queue.StateAvailable || j.Attempt != 0 || j.LeasedBy != nil {
		t.Fatalf("after release: state %s attempt %d leased_by %v; want available, 0, none", j.State, j.Attempt, j.LeasedBy)
	}
	var rows int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM results`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("result rows = %d (%v), want 0", rows, err)
	}
	var workers int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_workers`).Scan(&workers); err != nil || workers != 0 {
		t.Fatalf("worker rows after stop = %d (%v), want 0", workers, err)
	}
}

// recv receives from ch or fails the test after within: a bug must fail the test, not
// hang it until go test's timeout.
func recv[T any](t *testing.T, ch <-chan T, within time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(within):
		t.Fatalf("timed out after %s waiting for %s", within, what)
		panic("unreachable")
	}
}

// TestLostCommitReplyIsSettledAfterTheDatabaseReturns drops the reply to a job's fenced
// COMMIT and keeps the database unreachable for a second and a half after it (every
// new connection refused, as while a primary fails over): the worker must keep asking
// whether its commit landed until the database answers, find that it did, report the
// commit as done to the handler, and write nothing more — not give up at the first
// refused connection and leave the handler with an error for a commit that landed.
func TestLostCommitReplyIsSettledAfterTheDatabaseReturns(t *testing.T) {
	t.Parallel()
	for name, commit := range map[string]func(context.Context, *fenceq.Job[resultArgs]) error{
		"Commit": writeResult, "CommitWrites": writeResultPipelined,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testLostCommitReplyIsSettled(t, commit)
		})
	}
}

func testLostCommitReplyIsSettled(t *testing.T, commit func(context.Context, *fenceq.Job[resultArgs]) error) {
	b := setup(t)
	pool, proxy := b.proxiedPool(t)
	commitErr := make(chan error, 1)
	fenceq.AddHandler(b.hs, func(ctx context.Context, job *fenceq.Job[resultArgs]) error {
		err := commit(ctx, job)
		commitErr <- err
		return err
	}, nil)
	cfg := b.fastConfig(5 * time.Second)
	cfg.DisablePeriodic = true // the one COMMIT whose reply is held must be the job's
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	}()
	held := make(chan faultproxy.CommitDrop, 1)
	proxy.HoldCommitReplies(1, func(d faultproxy.CommitDrop) {
		proxy.SetRefuse(true)
		held <- d
	})
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, resultArgs{Value: "once"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, held, 15*time.Second, "the job's COMMIT reply to be held")
	if d.Tag != "COMMIT" {
		t.Fatalf("held reply %q; want COMMIT", d.Tag)
	}
	proxy.ResetAll()                    // the held connection and the pool's idle ones: the server is gone
	time.Sleep(1500 * time.Millisecond) // the outage: every connection attempt is refused meanwhile
	proxy.SetRefuse(false)
	if err := recv(t, commitErr, 15*time.Second, "job.Commit to return"); err != nil {
		t.Fatalf("job.Commit = %v for a commit that landed; want nil once the database answers", err)
	}
	fenceqtest.WaitFor(t, "the job to be completed", 20*time.Second, func() bool {
		j, err := store.GetJob(b.ctx, b.db.Pool, res.Job.ID)
		return err == nil && j.State == queue.StateCompleted
	})
	j, err := store.GetJob(b.ctx, b.db.Pool, res.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Attempt != 1 || j.LeaseGen != 1 {
		t.Fatalf("job completed on attempt %d, generation %d; want 1 and 1 (settled by looking, not re-run)", j.Attempt, j.LeaseGen)
	}
	if n := b.countEvents(t, queue.EventStaleWriteRejected, res.Job.ID, 1); n != 0 {
		t.Fatalf("%d stale writes rejected for the landed lease: the worker wrote again instead of looking", n)
	}
	if proxy.Refused() == 0 {
		t.Fatal("no connection was refused during the outage: the worker never had to ask again")
	}
}
