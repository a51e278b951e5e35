package fenceqweb

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

func TestOverviewShowsQueuesAlertsChartAndLeaseEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.generations(t, "billing")
	b.insert(t, store.InsertParams{Queue: "mail"})
	done := b.claim(t, "mail", "worker-b", time.Minute)
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(done)); err != nil {
		t.Fatal(err)
	}
	b.insert(t, store.InsertParams{Queue: "mail", Kind: "mail.bounce"})
	bad := b.claim(t, "mail", "worker-b", time.Minute)
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(bad), store.FailParams{Err: "mailbox gone", Discard: true}); err != nil {
		t.Fatal(err)
	}
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, "idle", true); err != nil {
		t.Fatal(err)
	}
	b.rollUpToNow(t)
	// The finished jobs are deleted: the pages count them from the counters.
	if n, err := store.PruneFinished(b.ctx, b.db.Pool, 0, 100); err != nil || n != 2 {
		t.Fatalf("pruned %d finished jobs, %v; want 2", n, err)
	}
	body := b.page(t, "/")
	mustContain(t, "overview", body,
		"billing", "mail", "idle", "paused",
		// The conditions of package health, alerting on the stale write and the live holder.
		"leases expired while the holder lived", "stale writes rejected", "oldest pending outbox row", "oldest open transaction",
		"ALERT",
		// The chart and its one completed job.
		`<svg class="chart"`, `class="bar-completed"`, "1 completed",
		// The lease events, linked to their job.
		fmt.Sprintf(`href="./jobs/%d"`, j.ID), "stale_write_rejected", "expired_holder_alive",
		// Errors by kind: the discarded job and its failed attempt.
		"Errors by kind, last hour", "not cancellations", `<td><a href="./jobs?kind=mail.bounce&amp;state=discarded">mail.bounce</a></td>`,
		"Finished jobs are counted per minute by the job counters, up to")
	ek := regexp.MustCompile(`(?s)>mail\.bounce</a></td>\s*<td class="num">([0-9]+)</td>\s*<td class="num">([0-9]+)</td>`).FindStringSubmatch(body)
	if ek == nil || ek[1] != "1" || ek[2] != "1" {
		t.Errorf("errors of mail.bounce: %v; want 1 discarded, 1 failed attempt", ek)
	}
	mail := regexp.MustCompile(`(?s)<td><a href="\./jobs\?queue=mail">mail</a></td>(.*?)</tr>`).FindStringSubmatch(body)
	if mail == nil || strings.Count(mail[1], `<td class="num">1</td>`) != 2 {
		t.Errorf("mail row: %v; want 1 completed and 1 discarded", mail)
	}
	// Per-queue counts: billing has one running job, mail one completed in the hour.
	row := regexp.MustCompile(`(?s)<td><a href="\./jobs\?queue=billing">billing</a></td>(.*?)</tr>`).FindStringSubmatch(body)
	if row == nil {
		t.Fatal("no billing row")
	}
	cells := regexp.MustCompile(`<td class="num">(?:<a [^>]*>)?([0-9,]+)`).FindAllStringSubmatch(row[1], -1)
	var got []string
	for _, c := range cells {
		got = append(got, c[1])
	}
	// available, scheduled, running, retryable, pending, completed, discarded, cancelled.
	if strings.Join(got, " ") != "0 0 1 0 0 0 0 0" {
		t.Errorf("billing counts %v; want 0 0 1 0 0 0 0 0", got)
	}
}

