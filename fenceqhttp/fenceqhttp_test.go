package fenceqhttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqhttp"
	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

func TestMain(m *testing.M) { fenceqtest.Main(m) }

var secret = []byte("topsecret")

const kind = "remote"

const args = `{"n": 1}`

// seen is what the endpoint saw of one request.
type seen struct {
	header http.Header
	body   []byte
	verify error
}

// bench is a test's schema, endpoint and metrics.
type bench struct {
	ctx  context.Context
	db   *fenceqtest.DB
	srv  *httptest.Server
	reg  *prometheus.Registry
	prom *fenceqprom.Metrics

	mu   sync.Mutex
	reqs []seen
}

// newBench starts an endpoint that records each request (and checks its signature
// with Verify) before answering it with answer.
func newBench(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, body []byte)) *bench {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	b := &bench{ctx: ctx, db: fenceqtest.New(t, nil), reg: prometheus.NewRegistry()}
	var err error
	if b.prom, err = fenceqprom.New(b.reg); err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		b.mu.Lock()
		b.reqs = append(b.reqs, seen{header: r.Header.Clone(), body: body, verify: fenceqhttp.Verify(secret, r, body)})
		b.mu.Unlock()
		answer(w, r, body)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *bench) requests() []seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seen(nil), b.reqs...)
}

// work runs one job of the HTTP kind, registered with ep's settings (URL, secret, kind
// and metrics filled in when empty), the way a worker runs it, and returns its row.
func (b *bench) work(t *testing.T, ep fenceqhttp.Endpoint) (*queue.JobRow, error) {
	t.Helper()
	if ep.Kind == "" {
		ep.Kind = kind
	}
	if ep.URL == "" {
		ep.URL = b.srv.URL + "/run"
	}
	if ep.Secret == nil {
		ep.Secret = secret
	}
	ep.Metrics = b.prom.HTTP()
	hs := fenceq.NewHandlers()
	if err := fenceqhttp.Add(hs, ep); err != nil {
		t.Fatal(err)
	}
	cfg := fenceq.Config{Handlers: hs, Logger: fenceqtest.QuietLogger(), Hooks: []fenceq.Hook{b.prom},
		Backoff: queue.Backoff{Base: time.Hour, Max: time.Hour}}
	return fenceqtest.Work(b.ctx, t, b.db.Pool, cfg, fenceq.RawArgs{KindName: ep.Kind, JSON: []byte(args)},
		&fenceq.InsertOpts{MaxAttempts: 3})
}

