package fenceqweb

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

func TestForgedPostsAreRefusedAndChangeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Kind: "long"})
	c := b.claim(t, "default", "worker-z", time.Minute)
	page := fmt.Sprintf("/jobs/%d", c.ID)
	action := page + "/cancel"
	good := b.token(t, page)

	other := setup(t) // another browser session of another dashboard: its own secret
	foreign := other.token(t, "/")

	jar := b.client.Jar
	cases := []struct {
		name string
		form url.Values
		// prep changes the request: cookies, headers.
		prep func(*http.Request)
	}{
		{"no token", url.Values{"confirm": {"yes"}}, nil},
		{"empty token", url.Values{csrfField: {""}, "confirm": {"yes"}}, nil},
		{"wrong token", url.Values{csrfField: {"AAAA" + good[4:]}, "confirm": {"yes"}}, nil},
		{"another dashboard's token", url.Values{csrfField: {foreign}, "confirm": {"yes"}}, nil},
		{"no session cookie", url.Values{csrfField: {good}, "confirm": {"yes"}}, func(r *http.Request) {
			b.client.Jar = nil
		}},
		{"planted session cookie", url.Values{csrfField: {good}, "confirm": {"yes"}}, func(r *http.Request) {
			b.client.Jar = nil
			r.AddCookie(&http.Cookie{Name: sessionCookie, Value: strings.Repeat("A", 43)})
		}},
		{"cross-site browser request with a valid token", url.Values{csrfField: {good}, "confirm": {"yes"}}, func(r *http.Request) {
			r.Header.Set("Sec-Fetch-Site", "cross-site")
		}},
		{"foreign origin with a valid token", url.Values{csrfField: {good}, "confirm": {"yes"}}, func(r *http.Request) {
			r.Header.Set("Origin", "http://evil.example")
		}},
	}
	for _, tc := range cases {
		req, err := http.NewRequest(http.MethodPost, b.url(action), strings.NewReader(tc.form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if tc.prep != nil {
			tc.prep(req)
		}
		r := b.do(t, req)
		b.client.Jar = jar
		if r.status != http.StatusForbidden {
			t.Errorf("%s: %d; want 403", tc.name, r.status)
		}
		if j := b.job(t, c.ID); j.State != queue.StateRunning || j.LeaseGen != c.LeaseGen {
			t.Fatalf("%s changed the job: %s gen %d", tc.name, j.State, j.LeaseGen)
		}
	}
	if n := len(b.eventKinds(t, c.ID)); n != 0 {
		t.Fatalf("refused posts recorded %d lease event kinds", n)
	}
	// The same form with the page's own token goes through: the refusals were the token's.
	r := b.act(t, page, action, "confirm", "yes")
	if r.status != http.StatusSeeOther || b.job(t, c.ID).State != queue.StateCancelled {
		t.Fatalf("the genuine form: %d, job %s", r.status, b.job(t, c.ID).State)
	}
}

func TestSessionCookieIsStrictAndHTTPOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.get(t, "/")
	ck := r.header.Get("Set-Cookie")
	mustContain(t, "session cookie", ck, sessionCookie+"=", "Path="+prefix+"/", "HttpOnly", "SameSite=Strict")
	// Once set, it is not set again: the token stays the same for the session.
	if r := b.get(t, "/jobs"); r.header.Get("Set-Cookie") != "" {
		t.Errorf("second page set the cookie again: %q", r.header.Get("Set-Cookie"))
	}
	if a, c := b.token(t, "/"), b.token(t, "/queues"); a != c {
		t.Errorf("tokens of one session differ: %q %q", a, c)
	}
}

func TestHostileValuesAreEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	script := `<script>alert("x")</script>`
	attr := `"><img src=x onerror=alert(1)>`
	long := strings.Repeat("A", 200_000)
	args := fmt.Sprintf(`{"name": %q, "quote": %q, "long": %q, "apos": "it's"}`, script, attr, long)
	j := b.insert(t, store.InsertParams{Kind: "hostile", Args: []byte(args),
		Metadata: []byte(fmt.Sprintf(`{"note": %q}`, script))})
	hostileWorker := `w<script>alert(2)</script>`
	c := b.claim(t, "default", hostileWorker, time.Minute)
	if _, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(c), store.FailParams{Err: attr + script, Trace: script}); err != nil {
		t.Fatal(err)
	}
	if err := store.RecordStaleWrite(b.ctx, b.db.Pool, queue.Lease{JobID: j.ID, Gen: 1, Holder: hostileWorker}, script); err != nil {
		t.Fatal(err)
	}
	// A completed job whose handler recorded hostile output.
	done := b.insert(t, store.InsertParams{Kind: "hostile-output", Queue: "out"})
	dc := b.claim(t, "out", "w", time.Minute)
	if dc.ID != done.ID {
		t.Fatalf("claimed %d, want %d", dc.ID, done.ID)
	}
	if err := store.CompleteWithOutput(b.ctx, b.db.Pool, store.LeaseOf(dc), []byte(fmt.Sprintf(`{"html": %q}`, script))); err != nil {
		t.Fatal(err)
	}
	outPage := b.page(t, fmt.Sprintf("/jobs/%d", done.ID))
	mustContain(t, "output", outPage, "Recorded output", "&lt;script&gt;alert(", "&lt;/script&gt;")
	mustNotContain(t, "output", outPage, "<script>alert")
	for _, p := range []string{"/", "/jobs", fmt.Sprintf("/jobs/%d", j.ID), "/jobs?error=" + url.QueryEscape(script),
		"/idempotency?scope=s&key=" + url.QueryEscape(script)} {
		body := b.page(t, p)
		mustNotContain(t, p, body, "<script>alert", "<img src=x", "onerror=alert(1)>")
		if p == fmt.Sprintf("/jobs/%d", j.ID) {
			mustContain(t, p, body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt;",
				"w&lt;script&gt;alert(2)&lt;/script&gt;", "it&#39;s")
			// A long value is shown whole on the job's page, cut in the list.
			if !strings.Contains(body, long) {
				t.Errorf("%s: the 200,000-character value is not shown", p)
			}
		}
		if p == "/jobs" && strings.Contains(body, long) {
			t.Errorf("the job list shows the whole 200,000-character value")
		}
	}
}

func TestPagesHaveNoInlineScriptOrStyle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.generations(t, "billing")
	scriptTag := regexp.MustCompile(`<script(\s[^>]*)?>`)
	for _, p := range []string{"/", "/jobs", fmt.Sprintf("/jobs/%d", j.ID), "/queues", "/workers", "/outbox", "/idempotency", "/nope"} {
		r := b.get(t, p)
		csp := r.header.Get("Content-Security-Policy")
		if csp != contentSecurityPolicy || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s: Content-Security-Policy %q", p, csp)
		}
		for _, h := range []string{"X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy"} {
			if r.header.Get(h) == "" {
				t.Errorf("%s: no %s header", p, h)
			}
		}
		for _, tag := range scriptTag.FindAllString(r.body, -1) {
			if !strings.Contains(tag, ` src="`) {
				t.Errorf("%s: inline script %s", p, tag)
			}
		}
		mustNotContain(t, p, r.body, "<style", " style=", " onclick=", " onload=", "javascript:")
	}
}

