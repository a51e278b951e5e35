package order_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/queue"
)

// Test 1: 50 concurrent requests with one key make one order, and every response
// carries it.
func TestConcurrentRequestsOneKey(t *testing.T) {
	t.Parallel()
	// A generous wait: this test is about agreement, not about giving up.
	b := setup(t, bundleOpts{cfg: order.Config{InflightWait: 20 * time.Second}})
	const n = 50
	body := orderBody(2)
	start := make(chan struct{})
	out := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = b.post(t, "same-key", body)
		}()
	}
	close(start)
	wg.Wait()

	first := 0
	for i, r := range out {
		if r.status != http.StatusCreated {
			t.Fatalf("response %d: %d %s, want 201", i, r.status, r.body)
		}
		if r.order.ID != out[0].order.ID || !bytes.Equal(r.body, out[0].body) {
			t.Fatalf("response %d: order %d body %s, response 0: order %d body %s", i, r.order.ID, r.body, out[0].order.ID, out[0].body)
		}
		if r.header.Get(order.HeaderReplayed) != "true" {
			first++
		}
	}
	if first != 1 {
		t.Fatalf("%d responses were not marked replayed, want exactly 1", first)
	}
	b.checkOrderRows(t, "same-key", out[0].order.ID, 2)
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	m := b.metrics.Values()
	if m.Created != 1 || m.Replays != n-1 || m.Conflicts != 0 {
		t.Fatalf("metrics %+v, want 1 created and %d replays", m, n-1)
	}
}

// Test 2: a retry storm. Each client fires its request every 300 ms while every placing
// transaction is held 400–600 ms before COMMIT (the incident's index lag). Exactly one
// order per key, and every client ends up with that order's id.
func TestRetryStorm(t *testing.T) {
	t.Parallel()
	var commits atomic.Int64
	b := setup(t, bundleOpts{cfg: order.Config{
		// Shorter than most commits, so retries both wait-and-replay and get 409.
		InflightWait: 250 * time.Millisecond,
		BeforeCommit: func(ctx context.Context) error {
			commits.Add(1)
			time.Sleep(400*time.Millisecond + rand.N(200*time.Millisecond))
			return nil
		},
	}})
	const clients, every, minFires, maxFires = 3, 300 * time.Millisecond, 4, 20
	type fire struct {
		n int
		r response
	}
	results := make([][]fire, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, body := fmt.Sprintf("storm-%d", c), orderBody(c+1)
			var mu sync.Mutex
			var fired sync.WaitGroup
			succeeded := false
			tick := time.NewTicker(every)
			defer tick.Stop()
			for n := 0; n < maxFires; n++ {
				mu.Lock()
				done := succeeded && n >= minFires
				mu.Unlock()
				if done {
					break
				}
				fired.Add(1)
				go func() {
					defer fired.Done()
					r := b.post(t, key, body)
					mu.Lock()
					defer mu.Unlock()
					results[c] = append(results[c], fire{n, r})
					succeeded = succeeded || r.status == http.StatusCreated
				}()
				<-tick.C
			}
			fired.Wait()
		}()
	}
	wg.Wait()

	// Prove the storm really overlapped in-flight transactions.
	m := b.metrics.Values()
	if m.InflightWaits == 0 {
		t.Fatalf("no request met an in-flight first request (metrics %+v): the storm did not overlap", m)
	}
	if commits.Load() != clients || m.Created != clients {
		t.Fatalf("%d delayed commits and %d created orders, want %d each", commits.Load(), m.Created, clients)
	}
	var conflicts int
	for c, fires := range results {
		key := fmt.Sprintf("storm-%d", c)
		var id int64
		var body []byte
		lastOK, last409 := -1, -1
		for _, f := range fires {
			switch f.r.status {
			case http.StatusCreated:
				if id == 0 {
					id, body = f.r.order.ID, f.r.body
				}
				if f.r.order.ID != id || !bytes.Equal(f.r.body, body) {
					t.Fatalf("%s fire %d: order %d, another response had %d", key, f.n, f.r.order.ID, id)
				}
				lastOK = max(lastOK, f.n)
			case http.StatusConflict:
				if f.r.err.Error.Code != order.CodeInFlight || f.r.header.Get("Retry-After") == "" {
					t.Fatalf("%s fire %d: 409 %s", key, f.n, f.r.body)
				}
				conflicts++
				last409 = max(last409, f.n)
			default:
				t.Fatalf("%s fire %d: %d %s", key, f.n, f.r.status, f.r.body)
			}
		}
		if lastOK < 0 || last409 > lastOK {
			t.Fatalf("%s: last success at fire %d, last 409 at fire %d: a 409 was not followed by a success", key, lastOK, last409)
		}
		b.checkOrderRows(t, key, id, 2)
	}
	if n := b.count(t, `SELECT count(*) FROM orders`); n != clients {
		t.Fatalf("%d orders, want %d", n, clients)
	}
	t.Logf("storm: %d in-flight waits, %d of them answered 409; %d replays", m.InflightWaits, conflicts, m.Replays)
}

