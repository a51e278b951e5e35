package order_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/syncbuf"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/migrations"
)

type testBundle struct {
	db      *fenceqtest.DB
	pool    *pgxpool.Pool // the service's pool
	ctx     context.Context
	svc     *order.Service
	srv     *httptest.Server
	metrics *order.Counters
	// appName is the application_name of the service's connections, so a test can
	// find (and kill) their backends.
	appName string
}

type bundleOpts struct {
	cfg order.Config // Pool, Metrics and Logger are filled in
	// maxConns of the service's pool; defaults to 8.
	maxConns int32
}

func setup(t *testing.T, o bundleOpts) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 4, Migrations: []migrations.Set{migrations.Core(), order.Migrations()}})
	b := &testBundle{db: db, ctx: ctx, metrics: &order.Counters{}, appName: "order-test-" + db.Schema}

	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = o.maxConns
	if pcfg.MaxConns == 0 {
		pcfg.MaxConns = 8
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = b.appName
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b.pool = pool

	cfg := o.cfg
	cfg.Pool, cfg.Metrics, cfg.Logger = pool, b.metrics, errorLog(t)
	b.svc, err = order.NewService(cfg)
	if err != nil {
		t.Fatalf("new service: %v", err)
	}
	b.srv = httptest.NewServer(b.svc.Handler())
	t.Cleanup(b.srv.Close)
	return b
}

// response is what a client saw.
type response struct {
	status int
	header http.Header
	body   []byte
	order  order.Order     // on 2xx
	err    order.ErrorBody // on errors
	sentAt time.Time       // monotonic, for ordering retries
}

func (b *testBundle) post(t testing.TB, key, body string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.srv.URL+"/orders", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(order.HeaderIdempotencyKey, key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return b.do(t, req)
}

func (b *testBundle) get(t testing.TB, path string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodGet, b.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b.do(t, req)
}

func (b *testBundle) do(t testing.TB, req *http.Request) response {
	t.Helper()
	r := response{sentAt: time.Now()}
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", req.Method, req.URL.Path, err)
		return r
	}
	defer resp.Body.Close()
	r.status, r.header = resp.StatusCode, resp.Header
	if r.body, err = io.ReadAll(resp.Body); err != nil {
		t.Errorf("read body: %v", err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", req.Method, req.URL.Path, ct)
	}
	target := any(&r.order)
	if r.status >= 300 {
		target = &r.err
	}
	if err := json.Unmarshal(r.body, target); err != nil {
		t.Errorf("%s %s: %d body %q is not JSON: %v", req.Method, req.URL.Path, r.status, r.body, err)
	}
	return r
}

// count runs a count(*) query.
func (b *testBundle) count(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := b.db.Pool.QueryRow(b.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *testBundle) ordersWithKey(t testing.TB, key string) int64 {
	return b.count(t, `SELECT count(*) FROM orders WHERE idempotency_key = $1`, key)
}

// checkOrderRows asserts the rows one placed order must have: its items, one
// confirmation email in the outbox with its delivery job, a finished idempotency key.
func (b *testBundle) checkOrderRows(t testing.TB, key string, id int64, items int) {
	t.Helper()
	if n := b.ordersWithKey(t, key); n != 1 {
		t.Fatalf("key %q has %d orders, want 1", key, n)
	}
	if n := b.count(t, `SELECT count(*) FROM order_items WHERE order_id = $1`, id); n != int64(items) {
		t.Fatalf("order %d has %d items, want %d", id, n, items)
	}
	if n := b.count(t, `SELECT count(*) FROM fenceq_outbox o JOIN fenceq_jobs j ON j.id = o.delivery_job_id
		WHERE o.topic = 'email' AND o.dedupe_key = $1`, "order-email:"+itoa(id)); n != 1 {
		t.Fatalf("order %d has %d confirmation emails with delivery jobs, want 1", id, n)
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// orderBody returns a valid request body; n varies the request.
func orderBody(n int) string {
	return `{"customer_email":"ann@example.com","currency":"EUR","items":[` +
		`{"sku":"BOOK-1","quantity":` + itoa(int64(n)) + `,"unit_price_cents":1250},` +
		`{"sku":"PEN-2","quantity":3,"unit_price_cents":199}]}`
}

// errorLog is the service's logger in tests: it keeps the errors the service logs (an
// answer of 500 logs its cause) and prints them if the test failed.
func errorLog(t *testing.T) *slog.Logger {
	var buf syncbuf.Buffer
	t.Cleanup(func() {
		if t.Failed() && buf.Len() > 0 {
			t.Logf("errors the order service logged:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError}))
}