func TestJobsListFiltersAndKeysetPages(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.PageSize = 3 })
	var ids []int64
	for i := range 7 {
		q := "alpha"
		if i%2 == 1 {
			q = "beta"
		}
		var tags []string
		if i%3 == 0 {
			tags = []string{"vip"}
		}
		j := b.insert(t, store.InsertParams{Queue: q, Kind: fmt.Sprintf("kind%d", i%3),
			Args: []byte(fmt.Sprintf(`{"customer": "Customer-%d"}`, i)), Tags: tags})
		ids = append(ids, j.ID)
	}
	// Newest first, three per page, "older" continues below the last id shown.
	var seen []int64
	path := "/jobs"
	for range 5 {
		body := b.page(t, path)
		seen = append(seen, idsOnPage(body)...)
		m := regexp.MustCompile(`href="\./jobs\?before=(\d+)">older`).FindStringSubmatch(body)
		if m == nil {
			break
		}
		path = "/jobs?before=" + m[1]
	}
	if len(seen) != 7 {
		t.Fatalf("pages showed %v; want all 7 jobs once", seen)
	}
	for i, id := range seen {
		if id != ids[6-i] {
			t.Fatalf("pages showed %v; want newest first %v", seen, ids)
		}
	}
	// Filters.
	if got := idsOnPage(b.page(t, "/jobs?queue=beta")); len(got) != 3 || got[0] != ids[5] {
		t.Errorf("queue=beta shows %v; want %d %d %d", got, ids[5], ids[3], ids[1])
	}
	if got := idsOnPage(b.page(t, "/jobs?kind=kind2")); len(got) != 2 || got[0] != ids[5] || got[1] != ids[2] {
		t.Errorf("kind=kind2 shows %v; want %d %d", got, ids[5], ids[2])
	}
	if got := idsOnPage(b.page(t, "/jobs?tag=vip")); len(got) != 3 || got[0] != ids[6] || got[1] != ids[3] || got[2] != ids[0] {
		t.Errorf("tag=vip shows %v; want %d %d %d", got, ids[6], ids[3], ids[0])
	}
	mustContain(t, "tagged job", b.page(t, fmt.Sprintf("/jobs/%d", ids[0])), `href="../jobs?tag=vip"`)
	if r := b.get(t, "/jobs?tag=bad%20tag"); r.status != http.StatusBadRequest {
		t.Errorf("a bad tag: %d, want 400", r.status)
	}
	if got := idsOnPage(b.page(t, "/jobs?args="+url.QueryEscape(`{"customer": "Customer-4"}`))); len(got) != 1 || got[0] != ids[4] {
		t.Errorf("args containing customer Customer-4 shows %v; want %d", got, ids[4])
	}
	b.claim(t, "alpha", "w1", time.Minute)
	if got := idsOnPage(b.page(t, "/jobs?state=running")); len(got) != 1 || got[0] != ids[0] {
		t.Errorf("state=running shows %v; want %d", got, ids[0])
	}
	// Bad filters are a 400 naming the field.
	for _, q := range []string{"state=lost", "queue=no%20spaces", "before=x"} {
		r := b.get(t, "/jobs?"+q)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "invalid") {
			t.Errorf("GET /jobs?%s: %d; want 400 naming the field\n%s", q, r.status, r.body)
		}
	}
}

// idsOnPage returns the job ids a job list shows, in order.
func idsOnPage(body string) []int64 {
	var out []int64
	for _, m := range regexp.MustCompile(`<td class="num"><a href="\./jobs/(\d+)">`).FindAllStringSubmatch(body, -1) {
		var id int64
		fmt.Sscan(m[1], &id)
		out = append(out, id)
	}
	return out
}

func TestJobsSearchFiltersAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.PageSize = 2 })
	var want []int64
	for i := range 7 {
		b.insert(t, store.InsertParams{Kind: "mail", Args: []byte(fmt.Sprintf(`{"customer": %d, "plan": "gold"}`, i%2))})
	}
	b.insert(t, store.InsertParams{Kind: "boom", Queue: "errs"})
	failed := b.claim(t, "errs", "worker-p", time.Minute)
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(failed), store.FailParams{Err: "dial tcp: Connection refused"}); err != nil {
		t.Fatal(err)
	}
	jobs, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{Args: []byte(`{"customer": 1}`)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		want = append(want, j.ID)
	}
	// Args containment, two a page: the pager's link carries the filter and the keyset.
	body := b.page(t, "/jobs?args="+url.QueryEscape(`{"customer": 1}`))
	first := idsOnPage(body)
	m := regexp.MustCompile(`href="\./jobs\?args=[^"]*&amp;before=(\d+)">older`).FindStringSubmatch(body)
	if len(first) != 2 || m == nil {
		t.Fatalf("first page shows %v, older link %v:\n%s", first, m, body)
	}
	second := idsOnPage(b.page(t, "/jobs?args="+url.QueryEscape(`{"customer": 1}`)+"&before="+m[1]))
	if got := append(first, second...); !slices.Equal(got, want) {
		t.Fatalf("pages show %v; want %v", got, want)
	}
	// Words of the last error, shown in the list's last-error column.
	body = b.page(t, "/jobs?error=connection+REFUSED")
	if got := idsOnPage(body); len(got) != 1 || got[0] != failed.ID {
		t.Fatalf("error search shows %v; want %d", got, failed.ID)
	}
	mustContain(t, "error search", body, "dial tcp: Connection refused")
	// A bad filter names its field.
	for q, field := range map[string]string{"args=%5B1%5D": "args", "error=%21%21": "error", "from=yesterday": "from", "state=lost": "state"} {
		if r := b.get(t, "/jobs?"+q); r.status != http.StatusBadRequest || !strings.Contains(r.body, "invalid "+field) {
			t.Errorf("/jobs?%s: %d %q; want 400 naming %s", q, r.status, r.body, field)
		}
	}
}

func TestJobPageShowsTheLeaseTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.generations(t, "billing")
	if err := store.RecordStaleWrite(b.ctx, b.db.Pool, queue.Lease{JobID: j.ID, Gen: 1, Holder: "worker-a"}, "with lease"); err != nil {
		t.Fatal(err)
	}
	body := b.page(t, fmt.Sprintf("/jobs/%d", j.ID))
	mustContain(t, "job page", body,
		"Lease timeline", "3 generations · 2 held · 1 revoked · 2 stale writes rejected",
		"gen 1", "worker-a", "revoked: lease expired; now available", "expired while the holder lived",
		"stale write rejected by the database", "heartbeat found the lease gone", "2 stale writes rejected",
		"gen 2", "no holder", "made by the revocation of generation 1",
		"gen 3", "worker-b", "holds the lease now", "current lease",
		`&#34;customer_id&#34;: 42`)
	// Generations in order.
	if a, c := strings.Index(body, ">gen 1<"), strings.Index(body, ">gen 3<"); a < 0 || c < a {
		t.Errorf("generations out of order (gen 1 at %d, gen 3 at %d)", a, c)
	}
	if r := b.get(t, "/jobs/99999999"); r.status != http.StatusNotFound {
		t.Errorf("unknown job: %d; want 404", r.status)
	}
	if r := b.get(t, "/jobs/x"); r.status != http.StatusNotFound {
		t.Errorf("job x: %d; want 404", r.status)
	}
}

func TestJobPageShowsErrorsWithTraces(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Kind: "boom"})
	c := b.claim(t, "default", "worker-p", time.Minute)
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(c), store.FailParams{Err: "panic: nil map",
		Trace: "goroutine 7 [running]:\nmain.handler()\n\t/app/main.go:42"}); err != nil {
		t.Fatal(err)
	}
	body := b.page(t, fmt.Sprintf("/jobs/%d", c.ID))
	mustContain(t, "failed job", body, "panic: nil map", "goroutine 7 [running]:", "/app/main.go:42",
		"stack trace", "failed: panic: nil map", "Errors <span class=\"muted\">(1)</span>")
}