// A retry that arrives while the first request is in flight gets 409 past the wait; once
// the first request commits, retries replay it.
func TestInFlightRequestGets409(t *testing.T) {
	t.Parallel()
	inHook, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	b := setup(t, bundleOpts{cfg: order.Config{
		InflightWait: 100 * time.Millisecond,
		BeforeCommit: func(ctx context.Context) error {
			if calls.Add(1) == 1 {
				close(inHook)
				<-release
			}
			return nil
		},
	}})
	firstDone := make(chan response, 1)
	go func() { firstDone <- b.post(t, "slow", orderBody(1)) }()
	<-inHook
	r := b.post(t, "slow", orderBody(1))
	if r.status != http.StatusConflict || r.err.Error.Code != order.CodeInFlight || r.header.Get("Retry-After") != "1" {
		t.Fatalf("retry during the first request: %d %s (Retry-After %q), want 409 %s", r.status, r.body, r.header.Get("Retry-After"), order.CodeInFlight)
	}
	if m := b.metrics.Values(); m.InflightWaits != 1 {
		t.Fatalf("metrics %+v, want 1 in-flight wait", m)
	}
	close(release)
	first := <-firstDone
	if first.status != http.StatusCreated || first.header.Get(order.HeaderReplayed) != "" {
		t.Fatalf("first request: %d %v %s", first.status, first.header, first.body)
	}
	again := b.post(t, "slow", orderBody(1))
	if again.status != http.StatusCreated || again.header.Get(order.HeaderReplayed) != "true" || !bytes.Equal(again.body, first.body) {
		t.Fatalf("retry after commit: %d %v %s", again.status, again.header, again.body)
	}
	if again.header.Get("Location") != "/orders/"+itoa(first.order.ID) {
		t.Fatalf("Location %q", again.header.Get("Location"))
	}
	b.checkOrderRows(t, "slow", first.order.ID, 2)
}

