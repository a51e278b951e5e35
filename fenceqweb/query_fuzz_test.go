package fenceqweb

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
)

// fuzzRoutes are the dashboard's routes, "{}" standing for the fuzzed path segment.
var fuzzRoutes = []struct{ method, path string }{
	{http.MethodGet, "/"},
	{http.MethodGet, "/jobs"},
	{http.MethodGet, "/jobs/{}"},
	{http.MethodGet, "/queues"},
	{http.MethodGet, "/workers"},
	{http.MethodGet, "/outbox"},
	{http.MethodGet, "/idempotency"},
	{http.MethodGet, "/periodic"},
	{http.MethodGet, "/static/{}"},
	{http.MethodGet, "/{}"},
	{http.MethodPost, "/jobs/{}/retry"},
	{http.MethodPost, "/jobs/{}/cancel"},
	{http.MethodPost, "/jobs/{}/requeue"},
	{http.MethodPost, "/outbox/{}/retry"},
	{http.MethodPost, "/queues/{}/pause"},
	{http.MethodPost, "/queues/{}/resume"},
	{http.MethodPost, "/periodic/{}/pause"},
	{http.MethodPost, "/periodic/{}/resume"},
	{http.MethodPost, "/periodic/{}/trigger"},
	{http.MethodPost, "/jobs/bulk"},
}

// FuzzDashboardRequest sends fuzzed query strings, path segments (job and outbox ids,
// queue and schedule names, static file names) and action forms to the dashboard, on a
// schema holding a few jobs. Whatever the input, the answer is a page with a status
// below 500: bad input is a 4xx naming what was wrong, never a panic or a failure of
// the database request. Actions carry a valid session and token, so that their input
// reaches the handlers.
func FuzzDashboardRequest(f *testing.F) {
	db := fenceqtest.New(f, nil)
	ctx := context.Background()
	for _, q := range []string{"default", "mail"} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO fenceq_jobs (queue, kind, args, tags)
			VALUES ($1, 'invoice', '{"customer_id": 42}', '{monthly}')`, q); err != nil {
			f.Fatal(err)
		}
	}
	h, err := New(Config{DB: db.Pool, Logger: fenceqtest.QuietLogger()})
	if err != nil {
		f.Fatal(err)
	}
	session := base64.RawURLEncoding.EncodeToString(make([]byte, sessionBytes))
	token := h.csrf.token(session)

	for i, r := range fuzzRoutes {
		seg := ""
		if strings.Contains(r.path, "{}") {
			seg = "1"
		}
		f.Add(uint8(i), seg, "", "confirm=yes")
	}
	for _, s := range []struct {
		route      int
		seg, query string
	}{
		{1, "", "state=running&queue=default&kind=invoice&tag=monthly&args=%7B%22a%22%3A1%7D&meta=%7B%22t%22%3A%22x%22%7D&error=refused&from=2026-01-01T00%3A00&to=2026-02-01T00%3A00&before=10"},
		{1, "", "args=%5B%5D"}, {1, "", "args=%7B%7D"}, {1, "", "meta=%7B"}, {1, "", "error=%21"}, {1, "", "from=2026-13-01T00%3A00"},
		{1, "", "from=2026-02-01T00%3A00&to=2026-01-01T00%3A00"},
		{1, "", "state=nope"}, {1, "", "state=%00"}, {1, "", "queue=bad%20queue"}, {1, "", "kind=%ff"},
		{1, "", "error=%00"}, {1, "", "error=%ff%fe"}, {1, "", "error=" + strings.Repeat("x", 201)}, {1, "", "error=%25_%5C"},
		{1, "", "tag=-x"}, {1, "", "before=0"}, {1, "", "before=-1"}, {1, "", "before=9223372036854775807"},
		{1, "", "before=9223372036854775808"}, {1, "", "before=1e3"}, {1, "", "flash=job-retried"},
		{1, "", "flash=%3Cscript%3E"}, {1, "", "%zz"}, {1, "", "state=available&state=running"}, {1, "", ";;&&=="},
		{2, "0", ""}, {2, "-1", ""}, {2, "9223372036854775807", ""}, {2, "9223372036854775808", ""},
		{2, "abc", ""}, {2, " 1", ""}, {2, "1\x00", ""}, {2, "\xff", ""},
		{5, "", "state=all"}, {5, "", "state=failed&before=5"}, {5, "", "state="}, {5, "", "state=bogus"},
		{5, "", "before=x"}, {6, "", "scope=orders&key=k-1"}, {6, "", "scope=&key=k"}, {6, "", "scope=orders&key=%00"},
		{6, "", "scope=orders&key=" + strings.Repeat("k", 256)}, {6, "", "scope=%ff&key=k"},
		{8, "app.css", ""}, {8, "..", ""}, {8, "%00", ""}, {8, "nope.js", ""}, {9, "nope", ""},
		{14, "mail", ""}, {14, "bad queue", ""}, {14, "\x00", ""}, {14, "\xff", ""}, {14, strings.Repeat("q", 65), ""},
		{15, "mail", ""}, {16, "nightly", ""}, {16, "\x00", ""}, {18, "nope", ""}, {18, strings.Repeat("n", 65), ""},
		{10, "0", ""}, {11, "9223372036854775808", ""}, {12, "2", ""}, {13, "x", ""},
	} {
		f.Add(uint8(s.route), s.seg, s.query, "confirm=yes&back=overview")
	}
	for _, form := range []string{"action=cancel&scope=filter&kind=invoice", "action=cancel&scope=filter",
		"action=retry&scope=selected&id=1&id=2", "action=retry&scope=selected", "action=nuke&kind=a",
		"action=delete&scope=selected&id=x", "action=requeue&kind=a&confirm=yes&count=1&upto=5",
		"action=requeue&kind=a&confirm=yes&count=-1&upto=5", "action=requeue&kind=a&confirm=yes&count=1&upto=x",
		"action=cancel&args=%7B%7D", "action=cancel&error=%00"} {
		f.Add(uint8(len(fuzzRoutes)-1), "", "", form)
	}

	f.Fuzz(func(t *testing.T, route uint8, seg, query, form string) {
		rt := fuzzRoutes[int(route)%len(fuzzRoutes)]
		var body io.Reader
		if rt.method == http.MethodPost {
			// The token first: a fuzzed form holding csrf_token too does not replace it.
			body = strings.NewReader(url.Values{csrfField: {token}}.Encode() + "&" + form)
		}
		req, err := http.NewRequest(rt.method, "http://dashboard.test/", body)
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Path = strings.ReplaceAll(rt.path, "{}", seg)
		req.URL.RawQuery = query
		req.RequestURI = req.URL.RequestURI()
		if rt.method == http.MethodPost {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			req.AddCookie(&http.Cookie{Name: sessionCookie, Value: session})
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s?%s (form %q): %d\n%s", rt.method, req.URL.Path, query, form, rec.Code, rec.Body.String())
		}
		if rec.Code == http.StatusForbidden && rt.method == http.MethodPost && len(form) < 60<<10 {
			t.Fatalf("%s %s: 403 although the session and token are valid\n%s", rt.method, req.URL.Path, rec.Body.String())
		}
	})
}
