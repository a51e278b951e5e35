package order_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/jobs/order"
)

// Test 5: TTL cleanup runs concurrently with retries. Keys expire (150 ms TTL) and are
// deleted while their clients keep retrying; cleanup never deletes an in-flight key,
// every retry still gets the one order, and after expiry the keys are gone.
func TestCleanupConcurrentWithRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{cfg: order.Config{
		KeyTTL: 150 * time.Millisecond,
		// A generous wait: retries queue behind each owner's transaction, and on a busy
		// machine one can outlast the default 2 s. This test is about cleanup and
		// agreement, not about giving up (TestInFlightRequestGets409 is).
		InflightWait: 20 * time.Second,
		BeforeCommit: func(ctx context.Context) error {
			time.Sleep(20*time.Millisecond + rand.N(60*time.Millisecond))
			return nil
		},
	}})
	// An in-flight key of the same scope, committed and long expired: what an owner
	// recording progress in separate transactions leaves while it works.
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := idempotency.HashRequest("generic")
	if res, err := idempotency.Claim(b.ctx, tx, idempotency.ClaimParams{Scope: order.Scope, Key: "in-flight", RequestHash: h, TTL: time.Millisecond}); err != nil || !res.Owned {
		t.Fatalf("claim in-flight key: %v", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var deleted, passes atomic.Int64
	cleanupDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				cleanupDone <- nil
				return
			default:
			}
			n, err := housekeeping.CleanupIdempotencyKeys(b.ctx, b.db.Pool, 5, 0)
			if err != nil {
				cleanupDone <- err
				return
			}
			deleted.Add(n)
			passes.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()

	const keys, every, fires = 4, 40 * time.Millisecond, 30 // ~1.2 s of retries per key
	results := make([][]response, keys)
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mu sync.Mutex
			var fired sync.WaitGroup
			for range fires {
				fired.Add(1)
				go func() {
					defer fired.Done()
					r := b.post(t, fmt.Sprintf("ttl-%d", k), orderBody(k+1))
					mu.Lock()
					results[k] = append(results[k], r)
					mu.Unlock()
				}()
				time.Sleep(every)
			}
			fired.Wait()
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-cleanupDone; err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	// Prove keys really expired and were deleted while the retries went on.
	if deleted.Load() == 0 {
		t.Fatalf("cleanup ran %d passes and deleted nothing: no key expired during the retries", passes.Load())
	}

	t.Logf("cleanup: %d passes deleted %d keys during the retries", passes.Load(), deleted.Load())
	ids := make([]int64, keys)
	for k, rs := range results {
		key := fmt.Sprintf("ttl-%d", k)
		for _, r := range rs {
			if r.status != http.StatusCreated {
				t.Fatalf("%s: %d %s", key, r.status, r.body)
			}
			if ids[k] == 0 {
				ids[k] = r.order.ID
			}
			if r.order.ID != ids[k] {
				t.Fatalf("%s: orders %d and %d", key, ids[k], r.order.ID)
			}
		}
		b.checkOrderRows(t, key, ids[k], 2)
	}
	if rec, err := idempotency.Get(b.ctx, b.db.Pool, order.Scope, "in-flight"); err != nil || rec.State != idempotency.StateInFlight || !rec.Expired {
		t.Fatalf("the expired in-flight key after cleanup: %+v %v, want it kept", rec, err)
	}

	// After expiry, the keys are gone.
	b.waitFor(t, "the order keys to expire", func() bool {
		return b.count(t, `SELECT count(*) FROM fenceq_idempotency_keys WHERE state = 'finished' AND expires_at >= now()`) == 0
	})
	if _, err := housekeeping.CleanupIdempotencyKeys(b.ctx, b.db.Pool, 5, 0); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_idempotency_keys WHERE key LIKE 'ttl-%'`); n != 0 {
		t.Fatalf("%d order keys left after expiry and cleanup", n)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_idempotency_keys`); n != 1 {
		t.Fatalf("%d keys left, want only the in-flight one", n)
	}
	// A retry after that still gets its order (orders.idempotency_key decides), and a
	// different request with the expired key is still refused.
	for k := range keys {
		key := fmt.Sprintf("ttl-%d", k)
		r := b.post(t, key, orderBody(k+1))
		if r.status != http.StatusCreated || r.order.ID != ids[k] || r.header.Get(order.HeaderReplayed) != "true" {
			t.Fatalf("%s retry after cleanup: %d %s, want a replay of order %d", key, r.status, r.body, ids[k])
		}
		if r := b.post(t, key, orderBody(k+7)); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("%s with another request after cleanup: %d %s, want 422", key, r.status, r.body)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM orders`); n != keys {
		t.Fatalf("%d orders, want %d", n, keys)
	}
	if m := b.metrics.Values(); m.Created != keys {
		t.Fatalf("metrics %+v, want %d created", m, keys)
	}
}