func (b *bench) staleWrites(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_lease_events WHERE kind = 'stale_write_rejected'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// counter returns the value of the counter name whose labels include the given
// name-value pairs (0 when there is none).
func (b *bench) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func lastError(j *queue.JobRow) string {
	if len(j.Errors) == 0 {
		return ""
	}
	return j.Errors[len(j.Errors)-1].Error
}

// A 2xx completes the job with the body as its output; the request carries the args,
// the job's lease and a signature the endpoint's Verify accepts.
func TestSuccessRecordsTheBodyAsOutput(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ body, want string }{
		"json":     {`{"total": 42}`, `{"total": 42}`},
		"text":     {"done, 42 rows", `"done, 42 rows"`},
		"empty":    {"", ""},
		"bad json": {`{"total": `, `"{\"total\": "`},
		// JSON jsonb cannot store (a NUL escape) is kept as text; a raw NUL byte is replaced.
		"nul escape": {`{"a": "x\u0000"}`, `"{\"a\": \"x\\u0000\"}"`},
		"nul byte":   {"a\x00b", "\"a\uFFFDb\""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				_, _ = io.WriteString(w, tc.body)
			})
			start := time.Now()
			j, err := b.work(t, fenceqhttp.Endpoint{})
			if err != nil || j.State != queue.StateCompleted {
				t.Fatalf("job %s, handler error %v; want completed", j.State, err)
			}
			if string(j.Output) != tc.want {
				t.Fatalf("output %q, want %q", j.Output, tc.want)
			}
			reqs := b.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests, want 1", len(reqs))
			}
			r := reqs[0]
			if r.verify != nil {
				t.Fatalf("Verify refused the worker's request: %v", r.verify)
			}
			if string(r.body) != args || r.header.Get("Content-Type") != "application/json" {
				t.Fatalf("body %q (%s), want the args %q as application/json", r.body, r.header.Get("Content-Type"), args)
			}
			if got := r.header.Get(fenceqhttp.HeaderJobID); got != strconv.FormatInt(j.ID, 10) {
				t.Errorf("%s %q, want %d", fenceqhttp.HeaderJobID, got, j.ID)
			}
			if got := r.header.Get(fenceqhttp.HeaderLeaseGen); got != strconv.FormatInt(j.LeaseGen, 10) {
				t.Errorf("%s %q, want %d", fenceqhttp.HeaderLeaseGen, got, j.LeaseGen)
			}
			if got := r.header.Get(fenceqhttp.HeaderAttempt); got != "1" {
				t.Errorf("%s %q, want 1", fenceqhttp.HeaderAttempt, got)
			}
			// No timeout: the deadline is the lease's (60s by default, less the margin).
			d, err := time.Parse(time.RFC3339, r.header.Get(fenceqhttp.HeaderDeadline))
			if err != nil || d.Before(start.Add(30*time.Second)) || d.After(time.Now().Add(61*time.Second)) {
				t.Errorf("%s %q (%v): want the lease's local deadline, about a minute on", fenceqhttp.HeaderDeadline,
					r.header.Get(fenceqhttp.HeaderDeadline), err)
			}
			if n := b.counter(t, "fenceq_http_responses_total", "kind", kind, "class", "2xx"); n != 1 {
				t.Errorf("fenceq_http_responses_total{class=2xx} %v, want 1", n)
			}
			if n := b.counter(t, "fenceq_jobs_finished_total", "kind", kind, "outcome", string(fenceq.OutcomeCompleted)); n != 1 {
				t.Errorf("fenceq_jobs_finished_total of the HTTP kind, completed: %v, want 1", n)
			}
		})
	}
}

// An output larger than queue.MaxOutputBytes is kept as a JSON string cut to fit.
func TestSuccessCapsALargeBody(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("é", queue.MaxOutputBytes) // twice the limit in bytes
	b := newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) { _, _ = io.WriteString(w, big) })
	j, err := b.work(t, fenceqhttp.Endpoint{})
	if err != nil || j.State != queue.StateCompleted {
		t.Fatalf("job %s, handler error %v; want completed", j.State, err)
	}
	if len(j.Output) > queue.MaxOutputBytes || len(j.Output) < queue.MaxOutputBytes/2 || !strings.HasPrefix(string(j.Output), `"éé`) {
		t.Fatalf("output of %d bytes starting %.10q: want the body as a JSON string cut to at most %d bytes",
			len(j.Output), j.Output, queue.MaxOutputBytes)
	}
}