func TestQueuesWorkersOutboxAndIdempotencyPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Queue: "billing"})
	running := b.claim(t, "billing", "worker-1", time.Minute)
	if err := store.RegisterWorker(b.ctx, b.db.Pool, "worker-1", "host-1", 101, []string{"billing", "default"}, nil); err != nil {
		t.Fatal(err)
	}
	// A lease whose holder never registered.
	b.insert(t, store.InsertParams{Queue: "billing"})
	orphan := b.claim(t, "billing", "ghost", time.Minute)

	body := b.page(t, "/queues")
	mustContain(t, "queues", body, "billing", "default", "1 worker", "Pause…")
	body = b.page(t, "/workers")
	mustContain(t, "workers", body, "worker-1", "host-1", "101", fmt.Sprintf(`href="./jobs/%d"`, running.ID),
		"Leases of unregistered holders", fmt.Sprintf(`href="./jobs/%d"`, orphan.ID), "ghost")

	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := outbox.Insert(b.ctx, tx, outbox.Message{Topic: "email", DedupeKey: "invoice-email:7", Payload: []byte(`{"to":"a@example.com"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	body = b.page(t, "/outbox")
	mustContain(t, "outbox pending", body, "invoice-email:7", "email", fmt.Sprintf(`href="./jobs/%d"`, res.DeliveryJobID))
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_outbox SET state = 'failed', last_error = 'smtp 554' WHERE id = $1`, res.ID); err != nil {
		t.Fatal(err)
	}
	body = b.page(t, "/outbox?state=failed")
	mustContain(t, "outbox failed", body, "invoice-email:7", "smtp 554", ">Retry</button>")
	if r := b.get(t, "/outbox?state=lost"); r.status != http.StatusBadRequest {
		t.Errorf("outbox state=lost: %d; want 400", r.status)
	}

	err = pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		c, err := idempotency.Claim(b.ctx, tx, idempotency.ClaimParams{Scope: "orders", Key: "key-1", RequestHash: []byte("h")})
		if err != nil {
			return err
		}
		_, err = idempotency.Finish(b.ctx, tx, c.Record, idempotency.Response{Status: 201, Body: []byte(`{"order_id": 9}`), ResourceID: "9"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	body = b.page(t, "/idempotency?scope=orders&key=key-1")
	mustContain(t, "idempotency found", body, "finished", "201", "{&#34;order_id&#34;: 9}", "68") // 68 = hex of "h"
	body = b.page(t, "/idempotency?scope=orders&key=nope")
	mustContain(t, "idempotency missing", body, "No key")
	if r := b.get(t, "/idempotency?scope=bad%20scope&key=k"); r.status != http.StatusBadRequest {
		t.Errorf("bad scope: %d; want 400", r.status)
	}
	if r := b.get(t, "/nope"); r.status != http.StatusNotFound {
		t.Errorf("/nope: %d; want 404", r.status)
	}
}

func TestEveryLinkResolvesUnderThePrefix(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.generations(t, "billing")
	// Crawl from the overview: every relative link of every page, resolved as a browser
	// would against the page's URL, must stay under the prefix and answer 200.
	start := b.url("/")
	seen := map[string]bool{start: true}
	todo := []string{start}
	hrefRE := regexp.MustCompile(`(?:href|src|action)="([^"]+)"`)
	for len(todo) > 0 && len(seen) < 200 {
		u := todo[0]
		todo = todo[1:]
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		r := b.do(t, req)
		if r.status != http.StatusOK {
			t.Errorf("GET %s: %d", u, r.status)
			continue
		}
		if !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
			continue
		}
		base, _ := url.Parse(u)
		for _, m := range hrefRE.FindAllStringSubmatch(r.body, -1) {
			ref, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
			if err != nil {
				t.Errorf("%s: bad link %q", u, m[1])
				continue
			}
			abs := base.ResolveReference(ref)
			if !strings.HasPrefix(abs.Path, prefix+"/") {
				t.Errorf("%s: link %q leaves the prefix (%s)", u, m[1], abs.Path)
				continue
			}
			if strings.Contains(abs.Path, "/retry") || strings.Contains(abs.Path, "/cancel") ||
				strings.Contains(abs.Path, "/requeue") || strings.Contains(abs.Path, "/pause") || strings.Contains(abs.Path, "/resume") ||
				strings.HasSuffix(abs.Path, "/jobs/bulk") {
				continue // form actions: POST only
			}
			if s := abs.String(); !seen[s] {
				seen[s] = true
				todo = append(todo, s)
			}
		}
	}
	if !seen[b.url(fmt.Sprintf("/jobs/%d", j.ID))] {
		t.Errorf("the crawl never reached job %d", j.ID)
	}
	for _, p := range []string{"/jobs", "/queues", "/workers", "/outbox", "/idempotency"} {
		if !seen[b.url(p)] {
			t.Errorf("the navigation has no link to %s", p)
		}
	}
}

func TestLiveFragmentIsThePagesLivePartAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.generations(t, "billing")
	for _, p := range []string{"/", "/jobs", fmt.Sprintf("/jobs/%d", j.ID), "/queues", "/workers", "/outbox"} {
		req, _ := http.NewRequest(http.MethodGet, b.url(p), nil)
		req.Header.Set(fragmentHeader, "live")
		r := b.do(t, req)
		if r.status != http.StatusOK || r.header.Get(fragmentHeader) != "live" {
			t.Errorf("%s fragment: %d, header %q", p, r.status, r.header.Get(fragmentHeader))
		}
		if strings.Contains(r.body, "<html") || strings.Contains(r.body, `id="live"`) {
			t.Errorf("%s fragment holds the whole page", p)
		}
		if !strings.Contains(r.header.Get("Vary"), fragmentHeader) {
			t.Errorf("%s: Vary %q lacks %s", p, r.header.Get("Vary"), fragmentHeader)
		}
	}
	// The full page wraps the same part in the element the script refreshes.
	mustContain(t, "full page", b.page(t, "/"), `<div id="live" data-refresh="2000">`, "static/live.js?v=")
}

func TestStaticFiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, ct := range map[string]string{"style.css": "text/css", "live.js": "text/javascript", "icon.svg": "image/svg+xml"} {
		r := b.get(t, "/static/"+name)
		if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), ct) || len(r.body) == 0 {
			t.Errorf("%s: %d %q (%d bytes)", name, r.status, r.header.Get("Content-Type"), len(r.body))
		}
	}
	if r := b.get(t, "/static/nope.js"); r.status != http.StatusNotFound {
		t.Errorf("unknown static file: %d", r.status)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, "DB"},
		{Config{DB: b.db.Pool, RefreshInterval: time.Second}, "RefreshInterval"},
		{Config{DB: b.db.Pool, PageSize: MaxPageSize + 1}, "PageSize"},
		{Config{DB: b.db.Pool, Secret: []byte("short")}, "Secret"},
		{Config{DB: b.db.Pool, Auth: Auth{Username: "u"}}, "Auth"},
	} {
		_, err := New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("New(%+v): %v; want an error naming %s", c.cfg, err, c.field)
		}
	}
}