// Test 3: the first request's database session dies mid-transaction (its backend is
// terminated) while a retry waits for it. The first request fails, the waiting retry
// becomes the owner, and exactly one order exists.
func TestFirstRequestDiesMidTransaction(t *testing.T) {
	t.Parallel()
	inHook, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	b := setup(t, bundleOpts{cfg: order.Config{
		InflightWait: 20 * time.Second,
		BeforeCommit: func(ctx context.Context) error {
			if calls.Add(1) == 1 {
				close(inHook)
				<-release
			}
			return nil
		},
	}})
	firstDone := make(chan response, 1)
	go func() { firstDone <- b.post(t, "dies", orderBody(1)) }()
	<-inHook // the first request holds the key, uncommitted

	retryDone := make(chan response, 1)
	go func() { retryDone <- b.post(t, "dies", orderBody(1)) }()
	// Wait until the retry is blocked on the first request's transaction.
	b.waitFor(t, "the retry to wait on a lock", func() bool {
		return b.count(t, lockWaitsOf(t), b.appName) == 1
	})
	// Kill the first request's session: it is the one idle in its transaction.
	killed := b.count(t, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
		WHERE application_name = $1 AND state = 'idle in transaction') k WHERE ok`, b.appName)
	if killed != 1 {
		t.Fatalf("terminated %d backends, want the first request's 1", killed)
	}
	close(release)

	first := <-firstDone
	if first.status != http.StatusInternalServerError || first.err.Error.Code != order.CodeInternal {
		t.Fatalf("first request after its session died: %d %s, want 500 internal", first.status, first.body)
	}
	if strings.Contains(string(first.body), "terminat") || strings.Contains(string(first.body), "SQLSTATE") {
		t.Fatalf("500 body leaks internals: %s", first.body)
	}
	retry := <-retryDone
	if retry.status != http.StatusCreated || retry.header.Get(order.HeaderReplayed) != "" {
		t.Fatalf("waiting retry: %d %v %s, want 201 as the new owner", retry.status, retry.header, retry.body)
	}
	b.checkOrderRows(t, "dies", retry.order.ID, 2)
	again := b.post(t, "dies", orderBody(1))
	if again.status != http.StatusCreated || again.order.ID != retry.order.ID || again.header.Get(order.HeaderReplayed) != "true" {
		t.Fatalf("later retry: %d %s", again.status, again.body)
	}
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if m := b.metrics.Values(); m.Created != 1 || m.Replays != 1 {
		t.Fatalf("metrics %+v, want 1 created and 1 replay", m)
	}
}

// Test 3, sequential variant: the session dies at COMMIT time with nobody waiting; the
// key is not left behind, and the client's retry creates the one order.
func TestSessionDiesThenRetry(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var b *testBundle
	var killed int64
	var killErr error
	b = setup(t, bundleOpts{cfg: order.Config{
		BeforeCommit: func(ctx context.Context) error {
			if calls.Add(1) == 1 {
				// The placing transaction is open on the service's pool, between
				// statements: its session is the one idle in transaction.
				killErr = b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS ok
					FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction') k WHERE ok`,
					b.appName).Scan(&killed)
			}
			return nil
		},
	}})
	first := b.post(t, "dies-alone", orderBody(3))
	if killErr != nil || killed != 1 || first.status != http.StatusInternalServerError || first.err.Error.Code != order.CodeInternal {
		t.Fatalf("first request: killed %d sessions (%v), got %d %s; want 1 killed and a 500", killed, killErr, first.status, first.body)
	}
	b.waitFor(t, "the killed session to roll back", func() bool {
		return b.count(t, `SELECT count(*) FROM fenceq_idempotency_keys`) == 0
	})
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders after the failed request, want 0", n)
	}
	retry := b.post(t, "dies-alone", orderBody(3))
	if retry.status != http.StatusCreated || retry.header.Get(order.HeaderReplayed) != "" {
		t.Fatalf("retry: %d %s", retry.status, retry.body)
	}
	b.checkOrderRows(t, "dies-alone", retry.order.ID, 2)
}

