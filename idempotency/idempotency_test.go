package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/queue"
)

type testBundle struct {
	db  *fenceqtest.DB
	ctx context.Context
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &testBundle{db: fenceqtest.New(t, nil), ctx: ctx}
}

func hashOf(t *testing.T, v any) []byte {
	t.Helper()
	h, err := idempotency.HashRequest(v)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (b *testBundle) begin(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// claimFinish claims key in its own transaction, finishes it with body and commits.
func (b *testBundle) claimFinish(t *testing.T, p idempotency.ClaimParams, body string) *idempotency.Record {
	t.Helper()
	tx := b.begin(t)
	res, err := idempotency.Claim(b.ctx, tx, p)
	if err != nil || !res.Owned {
		t.Fatalf("claim %q: owned %v err %v", p.Key, res != nil && res.Owned, err)
	}
	rec, err := idempotency.Finish(b.ctx, tx, res.Record, idempotency.Response{ResourceID: "r-" + p.Key, Status: 201, Body: []byte(body)})
	if err != nil {
		t.Fatalf("finish %q: %v", p.Key, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return rec
}

// waitExpired polls the database's clock until the key's expires_at has passed.
func (b *testBundle) waitExpired(t *testing.T, scope, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := idempotency.Get(b.ctx, b.db.Pool, scope, key)
		if err != nil {
			t.Fatalf("get key %q: %v", key, err)
		}
		if rec.Expired {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q did not expire (expires_at %s)", key, rec.ExpiresAt)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// backendOf names the backend of tx for waitLockWait: its pid, and on Citus the global
// pid that the worker node's backend working for it shares. Read it before tx is busy.
type backendOf struct {
	pid  uint32
	gpid int64
}

func (b *testBundle) backend(t *testing.T, tx pgx.Tx) backendOf {
	t.Helper()
	be := backendOf{pid: tx.Conn().PgConn().PID()}
	if fenceqtest.OnCitus(t) {
		if err := tx.QueryRow(b.ctx, `SELECT citus_backend_gpid()`).Scan(&be.gpid); err != nil {
			t.Fatalf("read the global pid: %v", err)
		}
	}
	return be
}

// waitLockWait returns once the backend is blocked on a lock: on Citus, on the worker
// node that holds the table.
func (b *testBundle) waitLockWait(t *testing.T, be backendOf) {
	t.Helper()
	query := `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`
	arg := any(be.pid)
	if be.gpid != 0 {
		query = `SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM citus_stat_activity WHERE global_pid = $1`
		arg = be.gpid
	}
	pid := be.pid
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting bool
		err := b.db.Pool.QueryRow(b.ctx, query, arg).Scan(&waiting)
		if err != nil {
			t.Fatalf("read pg_stat_activity: %v", err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d never waited on a lock", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestIdempotencyClaimFinishReplayReuse(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h1, h2 := hashOf(t, map[string]int{"n": 1}), hashOf(t, map[string]int{"n": 2})
	p := idempotency.ClaimParams{Scope: "test", Key: "key-1", RequestHash: h1}
	first := b.claimFinish(t, p, `{"id":1}`)
	if first.State != idempotency.StateFinished || first.ResourceID != "r-key-1" || first.ResponseStatus != 201 || first.Gen != 1 {
		t.Fatalf("finished record: %+v", first)
	}
	if d := first.ExpiresAt.Sub(first.CreatedAt); d != idempotency.DefaultTTL {
		t.Fatalf("default TTL: expires %s after creation", d)
	}

	tx := b.begin(t)
	res, err := idempotency.Claim(b.ctx, tx, p)
	if err != nil || res.Owned || res.Waited || res.TookOver {
		t.Fatalf("replay claim: %+v %v", res, err)
	}
	if string(res.Record.Response) != `{"id":1}` || res.Record.ResponseStatus != 201 || res.Record.ResourceID != "r-key-1" {
		t.Fatalf("replayed record: %+v", res.Record)
	}
	_ = tx.Rollback(b.ctx)

	tx = b.begin(t)
	res, err = idempotency.Claim(b.ctx, tx, idempotency.ClaimParams{Scope: "test", Key: "key-1", RequestHash: h2})
	if !errors.Is(err, idempotency.ErrKeyReuse) || res == nil || res.Record.ResourceID != "r-key-1" {
		t.Fatalf("different request: %+v %v, want ErrKeyReuse with the stored record", res, err)
	}
	_ = tx.Rollback(b.ctx)

	// The same key in another scope is another key.
	b.claimFinish(t, idempotency.ClaimParams{Scope: "other", Key: "key-1", RequestHash: h2}, `{}`)
}

func TestIdempotencyConcurrentOwner(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		name := map[bool]string{true: "OwnerCommits", false: "OwnerRollsBack"}[commit]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := hashOf(t, "req")
			p := idempotency.ClaimParams{Scope: "test", Key: "k", RequestHash: h, Wait: 30 * time.Second}
			owner := b.begin(t)
			res, err := idempotency.Claim(b.ctx, owner, p)
			if err != nil || !res.Owned {
				t.Fatalf("owner claim: %+v %v", res, err)
			}

			waiter := b.begin(t)
			be := b.backend(t, waiter)
			type outcome struct {
				res *idempotency.ClaimResult
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				r, err := idempotency.Claim(b.ctx, waiter, p)
				done <- outcome{r, err}
			}()
			// Prove the second claim really waits for the owner's transaction.
			b.waitLockWait(t, be)
			select {
			case o := <-done:
				t.Fatalf("claim returned while the owner was in flight: %+v %v", o.res, o.err)
			default:
			}

			if commit {
				if _, err := idempotency.Finish(b.ctx, owner, res.Record, idempotency.Response{ResourceID: "42", Status: 201, Body: []byte("body")}); err != nil {
					t.Fatal(err)
				}
				if err := owner.Commit(b.ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				_ = owner.Rollback(b.ctx) // the owner's process died
			}
			o := <-done
			if o.err != nil {
				t.Fatalf("waiter: %v", o.err)
			}
			if commit {
				if o.res.Owned || !o.res.Waited || o.res.Record.ResourceID != "42" || string(o.res.Record.Response) != "body" {
					t.Fatalf("waiter after commit: %+v (record %+v), want a replay that waited", o.res, o.res.Record)
				}
				return
			}
			if !o.res.Owned {
				t.Fatalf("waiter after rollback: %+v, want ownership", o.res)
			}
			if _, err := idempotency.Finish(b.ctx, waiter, o.res.Record, idempotency.Response{ResourceID: "43"}); err != nil {
				t.Fatal(err)
			}
			if err := waiter.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			rec, err := idempotency.Get(b.ctx, b.db.Pool, "test", "k")
			if err != nil || rec.ResourceID != "43" || rec.State != idempotency.StateFinished {
				t.Fatalf("stored: %+v %v", rec, err)
			}
		})
	}
}

func TestIdempotencyWaitTimesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := idempotency.ClaimParams{Scope: "test", Key: "slow", RequestHash: hashOf(t, 1), Wait: 100 * time.Millisecond}
	owner := b.begin(t)
	if res, err := idempotency.Claim(b.ctx, owner, p); err != nil || !res.Owned {
		t.Fatalf("owner claim: %+v %v", res, err)
	}
	waiter := b.begin(t)
	_, err := idempotency.Claim(b.ctx, waiter, p)
	if !errors.Is(err, idempotency.ErrKeyInFlight) {
		t.Fatalf("claim while the owner holds the key: %v, want ErrKeyInFlight", err)
	}
	// The timed-out statement aborted the waiter's transaction.
	if _, err := waiter.Exec(b.ctx, `SELECT 1`); err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("waiter transaction after the timeout: %v, want aborted", err)
	}
}

func TestIdempotencyClaimRestoresLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx := b.begin(t)
	if _, err := tx.Exec(b.ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
		t.Fatal(err)
	}
	res, err := idempotency.Claim(b.ctx, tx, idempotency.ClaimParams{Scope: "test", Key: "k", RequestHash: hashOf(t, 1), Wait: 50 * time.Millisecond})
	if err != nil || !res.Owned {
		t.Fatalf("claim: %+v %v", res, err)
	}
	var lt, saved string
	if err := tx.QueryRow(b.ctx, `SHOW lock_timeout`).Scan(&lt); err != nil || lt != "7s" {
		t.Fatalf("lock_timeout after the claim: %q %v, want the caller's 7s", lt, err)
	}
	if fenceqtest.OnCitus(t) {
		// The Citus path restores with SET LOCAL from values it read first and keeps no
		// saved copy; TestIdempotencyWaitTimesOut shows its wait is in force.
		return
	}
	// The claim did change it (and saved the caller's value first): a claim that never
	// set lock_timeout would pass the check above too.
	if err := tx.QueryRow(b.ctx, `SELECT current_setting('fenceq.saved_lock_timeout', true)`).Scan(&saved); err != nil || saved != "7s" {
		t.Fatalf("saved lock_timeout: %q %v, want 7s (the claim did not set its own wait)", saved, err)
	}
}

func TestIdempotencyInFlightKeyExpiryAndTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := idempotency.ClaimParams{Scope: "test", Key: "multi-tx", RequestHash: hashOf(t, "a"), TTL: time.Millisecond}
	// An owner that records progress in separate transactions: the claim commits in flight.
	tx := b.begin(t)
	first, err := idempotency.Claim(b.ctx, tx, p)
	if err != nil || !first.Owned {
		t.Fatalf("claim: %+v %v", first, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitExpired(t, "test", "multi-tx")

	// Cleanup never deletes an in-flight key, however expired.
	n, err := idempotency.DeleteExpired(b.ctx, b.db.Pool, 100)
	if err != nil || n != 0 {
		t.Fatalf("cleanup deleted %d (%v), want 0", n, err)
	}
	if rec, err := idempotency.Get(b.ctx, b.db.Pool, "test", "multi-tx"); err != nil || rec.State != idempotency.StateInFlight {
		t.Fatalf("in-flight key after cleanup: %+v %v", rec, err)
	}

	// A new request (even a different one) takes the expired key over; the old owner
	// can then no longer finish it.
	p2 := p
	p2.RequestHash, p2.TTL = hashOf(t, "b"), time.Hour
	tx = b.begin(t)
	second, err := idempotency.Claim(b.ctx, tx, p2)
	if err != nil || !second.Owned || !second.TookOver || second.Record.Gen != first.Record.Gen+1 {
		t.Fatalf("takeover: %+v %v", second, err)
	}
	if _, err := idempotency.Finish(b.ctx, tx, second.Record, idempotency.Response{ResourceID: "new"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Finish(b.ctx, b.db.Pool, first.Record, idempotency.Response{ResourceID: "stale"}); !errors.Is(err, idempotency.ErrNotOwned) {
		t.Fatalf("stale owner's finish: %v, want ErrLeaseLost", err)
	}
	if err := idempotency.Release(b.ctx, b.db.Pool, first.Record); !errors.Is(err, idempotency.ErrNotOwned) {
		t.Fatalf("stale owner's release: %v, want ErrLeaseLost", err)
	}
	rec, err := idempotency.Get(b.ctx, b.db.Pool, "test", "multi-tx")
	if err != nil || rec.ResourceID != "new" || !bytes.Equal(rec.RequestHash, p2.RequestHash) {
		t.Fatalf("stored after takeover: %+v %v", rec, err)
	}

	// A committed in-flight key that is not expired is reported in flight, and its
	// owner can release it.
	p3 := idempotency.ClaimParams{Scope: "test", Key: "progress", RequestHash: hashOf(t, "c")}
	tx = b.begin(t)
	third, err := idempotency.Claim(b.ctx, tx, p3)
	if err != nil || !third.Owned {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	tx = b.begin(t)
	if res, err := idempotency.Claim(b.ctx, tx, p3); !errors.Is(err, idempotency.ErrKeyInFlight) || res.Record.State != idempotency.StateInFlight {
		t.Fatalf("claim of a committed in-flight key: %+v %v", res, err)
	}
	_ = tx.Rollback(b.ctx)
	if err := idempotency.Release(b.ctx, b.db.Pool, third.Record); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Get(b.ctx, b.db.Pool, "test", "progress"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("released key: %v, want ErrNotFound", err)
	}
}

func TestIdempotencyCleanupDeletesOnlyExpiredFinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, k := range []string{"e1", "e2", "e3", "e4", "e5"} {
		b.claimFinish(t, idempotency.ClaimParams{Scope: "test", Key: k, RequestHash: hashOf(t, k), TTL: time.Millisecond}, "x")
	}
	b.claimFinish(t, idempotency.ClaimParams{Scope: "test", Key: "live", RequestHash: hashOf(t, 0), TTL: time.Hour}, "x")
	b.waitExpired(t, "test", "e5")
	var total int64
	for {
		n, err := idempotency.DeleteExpired(b.ctx, b.db.Pool, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n > 2 {
			t.Fatalf("batch of 2 deleted %d", n)
		}
		total += n
		if n < 2 {
			break
		}
	}
	if total != 5 {
		t.Fatalf("deleted %d expired keys, want 5", total)
	}
	if _, err := idempotency.Get(b.ctx, b.db.Pool, "test", "live"); err != nil {
		t.Fatalf("unexpired key: %v", err)
	}
	// An expired key that was deleted is simply absent: a claim owns it anew.
	tx := b.begin(t)
	res, err := idempotency.Claim(b.ctx, tx, idempotency.ClaimParams{Scope: "test", Key: "e1", RequestHash: hashOf(t, "other")})
	if err != nil || !res.Owned || res.TookOver {
		t.Fatalf("claim after cleanup: %+v %v", res, err)
	}
}

func TestIdempotencyExpiredFinishedKeyIsTakenOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.claimFinish(t, idempotency.ClaimParams{Scope: "test", Key: "k", RequestHash: hashOf(t, 1), TTL: time.Millisecond}, "old")
	b.waitExpired(t, "test", "k")
	tx := b.begin(t)
	// A different request is not ErrKeyReuse once the key expired.
	res, err := idempotency.Claim(b.ctx, tx, idempotency.ClaimParams{Scope: "test", Key: "k", RequestHash: hashOf(t, 2)})
	if err != nil || !res.Owned || !res.TookOver || res.Record.State != idempotency.StateInFlight || res.Record.Response != nil {
		t.Fatalf("claim of an expired key: %+v %v", res, err)
	}
}

func TestIdempotencyValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := hashOf(t, 1)
	cases := map[string]idempotency.ClaimParams{
		"EmptyKey":       {Scope: "s", Key: "", RequestHash: good},
		"LongKey":        {Scope: "s", Key: strings.Repeat("k", 256), RequestHash: good},
		"NonPrintable":   {Scope: "s", Key: "a\x00b", RequestHash: good},
		"EmptyScope":     {Scope: "", Key: "k", RequestHash: good},
		"BadScope":       {Scope: "a b", Key: "k", RequestHash: good},
		"EmptyHash":      {Scope: "s", Key: "k"},
		"LongHash":       {Scope: "s", Key: "k", RequestHash: make([]byte, 65)},
		"NegativeTTL":    {Scope: "s", Key: "k", RequestHash: good, TTL: -time.Second},
		"SubMicroTTLKey": {Scope: "s", Key: "k", RequestHash: good, TTL: time.Nanosecond},
	}
	for name, p := range cases {
		tx := b.begin(t)
		if _, err := idempotency.Claim(b.ctx, tx, p); !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
		_ = tx.Rollback(b.ctx)
	}
	// 255 bytes is the limit, inclusive.
	b.claimFinish(t, idempotency.ClaimParams{Scope: "s", Key: strings.Repeat("k", 255), RequestHash: good}, "")
	if _, err := idempotency.DeleteExpired(b.ctx, b.db.Pool, 0); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("cleanup limit 0: %v, want ErrInvalid", err)
	}
}