func TestReadOnlyHidesFormsAndRefusesPosts(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.ReadOnly = true })
	b.insert(t, store.InsertParams{Kind: "long", Queue: "billing"})
	c := b.claim(t, "billing", "w", time.Minute)
	b.addSchedule(t, "nightly")
	for _, p := range []string{"/", fmt.Sprintf("/jobs/%d", c.ID), "/queues", "/outbox?state=all", "/periodic"} {
		body := b.page(t, p)
		mustNotContain(t, p, body, `method="post"`, csrfField)
		mustContain(t, p, body, "read-only")
	}
	// Even a well-formed post (a token from a writable dashboard on the same secret) is refused.
	for _, action := range []string{fmt.Sprintf("/jobs/%d/cancel", c.ID), fmt.Sprintf("/jobs/%d/requeue", c.ID),
		"/queues/billing/pause", "/outbox/1/retry", "/periodic/nightly/pause", "/periodic/nightly/trigger"} {
		r := b.post(t, action, url.Values{csrfField: {b.h.csrf.token(strings.Repeat("A", 43))}, "confirm": {"yes"}})
		if r.status != http.StatusForbidden || !strings.Contains(r.body, "read-only") {
			t.Errorf("POST %s in read-only mode: %d", action, r.status)
		}
	}
	if j := b.job(t, c.ID); j.State != queue.StateRunning || j.LeaseGen != c.LeaseGen || b.queuePaused(t, "billing") ||
		b.schedulePaused(t, "nightly") {
		t.Fatalf("read-only posts changed something: job %s gen %d", j.State, j.LeaseGen)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) {
		c.Auth = Auth{Username: "ops", Password: "s3cret-s3cret-s3cret", Token: "tok-123-tok-123-tok-123"}
	})
	try := func(set func(*http.Request)) int {
		req, _ := http.NewRequest(http.MethodGet, b.url("/"), nil)
		if set != nil {
			set(req)
		}
		return b.do(t, req).status
	}
	r := b.get(t, "/")
	if r.status != http.StatusUnauthorized || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("no credentials: %d %q", r.status, r.header.Get("WWW-Authenticate"))
	}
	for name, c := range map[string]struct {
		set  func(*http.Request)
		want int
	}{
		"basic":               {func(r *http.Request) { r.SetBasicAuth("ops", "s3cret-s3cret-s3cret") }, 200},
		"basic wrong pass":    {func(r *http.Request) { r.SetBasicAuth("ops", "nope") }, 401},
		"basic wrong user":    {func(r *http.Request) { r.SetBasicAuth("root", "s3cret-s3cret-s3cret") }, 401},
		"bearer":              {func(r *http.Request) { r.Header.Set("Authorization", "Bearer tok-123-tok-123-tok-123") }, 200},
		"bearer wrong":        {func(r *http.Request) { r.Header.Set("Authorization", "Bearer tok-124-tok-124-tok-124") }, 401},
		"token as a password": {func(r *http.Request) { r.SetBasicAuth("anyone", "tok-123-tok-123-tok-123") }, 200},
		"static needs auth":   {nil, 401},
	} {
		if got := try(c.set); got != c.want {
			t.Errorf("%s: %d; want %d", name, got, c.want)
		}
	}
	if s := fmt.Sprint(b.h.cfg.Auth); strings.Contains(s, "s3cret") || strings.Contains(s, "tok-123") {
		t.Errorf("Auth prints its secrets: %s", s)
	}
}

func TestListenRefusesNonLoopbackWithoutAuth(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		ln, err := listen(addr, false)
		if !errors.Is(err, ErrInsecureBind) {
			if ln != nil {
				ln.Close()
			}
			t.Errorf("listen(%q) without auth: %v; want ErrInsecureBind", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "127.0.0.2:0"} {
		ln, err := listen(addr, false)
		if err != nil {
			t.Errorf("listen(%q) without auth: %v", addr, err)
			continue
		}
		if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			t.Errorf("listen(%q) bound %s", addr, ip)
		}
		ln.Close()
	}
	// With auth a non-loopback address is accepted (nothing is sent to it).
	ln, err := listen("0.0.0.0:0", true)
	if err != nil {
		t.Fatalf("listen on every interface with auth: %v", err)
	}
	ln.Close()
	if _, err := listen("no-port", false); err == nil {
		t.Error("an address without a port was accepted")
	}
}