// completeInSQL is what an endpoint does: its result row and fenceq_complete in one
// transaction. It returns the error of the transaction.
func completeInSQL(ctx context.Context, db *fenceqtest.DB, id, gen int64) error {
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, id, gen); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT fenceq_complete($1, $2, '"by the endpoint"')`, id, gen); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Both orders of the two completions of one attempt. An endpoint that completed its job
// with fenceq_complete before answering 2xx: the worker's completion finds that
// completion under its own lease and writes nothing more, records no stale write, and
// reports the attempt completed. An endpoint that calls fenceq_complete after the
// worker completed the job (it answered first): its call fails with QF002 and its
// transaction, result row included, rolls back.
func TestSuccessAfterTheEndpointCompletedInSQL(t *testing.T) {
	t.Parallel()
	var b *bench
	sqlErr := make(chan error, 1)
	b = newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		id, _ := strconv.ParseInt(r.Header.Get(fenceqhttp.HeaderJobID), 10, 64)
		gen, _ := strconv.ParseInt(r.Header.Get(fenceqhttp.HeaderLeaseGen), 10, 64)
		if r.URL.Path == "/first" {
			if err := completeInSQL(r.Context(), b.db, id, gen); err != nil {
				sqlErr <- err
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		_, _ = io.WriteString(w, `"by the worker"`)
	})
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE results (job_id bigint PRIMARY KEY, lease_gen bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	t.Run("EndpointFirst", func(t *testing.T) {
		j, err := b.work(t, fenceqhttp.Endpoint{URL: b.srv.URL + "/first"})
		select {
		case err := <-sqlErr:
			t.Fatalf("the endpoint's completion failed: %v", err)
		default:
		}
		if err != nil || j.State != queue.StateCompleted || string(j.Output) != `"by the endpoint"` {
			t.Fatalf("job %s output %s, handler error %v; want completed with the endpoint's output", j.State, j.Output, err)
		}
		if n := b.staleWrites(t); n != 0 {
			t.Fatalf("%d stale_write_rejected events after the worker's completion found the endpoint's", n)
		}
		if n := b.counter(t, "fenceq_jobs_finished_total", "kind", kind, "outcome", string(fenceq.OutcomeCompleted)); n != 1 {
			t.Fatalf("attempts finished completed: %v, want 1", n)
		}
		var rows int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM results WHERE job_id = $1 AND lease_gen = $2`, j.ID, j.LeaseGen).Scan(&rows); err != nil || rows != 1 {
			t.Fatalf("%d result rows of the job (%v), want 1", rows, err)
		}
	})

	t.Run("WorkerFirst", func(t *testing.T) {
		j, err := b.work(t, fenceqhttp.Endpoint{Kind: "remote2", URL: b.srv.URL + "/later"})
		if err != nil || j.State != queue.StateCompleted || string(j.Output) != `"by the worker"` {
			t.Fatalf("job %s output %s, handler error %v; want completed by the worker", j.State, j.Output, err)
		}
		err = completeInSQL(b.ctx, b.db, j.ID, j.LeaseGen)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "QF002" {
			t.Fatalf("late fenceq_complete: %v; want SQLSTATE QF002", err)
		}
		var rows int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM results WHERE job_id = $1`, j.ID).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("%d result rows after the rejected completion (%v), want 0", rows, err)
		}
	})
}

// 429 and 503 with Retry-After snooze the job for that long (delay seconds or an HTTP
// date) without using up an attempt; without a valid Retry-After they fail the attempt.
func TestRetryAfterSnoozes(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		status int
		after  func() string
		snooze time.Duration // 0: the attempt fails instead
	}{
		"429 seconds":    {http.StatusTooManyRequests, func() string { return "120" }, 120 * time.Second},
		"503 date":       {http.StatusServiceUnavailable, func() string { return time.Now().Add(time.Hour).UTC().Format(http.TimeFormat) }, time.Hour},
		"503 without":    {http.StatusServiceUnavailable, func() string { return "" }, 0},
		"429 malformed":  {http.StatusTooManyRequests, func() string { return "soon" }, 0},
		"429 a year off": {http.StatusTooManyRequests, func() string { return strconv.Itoa(365 * 86400) }, 0},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if v := tc.after(); v != "" {
					w.Header().Set("Retry-After", v)
				}
				http.Error(w, "busy", tc.status)
			})
			before := time.Now()
			j, err := b.work(t, fenceqhttp.Endpoint{})
			if tc.snooze == 0 {
				if j.State != queue.StateRetryable || !strings.Contains(lastError(j), strconv.Itoa(tc.status)) ||
					!strings.Contains(lastError(j), "no valid Retry-After") {
					t.Fatalf("job %s, error %q (%v): want retryable, the status and the missing Retry-After named",
						j.State, lastError(j), err)
				}
				return
			}
			if j.State != queue.StateScheduled || j.MaxAttempts != 4 || len(j.Errors) != 0 {
				t.Fatalf("job %s, max attempts %d, errors %v: want snoozed (scheduled, an attempt given back, no error)",
					j.State, j.MaxAttempts, j.Errors)
			}
			// Generous bounds: the database's clock against this process's, and the
			// date form's one-second resolution.
			if lo, hi := before.Add(tc.snooze-time.Minute), time.Now().Add(tc.snooze+time.Minute); j.RunAt.Before(lo) || j.RunAt.After(hi) {
				t.Fatalf("run at %v, want about %v from now", j.RunAt, tc.snooze)
			}
		})
	}
}

// Any other 4xx discards the job, the status and the start of the body in its errors,
// unless the kind retries client errors; a 5xx and a redirect fail the attempt.
func TestStatusOutcomes(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		status      int
		retryClient bool
		want        queue.State
	}{
		"404":         {http.StatusNotFound, false, queue.StateDiscarded},
		"422":         {http.StatusUnprocessableEntity, false, queue.StateDiscarded},
		"404 retried": {http.StatusNotFound, true, queue.StateRetryable},
		"500":         {http.StatusInternalServerError, false, queue.StateRetryable},
		"502":         {http.StatusBadGateway, true, queue.StateRetryable},
		"302":         {http.StatusFound, false, queue.StateRetryable},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
				if tc.status == http.StatusFound {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, "no such invoice "+strings.Repeat("x", 4096))
			})
			j, err := b.work(t, fenceqhttp.Endpoint{RetryClientErrors: tc.retryClient})
			msg := lastError(j)
			if j.State != tc.want || err == nil {
				t.Fatalf("job %s (handler error %v), want %s", j.State, err, tc.want)
			}
			if !strings.Contains(msg, strconv.Itoa(tc.status)) || !strings.Contains(msg, "no such invoice") || len(msg) > 2048 {
				t.Fatalf("error of %d bytes %.200q: want the status and the start of the body, capped", len(msg), msg)
			}
			if len(b.requests()) != 1 {
				t.Fatalf("%d requests, want 1 (a redirect is not followed)", len(b.requests()))
			}
			class := strconv.Itoa(tc.status/100) + "xx"
			if n := b.counter(t, "fenceq_http_responses_total", "kind", kind, "class", class); n != 1 {
				t.Errorf("fenceq_http_responses_total{class=%s} %v, want 1", class, n)
			}
		})
	}
}

// The request ends at the kind's timeout, which the deadline header announces; the
// attempt fails and is retried.
func TestTimeoutEndsTheRequest(t *testing.T) {
	t.Parallel()
	ended := make(chan error, 1)
	b := newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		<-r.Context().Done() // the worker gave up on the request
		ended <- r.Context().Err()
	})
	timeout := 500 * time.Millisecond
	start := time.Now()
	j, err := b.work(t, fenceqhttp.Endpoint{Opts: &fenceq.HandlerOpts{Timeout: timeout}})
	if j.State != queue.StateRetryable || !errors.Is(err, fenceq.ErrJobTimeout) || !strings.Contains(lastError(j), "job timeout") {
		t.Fatalf("job %s, handler error %v, recorded %q: want retryable after the job timeout", j.State, err, lastError(j))
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the endpoint's request was not ended")
	}
	d, err := time.Parse(time.RFC3339, b.requests()[0].header.Get(fenceqhttp.HeaderDeadline))
	if err != nil || d.Before(start) || d.After(time.Now().Add(timeout)) {
		t.Fatalf("deadline header %v (%v): want the timeout's, sooner than the lease's", d, err)
	}
	if n := b.counter(t, "fenceq_http_responses_total", "kind", kind, "class", "error"); n != 1 {
		t.Errorf("fenceq_http_responses_total{class=error} %v, want 1", n)
	}
}

// A refused connection fails the attempt; the job is retried.
func TestConnectionRefusedRetries(t *testing.T) {
	t.Parallel()
	b := newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) {})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	j, err := b.work(t, fenceqhttp.Endpoint{URL: "http://" + addr + "/run"})
	if j.State != queue.StateRetryable || err == nil || !strings.Contains(lastError(j), "connection refused") {
		t.Fatalf("job %s, handler error %v, recorded %q: want retryable, connection refused", j.State, err, lastError(j))
	}
}

// The signature of a known request, and Verify's refusals.
func TestSignature(t *testing.T) {
	t.Parallel()
	body := []byte(`{"n":1}`)
	// HMAC-SHA256("topsecret", `42.7.{"n":1}`), computed apart from this package.
	const want = "sha256=f052754206ff6a455ae8b69ec60f1648f7bbd947b78b89ed8555d82dc5062479"
	req := func(id, gen, sig string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/run", bytes.NewReader(body))
		for h, v := range map[string]string{fenceqhttp.HeaderJobID: id, fenceqhttp.HeaderLeaseGen: gen, fenceqhttp.HeaderSignature: sig} {
			if v != "" {
				r.Header.Set(h, v)
			}
		}
		return r
	}
	if err := fenceqhttp.Verify(secret, req("42", "7", want), body); err != nil {
		t.Fatalf("Verify of the known vector: %v", err)
	}
	for name, tc := range map[string]struct {
		secret []byte
		r      *http.Request
		body   []byte
		says   string
	}{
		"other body":     {secret, req("42", "7", want), []byte(`{"n":2}`), "does not match"},
		"other lease":    {secret, req("42", "8", want), body, "does not match"},
		"other job":      {secret, req("43", "7", want), body, "does not match"},
		"other secret":   {[]byte("guess"), req("42", "7", want), body, "does not match"},
		"unsigned":       {secret, req("42", "7", ""), body, "missing"},
		"no algorithm":   {secret, req("42", "7", strings.TrimPrefix(want, "sha256=")), body, "sha256="},
		"no job id":      {secret, req("", "7", want), body, fenceqhttp.HeaderJobID},
		"bad generation": {secret, req("42", "x", want), body, fenceqhttp.HeaderLeaseGen},
		"empty secret":   {nil, req("42", "7", want), body, "empty secret"},
	} {
		err := fenceqhttp.Verify(tc.secret, tc.r, tc.body)
		if !errors.Is(err, fenceqhttp.ErrSignature) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: Verify %v; want ErrSignature saying %q", name, err, tc.says)
		}
	}
}

// Add refuses what cannot work, naming it.
func TestAddRefuses(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		ep   fenceqhttp.Endpoint
		says string
	}{
		"no secret":    {fenceqhttp.Endpoint{Kind: "k", URL: "http://127.0.0.1/run"}, "empty secret"},
		"relative URL": {fenceqhttp.Endpoint{Kind: "k", URL: "/run", Secret: secret}, "absolute http or https URL"},
		"ftp":          {fenceqhttp.Endpoint{Kind: "k", URL: "ftp://host/run", Secret: secret}, "absolute http or https URL"},
		"bad kind":     {fenceqhttp.Endpoint{Kind: "", URL: "http://127.0.0.1/run", Secret: secret}, "kind"},
	} {
		err := fenceqhttp.Add(fenceq.NewHandlers(), tc.ep)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: Add %v; want an error saying %q", name, err, tc.says)
		}
	}
	hs := fenceq.NewHandlers()
	ep := fenceqhttp.Endpoint{Kind: "k", URL: "https://user:pw@127.0.0.1/run", Secret: secret}
	if err := fenceqhttp.Add(hs, ep); err != nil {
		t.Fatal(err)
	}
	if err := fenceqhttp.Add(hs, ep); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("second Add of kind k: %v; want already registered", err)
	}
}

// A worker cut off from the database (a paused process) cannot renew its lease: at the
// lease's local deadline, which the deadline header announced, the request ends.
func TestLeaseDeadlineEndsTheRequest(t *testing.T) {
	t.Parallel()
	started := make(chan time.Time, 1)
	ended := make(chan time.Time, 1)
	b := newBench(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		d, _ := time.Parse(time.RFC3339, r.Header.Get(fenceqhttp.HeaderDeadline))
		started <- d
		<-r.Context().Done() // the worker gave up on the request
		ended <- time.Now()
	})
	hs := fenceq.NewHandlers()
	if err := fenceqhttp.Add(hs, fenceqhttp.Endpoint{Kind: kind, URL: b.srv.URL, Secret: secret}); err != nil {
		t.Fatal(err)
	}
	pool, cut := b.db.PartitionedPool(t, 4)
	lease := 2 * time.Second
	before := time.Now()
	fenceqtest.StartWorker(b.ctx, t, pool, fenceq.Config{Handlers: hs, Logger: fenceqtest.QuietLogger(),
		LeaseDuration: lease, HeartbeatInterval: 100 * time.Millisecond, DisablePeriodic: true})
	if _, err := fenceq.Enqueue(b.ctx, b.db.Pool, fenceq.RawArgs{KindName: kind, JSON: []byte(args)}, nil); err != nil {
		t.Fatal(err)
	}
	var deadline time.Time
	select {
	case deadline = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no request")
	}
	if deadline.Before(before) || deadline.After(time.Now().Add(lease)) {
		t.Fatalf("deadline header %v: want the lease's local deadline, within %v", deadline, lease)
	}
	cut.Store(true)
	defer cut.Store(false)
	select {
	case at := <-ended:
		// Renewals only move the local deadline later than the one announced.
		if at.Before(deadline) {
			t.Fatalf("the request ended at %v, before the lease's local deadline %v", at, deadline)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request outlived the lease's local deadline")
	}
}
