package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/queue"
)

// counts is a Metrics that counts each decision.
type counts struct{ replays, conflicts, waits atomic.Int64 }

func (c *counts) Replay(string)       { c.replays.Add(1) }
func (c *counts) Conflict(string)     { c.conflicts.Add(1) }
func (c *counts) InflightWait(string) { c.waits.Add(1) }

// Do runs the work once per key: the first call stores its response, a retry with the
// same hash gets it back without running the work, another hash is ErrKeyReuse, and a
// failed work leaves the key free for the next attempt.
func TestScopeDoRunsWorkOncePerKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE effects (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	m := &counts{}
	s := &idempotency.Scope{Name: "payments", Metrics: m}
	var ran atomic.Int64
	work := func(body string) idempotency.Work {
		return func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
			ran.Add(1)
			if _, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ($1)`, "k1"); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{ResourceID: "p-1", Status: 201, Body: []byte(body)}, nil
		}
	}
	hash := hashOf(t, map[string]int{"amount": 5})

	first, err := s.Do(b.ctx, b.db.Pool, "k1", hash, work("first"))
	if err != nil || first.Replayed || string(first.Response.Body) != "first" || first.Record.State != idempotency.StateFinished {
		t.Fatalf("first call: %+v %v", first, err)
	}
	again, err := s.Do(b.ctx, b.db.Pool, "k1", hash, work("second"))
	if err != nil || !again.Replayed || string(again.Response.Body) != "first" || again.Response.Status != 201 ||
		again.Response.ResourceID != "p-1" {
		t.Fatalf("retry: %+v %v; want the first response replayed", again, err)
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("work ran %d times, want 1", n)
	}
	other, err := s.Do(b.ctx, b.db.Pool, "k1", hashOf(t, map[string]int{"amount": 6}), work("third"))
	if !errors.Is(err, idempotency.ErrKeyReuse) || other == nil || other.Record == nil || string(other.Record.Response) != "first" {
		t.Fatalf("another request with the key: %+v %v; want ErrKeyReuse with the stored record", other, err)
	}
	if m.replays.Load() != 1 || m.conflicts.Load() != 1 {
		t.Fatalf("metrics: %d replays, %d conflicts; want 1 and 1", m.replays.Load(), m.conflicts.Load())
	}

	boom := errors.New("boom")
	if _, err := s.Do(b.ctx, b.db.Pool, "k2", hash, func(context.Context, pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{}, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("failing work: %v", err)
	}
	if _, err := idempotency.Get(b.ctx, b.db.Pool, "payments", "k2"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("key of a failed work: %v; want it rolled back (ErrNotFound)", err)
	}
	if _, err := s.Do(b.ctx, b.db.Pool, "", hash, work("x")); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("empty key: %v, want ErrInvalid", err)
	}
}

// Concurrent calls with one key run the work once: the others wait for the first
// transaction and replay its response.
func TestScopeDoConcurrentRetriesReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const calls = 8
	// The calls' own pool, named so that their sessions are found in pg_stat_activity.
	app := "fenceq-idem-storm-" + b.db.Schema
	pcfg, err := pgxpool.ParseConfig(b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pcfg.MaxConns = calls
	pool, err := pgxpool.NewWithConfig(b.ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	m := &counts{}
	// Wait bounds a retry's wait for the first call, which holds its key until the
	// test has seen every retry waiting: long enough for a busy machine.
	s := &idempotency.Scope{Name: "orders", Wait: time.Minute, Metrics: m}
	hash := hashOf(t, "same request")
	var ran atomic.Int64
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	var wg sync.WaitGroup
	results := make([]*idempotency.Result, calls)
	errs := make([]error, len(results))
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = s.Do(b.ctx, pool, "storm", hash, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
				ran.Add(1)
				<-release // uncommitted until the retries wait for it
				return idempotency.Response{Status: 201, Body: []byte("placed")}, nil
			})
		}()
	}
	// The retries arrive while the first call is uncommitted: each waits on its lock
	// (on Citus, in the worker node's backend that works for the session, which shares
	// its global pid).
	waits := `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`
	if fenceqtest.OnCitus(t) {
		waits = `SELECT count(DISTINCT w.global_pid) FROM citus_stat_activity w
WHERE w.wait_event_type = 'Lock'
  AND w.global_pid IN (SELECT c.global_pid FROM citus_stat_activity c WHERE c.application_name = $1)`
	}
	fenceqtest.WaitFor(t, fmt.Sprintf("%d calls waiting for the first one's key", calls-1), time.Minute, func() bool {
		var n int
		if err := b.db.Pool.QueryRow(b.ctx, waits, app).Scan(&n); err != nil {
			t.Fatalf("read the sessions' lock waits: %v", err)
		}
		return n == calls-1
	})
	releaseAll()
	wg.Wait()
	replayed, waited := 0, 0
	for i, r := range results {
		if errs[i] != nil || string(r.Response.Body) != "placed" {
			t.Fatalf("call %d: %+v %v", i, r, errs[i])
		}
		if r.Replayed {
			replayed++
			if r.Waited {
				waited++
			}
		}
	}
	if ran.Load() != 1 || replayed != len(results)-1 || m.replays.Load() != int64(replayed) {
		t.Fatalf("work ran %d times, %d replays (metric %d); want once and %d replays", ran.Load(), replayed,
			m.replays.Load(), len(results)-1)
	}
	if waited != replayed || m.waits.Load() != int64(waited) {
		t.Fatalf("%d of %d replays waited for the first call (metric %d); want all", waited, replayed, m.waits.Load())
	}
}

// DoTx works in the caller's transaction: nothing is visible until it commits, and a
// rollback undoes the key with the work.
func TestScopeDoTxIsPartOfTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s := &idempotency.Scope{Name: "jobs"}
	hash := hashOf(t, 1)
	tx := b.begin(t)
	res, err := s.DoTx(b.ctx, tx, "k", hash, func(context.Context, pgx.Tx) (idempotency.Response, error) {
		return idempotency.Response{Body: []byte("done")}, nil
	})
	if err != nil || res.Replayed {
		t.Fatalf("DoTx: %+v %v", res, err)
	}
	if _, err := idempotency.Get(b.ctx, b.db.Pool, "jobs", "k"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("key visible before commit: %v", err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Get(b.ctx, b.db.Pool, "jobs", "k"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("key after rollback: %v", err)
	}
}