// Test 4: the same key with a different body is 422 and creates nothing; the same
// request written differently (whitespace, key order) is the same request.
func TestKeyReuseWithDifferentBody(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	first := b.post(t, "reuse", orderBody(1))
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	other := b.post(t, "reuse", orderBody(2))
	if other.status != http.StatusUnprocessableEntity || other.err.Error.Code != order.CodeKeyReused {
		t.Fatalf("different body: %d %s, want 422 %s", other.status, other.body, order.CodeKeyReused)
	}
	reordered := `{ "items": [ {"unit_price_cents":1250, "quantity":1, "sku":"BOOK-1"},
		{"sku":"PEN-2","unit_price_cents":199,"quantity":3} ],
		"currency": "EUR", "customer_email": "ann@example.com" }`
	same := b.post(t, "reuse", reordered)
	if same.status != http.StatusCreated || same.header.Get(order.HeaderReplayed) != "true" || !bytes.Equal(same.body, first.body) {
		t.Fatalf("same request reformatted: %d %s", same.status, same.body)
	}
	b.checkOrderRows(t, "reuse", first.order.ID, 2)
	if n := b.count(t, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if m := b.metrics.Values(); m.Conflicts != 1 || m.Replays != 1 || m.Created != 1 {
		t.Fatalf("metrics %+v", m)
	}
	got := b.get(t, "/orders/"+itoa(first.order.ID))
	if got.status != http.StatusOK || got.order.ID != first.order.ID || got.order.TotalCents != 1250+3*199 ||
		len(got.order.Items) != 2 || got.order.Items[1].SKU != "PEN-2" || !bytes.Equal(got.body, first.body) {
		t.Fatalf("GET: %d %s, POST returned %s", got.status, got.body, first.body)
	}
}

// Test 6: bad input, each with its status and error code; nothing is written.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	good := orderBody(1)
	item := `{"sku":"A","quantity":1,"unit_price_cents":1}`
	body := func(items string) string {
		return `{"customer_email":"ann@example.com","currency":"EUR","items":[` + items + `]}`
	}
	huge := `{"customer_email":"ann@example.com","currency":"EUR","items":[` + item +
		strings.Repeat(","+item, 70<<10/len(item)) + `]}`
	cases := []struct {
		name, key, body string
		headers         []string
		status          int
		code            string
	}{
		{"MissingKey", "", good, nil, 400, order.CodeMissingKey},
		{"EmptyKey", "", good, []string{order.HeaderIdempotencyKey, ""}, 400, order.CodeInvalidKey},
		{"LongKey", strings.Repeat("k", 256), good, nil, 400, order.CodeInvalidKey},
		{"TwoKeys", "a", good, []string{order.HeaderIdempotencyKey, "b"}, 400, order.CodeInvalidKey},
		{"UnknownField", "k", `{"customer_email":"ann@example.com","currency":"EUR","items":[` + item + `],"coupon":"X"}`, nil, 400, order.CodeInvalidBody},
		{"UnknownItemField", "k", body(`{"sku":"A","quantity":1,"unit_price_cents":1,"discount":5}`), nil, 400, order.CodeInvalidBody},
		{"NegativeQuantity", "k", body(`{"sku":"A","quantity":-1,"unit_price_cents":1}`), nil, 400, order.CodeInvalidBody},
		{"ZeroQuantity", "k", body(`{"sku":"A","quantity":0,"unit_price_cents":1}`), nil, 400, order.CodeInvalidBody},
		{"FractionalQuantity", "k", body(`{"sku":"A","quantity":1.5,"unit_price_cents":1}`), nil, 400, order.CodeInvalidBody},
		{"NegativePrice", "k", body(`{"sku":"A","quantity":1,"unit_price_cents":-5}`), nil, 400, order.CodeInvalidBody},
		{"EmptyItems", "k", body(``), nil, 400, order.CodeInvalidBody},
		{"NoItems", "k", `{"customer_email":"ann@example.com","currency":"EUR"}`, nil, 400, order.CodeInvalidBody},
		{"EmptySKU", "k", body(`{"sku":"","quantity":1,"unit_price_cents":1}`), nil, 400, order.CodeInvalidBody},
		{"BadEmail", "k", `{"customer_email":"ann","currency":"EUR","items":[` + item + `]}`, nil, 400, order.CodeInvalidBody},
		{"BadCurrency", "k", `{"customer_email":"ann@example.com","currency":"eur","items":[` + item + `]}`, nil, 400, order.CodeInvalidBody},
		{"Malformed", "k", `{"customer_email":`, nil, 400, order.CodeInvalidBody},
		{"EmptyBody", "k", ``, nil, 400, order.CodeInvalidBody},
		{"NotAnObject", "k", `[1,2]`, nil, 400, order.CodeInvalidBody},
		{"TwoObjects", "k", good + good, nil, 400, order.CodeInvalidBody},
		{"TrailingGarbage", "k", good + ` x`, nil, 400, order.CodeInvalidBody},
		{"TooLarge", "k", huge, nil, 400, order.CodeBodyTooLarge},
	}
	if len(huge) <= order.MaxBodyBytes {
		t.Fatalf("the too-large body is only %d bytes", len(huge))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := b.post(t, c.key, c.body, c.headers...)
			if r.status != c.status || r.err.Error.Code != c.code || r.err.Error.Message == "" {
				t.Fatalf("%d %s, want %d %s", r.status, r.body, c.status, c.code)
			}
		})
	}
	t.Run("TextPlain", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(b.ctx, http.MethodPost, b.srv.URL+"/orders", strings.NewReader(good))
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set(order.HeaderIdempotencyKey, "k")
		r := b.do(t, req)
		if r.status != http.StatusUnsupportedMediaType || r.err.Error.Code != order.CodeUnsupportedMediaType {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("GetInvalidID", func(t *testing.T) {
		if r := b.get(t, "/orders/abc"); r.status != 400 || r.err.Error.Code != order.CodeInvalidID {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	t.Run("GetMissing", func(t *testing.T) {
		if r := b.get(t, "/orders/999999"); r.status != 404 || r.err.Error.Code != order.CodeNotFound {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	// ServeMux's own replies would be plain text: other methods and paths get the JSON
	// error shape too.
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodGet, "/orders", "POST"},
		{http.MethodDelete, "/orders/1", "GET, HEAD"},
		{http.MethodPut, "/orders/1", "GET, HEAD"},
	} {
		t.Run("MethodNotAllowed"+c.method+c.path, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(b.ctx, c.method, b.srv.URL+c.path, nil)
			r := b.do(t, req)
			if r.status != http.StatusMethodNotAllowed || r.err.Error.Code != order.CodeMethodNotAllowed || r.err.Error.Message == "" {
				t.Fatalf("%d %s", r.status, r.body)
			}
			if got := r.header.Get("Allow"); got != c.allow {
				t.Fatalf("Allow = %q, want %q", got, c.allow)
			}
		})
	}
	t.Run("UnknownPath", func(t *testing.T) {
		if r := b.get(t, "/invoices/1"); r.status != 404 || r.err.Error.Code != order.CodeNotFound {
			t.Fatalf("%d %s", r.status, r.body)
		}
	})
	if n := b.count(t, `SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM fenceq_idempotency_keys)`); n != 0 {
		t.Fatalf("bad input left %d rows", n)
	}
	// The key that was rejected with bad bodies is still free for a good request.
	if r := b.post(t, "k", good); r.status != http.StatusCreated {
		t.Fatalf("good request after bad ones: %d %s", r.status, r.body)
	}
}

func TestServiceValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	if _, err := order.NewService(order.Config{}); err == nil {
		t.Fatal("NewService without a pool succeeded")
	}
	if _, err := order.NewService(order.Config{Pool: b.db.Pool, InflightWait: time.Minute}); err == nil {
		t.Fatal("NewService with InflightWait >= WriteTimeout succeeded")
	}
	_, err := b.svc.Place(b.ctx, "", order.Request{})
	var verr *queue.ValidationError
	if !errors.As(err, &verr) || verr.Field != "idempotency_key" {
		t.Fatalf("empty key: %v, want a validation error naming idempotency_key", err)
	}
	_, err = b.svc.Place(b.ctx, "k", order.Request{CustomerEmail: "a@example.com", Currency: "EUR",
		Items: []order.Item{{SKU: "A", Quantity: 1}, {SKU: "B", Quantity: -2}}})
	if !errors.As(err, &verr) || verr.Field != "items[1].quantity" {
		t.Fatalf("negative quantity: %v, want a validation error naming items[1].quantity", err)
	}
	if _, err := b.svc.Get(b.ctx, 12345); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("get missing: %v, want ErrNotFound", err)
	}
}

func (b *testBundle) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	fenceqtest.WaitFor(t, what, 20*time.Second, cond)
}

// lockWaitsOf is the query counting the sessions of an application (application_name
// $1) that wait on a lock. On Citus the wait happens in the worker node's backend that
// works for the session, which shares its global pid.
func lockWaitsOf(t *testing.T) string {
	if fenceqtest.OnCitus(t) {
		return `SELECT count(DISTINCT w.global_pid) FROM citus_stat_activity w
WHERE w.wait_event_type = 'Lock'
  AND w.global_pid IN (SELECT c.global_pid FROM citus_stat_activity c WHERE c.application_name = $1)`
	}
	return `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`
}
