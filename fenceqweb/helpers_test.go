package fenceqweb

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// prefix is where the tests mount the dashboard, as an application would.
const prefix = "/fenceq"

type testBundle struct {
	ctx    context.Context
	db     *fenceqtest.DB
	h      *Handler
	srv    *httptest.Server
	client *http.Client
}

// setup starts the dashboard on a fresh schema, mounted under prefix, and a browser-like
// client with a cookie jar that does not follow redirects.
func setup(t *testing.T, mod ...func(*Config)) *testBundle {
	t.Helper()
	db := fenceqtest.New(t, nil)
	cfg := Config{DB: db.Pool, Logger: fenceqtest.QuietLogger()}
	for _, m := range mod {
		m(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &testBundle{ctx: context.Background(), db: db, h: h, srv: srv, client: client}
}

// url is the absolute URL of a dashboard path ("/jobs/1").
func (b *testBundle) url(path string) string { return b.srv.URL + prefix + path }

type response struct {
	status int
	header http.Header
	body   string
}

func (b *testBundle) do(t *testing.T, req *http.Request) response {
	t.Helper()
	res, err := b.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: string(body)}
}

func (b *testBundle) get(t *testing.T, path string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.url(path), nil)
	if err != nil {
		t.Fatal(err)
	}
	return b.do(t, req)
}

// page GETs a path and fails unless it answers 200.
func (b *testBundle) page(t *testing.T, path string) string {
	t.Helper()
	r := b.get(t, path)
	if r.status != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", path, r.status, r.body)
	}
	return r.body
}

func (b *testBundle) post(t *testing.T, path string, form url.Values) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url(path), strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(t, req)
}

var tokenRE = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// token loads a page and returns the action token its forms carry.
func (b *testBundle) token(t *testing.T, path string) string {
	t.Helper()
	if m := tokenRE.FindStringSubmatch(b.page(t, path)); m != nil {
		return m[1]
	}
	// A page without forms carries no token: the session's token is the one its forms
	// would carry.
	u, _ := url.Parse(b.url(path))
	for _, ck := range b.client.Jar.Cookies(u) {
		if ck.Name == sessionCookie {
			return b.h.csrf.token(ck.Value)
		}
	}
	t.Fatalf("GET %s: no session cookie", path)
	return ""
}

// act posts an action the way the page's form does, with the page's token, plus extra
// form fields.
func (b *testBundle) act(t *testing.T, from, action string, extra ...string) response {
	t.Helper()
	form := url.Values{csrfField: {b.token(t, from)}}
	for i := 0; i+1 < len(extra); i += 2 {
		form.Set(extra[i], extra[i+1])
	}
	return b.post(t, action, form)
}

func (b *testBundle) insert(t *testing.T, p store.InsertParams) *queue.JobRow {
	t.Helper()
	if p.Kind == "" {
		p.Kind = "noop"
	}
	res, err := store.Insert(b.ctx, b.db.Pool, p)
	if err != nil {
		t.Fatal(err)
	}
	return res.Job
}

func (b *testBundle) job(t *testing.T, id int64) *queue.JobRow {
	t.Helper()
	j, err := store.GetJob(b.ctx, b.db.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (b *testBundle) claim(t *testing.T, q, worker string, lease time.Duration) *queue.JobRow {
	t.Helper()
	js, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: q, WorkerID: worker, Limit: 1, Lease: lease})
	if err != nil || len(js) != 1 {
		t.Fatalf("claim on %s by %s: %v, %d jobs", q, worker, err, len(js))
	}
	return js[0]
}

// generations makes a job with the whole lease story on queue q: worker-a claims it
// (generation 1) and stops heartbeating its lease while its process lives; the reaper
// revokes the expired lease (generation 2, revoked and expired_holder_alive events);
// worker-b claims it (generation 3) and holds it; worker-a's late completion under
// generation 1 is rejected by the database (stale_write_rejected), and its next
// heartbeat finds the lease gone (heartbeat_lost).
func (b *testBundle) generations(t *testing.T, q string) *queue.JobRow {
	t.Helper()
	j := b.insert(t, store.InsertParams{Queue: q, Kind: "invoice", Args: []byte(`{"customer_id": 42, "period": "2026-10"}`)})
	for _, w := range []string{"worker-a", "worker-b"} {
		if err := store.RegisterWorker(b.ctx, b.db.Pool, w, "host-"+w, 4242, []string{q}, nil); err != nil {
			t.Fatal(err)
		}
	}
	first := b.claim(t, q, "worker-a", 50*time.Millisecond)
	fenceqtest.WaitFor(t, "the first lease to expire by the database's clock", 10*time.Second, func() bool {
		var expired bool
		err := b.db.Pool.QueryRow(b.ctx, `SELECT lease_expires_at < now() FROM fenceq_jobs WHERE id = $1`, j.ID).Scan(&expired)
		return err == nil && expired
	})
	revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{HolderFresh: time.Hour})
	if err != nil || len(revs) != 1 || !revs[0].HolderAlive {
		t.Fatalf("reap: %+v %v; want one revocation of a live holder", revs, err)
	}
	second := b.claim(t, q, "worker-b", time.Hour)
	if second.ID != j.ID || second.LeaseGen != 3 {
		t.Fatalf("second claim: job %d gen %d; want job %d gen 3", second.ID, second.LeaseGen, j.ID)
	}
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(first)); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("stale completion: %v; want ErrLeaseLost", err)
	}
	hb, err := store.Heartbeat(b.ctx, b.db.Pool, "worker-a", []queue.Lease{store.LeaseOf(first)}, time.Minute)
	if err != nil || len(hb.Lost) != 1 {
		t.Fatalf("stale heartbeat: %+v %v; want the lease lost", hb, err)
	}
	if _, err := store.RecordLeasesLost(b.ctx, b.db.Pool, "worker-a", hb.Lost); err != nil {
		t.Fatal(err)
	}
	return b.job(t, j.ID)
}

// eventKinds counts a job's lease events by kind.
func (b *testBundle) eventKinds(t *testing.T, id int64) map[queue.LeaseEventKind]int {
	t.Helper()
	evs, err := store.ListLeaseEvents(b.ctx, b.db.Pool, id, 100)
	if err != nil {
		t.Fatal(err)
	}
	out := map[queue.LeaseEventKind]int{}
	for _, e := range evs {
		out[e.Kind]++
	}
	return out
}

func mustContain(t *testing.T, what, body string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(body, p) {
			t.Errorf("%s: missing %q", what, p)
		}
	}
}

func mustNotContain(t *testing.T, what, body string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if strings.Contains(body, p) {
			t.Errorf("%s: must not contain %q", what, p)
		}
	}
}

// rollUpToNow rolls the job counters up until their cursor passes the database's now()
// as of the call, so that every job finished before it is counted on the pages.
func (b *testBundle) rollUpToNow(t *testing.T) {
	t.Helper()
	now, err := store.DBNow(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := store.RollupCounts(b.ctx, b.db.Pool); err != nil {
			t.Fatal(err)
		}
		st, err := store.ReadCountersState(b.ctx, b.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		if !st.RolledTo.Before(now) {
			return
		}
		if b.ctx.Err() != nil {
			t.Fatalf("the job counters' cursor stays at %s, before %s", st.RolledTo, now)
		}
	}
}
