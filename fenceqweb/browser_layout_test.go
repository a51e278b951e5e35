package fenceqweb

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// emulateColorScheme makes prefers-color-scheme match scheme ("light" or "dark").
func emulateColorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	})
}

// layoutJS measures the page: the document's scroll width against the viewport, and
// whether the navigation's box overlaps the main content's.
const layoutJS = `(() => {
  const nav = document.querySelector('header.top nav').getBoundingClientRect();
  const head = document.querySelector('header.top').getBoundingClientRect();
  const main = document.querySelector('main').getBoundingClientRect();
  const overlap = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  return JSON.stringify({
    scroll: document.documentElement.scrollWidth, body: document.body.scrollWidth, viewport: window.innerWidth,
    navOverlaps: overlap(nav, main), headOverlaps: overlap(head, main),
    navBottom: nav.bottom, headBottom: head.bottom, mainTop: main.top});
})()`

type layout struct {
	Scroll, Body, Viewport         float64
	NavOverlaps, HeadOverlaps      bool
	NavBottom, HeadBottom, MainTop float64
}

// luminance of a CSS rgb()/rgba() color, 0 (black) to 1 (white).
func luminance(t *testing.T, css string) float64 {
	t.Helper()
	s := strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(css, "rgba("), "rgb("), ")")
	parts := strings.Split(s, ",")
	if len(parts) < 3 {
		t.Fatalf("color %q is not rgb()", css)
	}
	var c [3]float64
	for i := range 3 {
		v, err := strconv.ParseFloat(strings.TrimSpace(parts[i]), 64)
		if err != nil {
			t.Fatalf("color %q: %v", css, err)
		}
		c[i] = v / 255
	}
	return 0.2126*c[0] + 0.7152*c[1] + 0.0722*c[2]
}

// TestBrowserLayout checks the layout in headless Chromium: at 390 px wide no page
// scrolls sideways and the navigation does not overlap the content; at 1,400 px the
// periodic table is not clipped; the colours follow prefers-color-scheme.
func TestBrowserLayout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := newBrowser(t)
	dir := artifactsDir(t)
	j := b.generations(t, "billing")
	b.populate(t)
	if _, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: "nightly-billing-run-for-every-customer",
		Spec: "0 30 2 * * 1-5", Timezone: "Europe/Amsterdam", Kind: "billing.invoice.monthly-statement",
		Queue: "billing-statements", Source: queue.SourceCLI}); err != nil {
		t.Fatal(err)
	}
	b.addSchedule(t, "hourly")
	if _, err := store.Insert(b.ctx, b.db.Pool, store.InsertParams{Kind: "noop", Queue: "a-rather-long-queue-name-for-narrow-screens"}); err != nil {
		t.Fatal(err)
	}
	pages := []string{"/", "/jobs", fmt.Sprintf("/jobs/%d", j.ID), "/queues", "/workers", "/periodic", "/outbox", "/idempotency"}

	measure := func(p string) layout {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](layoutJS))
		if err != nil {
			t.Fatalf("measure %s: %v", p, err)
		}
		var l layout
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("measure %s: %v (%s)", p, err, s)
		}
		return l
	}
	load := func(p string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Navigate(b.url(p)), chromedp.WaitVisible(chromedp.CSS("main"))); err != nil {
			t.Fatalf("load %s: %v", p, err)
		}
	}

	const narrow = 390
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(narrow, 844)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		load(p)
		l := measure(p)
		if l.Viewport != narrow || l.Scroll > narrow || l.Body > narrow {
			t.Errorf("%s at 390 px: scroll width %v (body %v) > viewport %v", p, l.Scroll, l.Body, l.Viewport)
		}
		if l.NavOverlaps || l.HeadOverlaps {
			t.Errorf("%s at 390 px: the navigation (bottom %v, header bottom %v) overlaps the content (top %v)",
				p, l.NavBottom, l.HeadBottom, l.MainTop)
		}
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	b.save(t, dir, "narrow-idempotency.png", png)
	load("/periodic")
	if png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100)); err != nil {
		t.Fatal(err)
	}
	b.save(t, dir, "narrow-periodic.png", png)

	// 1,400 px: the periodic table fits its card.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000)); err != nil {
		t.Fatal(err)
	}
	load("/periodic")
	clip, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
  const table = document.querySelector('main table'), card = table.closest('.card');
  const tr = table.getBoundingClientRect(), cr = card.getBoundingClientRect();
  return JSON.stringify({tableScroll: table.scrollWidth, tableClient: table.clientWidth, cardScroll: card.scrollWidth,
    cardClient: card.clientWidth, tableRight: tr.right, cardRight: cr.right, doc: document.documentElement.scrollWidth,
    viewport: window.innerWidth});
})()`))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		TableScroll, TableClient, CardScroll, CardClient, TableRight, CardRight, Doc, Viewport float64
	}
	if err := json.Unmarshal([]byte(clip), &c); err != nil {
		t.Fatal(err)
	}
	t.Logf("periodic at 1,400 px: %+v", c)
	if c.TableScroll > c.TableClient || c.CardScroll > c.CardClient || c.TableRight > c.CardRight || c.Doc > c.Viewport {
		t.Errorf("the periodic table is clipped at 1,400 px: %+v", c)
	}
	if png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100)); err != nil {
		t.Fatal(err)
	}
	b.save(t, dir, "periodic.png", png)

	// Dark and light: the body's background follows prefers-color-scheme.
	for _, scheme := range []string{"dark", "light"} {
		if err := chromedp.Do(ctx, emulateColorScheme(scheme)); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"/", fmt.Sprintf("/jobs/%d", j.ID)} {
			load(p)
			bg, err := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.body).backgroundColor`))
			if err != nil {
				t.Fatal(err)
			}
			card, err := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector('.card')).backgroundColor`))
			if err != nil {
				t.Fatal(err)
			}
			ink, err := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.body).color`))
			if err != nil {
				t.Fatal(err)
			}
			lb, lc, li := luminance(t, bg), luminance(t, card), luminance(t, ink)
			if scheme == "dark" && (lb > 0.2 || lc > 0.25 || li < 0.6) {
				t.Errorf("%s in dark mode: background %s, card %s, text %s; want dark surfaces and light text", p, bg, card, ink)
			}
			if scheme == "light" && (lb < 0.8 || lc < 0.9 || li > 0.3) {
				t.Errorf("%s in light mode: background %s, card %s, text %s; want light surfaces and dark text", p, bg, card, ink)
			}
		}
		if png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100)); err != nil {
			t.Fatal(err)
		}
		b.save(t, dir, "job-"+scheme+".png", png)
	}
}

// TestBrowserForeignHost: a page of another site whose name resolves to 127.0.0.1 (as
// after DNS rebinding) gets 421 for the dashboard's pages, hands out no session
// cookie, and its script's POST to an action is refused and changes nothing.
func TestBrowserForeignHost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const foreign = "rebind.example"
	ctx := newBrowser(t,
		chromedp.Flag("host-resolver-rules", "MAP "+foreign+" 127.0.0.1, MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"),
		chromedp.Flag("proxy-bypass-list", foreign))
	b.insert(t, store.InsertParams{Queue: "billing"})
	base := "http://" + foreign + ":" + b.port(t) + prefix
	for _, p := range []string{"/", "/queues"} {
		res, err := chromedp.RunResponse(ctx, chromedp.Navigate(base+p))
		if err != nil {
			t.Fatalf("navigate to %s%s: %v", base, p, err)
		}
		if res.Status != http.StatusMisdirectedRequest {
			t.Errorf("%s%s in the browser: %d; want 421", base, p, res.Status)
		}
		for k := range res.Headers {
			if strings.EqualFold(k, "Set-Cookie") {
				t.Errorf("%s%s set a cookie", base, p)
			}
		}
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, "misdirected request") || strings.Contains(text, "Overview") {
			t.Errorf("%s%s shows %q", base, p, text)
		}
	}
	// The rebinding page's script posts the pause, confirmed.
	st, err := chromedp.Run(ctx, chromedp.Evaluate[int](`fetch('`+prefix+`/queues/billing/pause', {method: 'POST',
  body: new URLSearchParams({confirm: 'yes', csrf_token: 'x'})}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if st != http.StatusMisdirectedRequest {
		t.Errorf("the foreign page's POST: %d; want 421", st)
	}
	if b.queuePaused(t, "billing") {
		t.Fatal("a page of another site paused the queue")
	}
	// The dashboard under its own name still works in the same browser.
	if err := chromedp.Do(ctx, chromedp.Navigate(b.url("/queues")), chromedp.WaitVisible(chromedp.CSS(`form[action$="queues/billing/pause"]`))); err != nil {
		t.Fatalf("the dashboard under 127.0.0.1: %v", err)
	}
}

// Failed logins from the browser are throttled: after LoginFailureLimit wrong tokens the
// dashboard answers 429 with Retry-After, even to the right token, until the window
// ends; then the right token signs in.
func TestBrowserLoginThrottle(t *testing.T) {
	t.Parallel()
	const token = "a-long-enough-bearer-token"
	b := setup(t, func(c *Config) { c.Auth = Auth{Token: token} })
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	b.h.throttle.now = clock.now
	ctx := newBrowser(t)
	setBearer := func(bearer string) {
		t.Helper()
		headers := network.Headers{}
		if bearer != "" {
			headers["Authorization"] = "Bearer " + bearer
		}
		if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
				return err
			}
			_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: headers})
			return err
		})); err != nil {
			t.Fatal(err)
		}
	}
	// A navigation with a token the dashboard refuses ends in Chromium's own error for
	// credentials it cannot answer (the 401's challenge); a throttled one shows the 429
	// page, with its Retry-After.
	// The page left behind is replaced by a blank one first: its icon, stylesheet or live
	// refresh must not reach the dashboard with the next, wrong token and count as a
	// failed login of their own.
	visit := func(bearer string) (int64, string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
			t.Fatalf("leave the page: %v", err)
		}
		setBearer(bearer)
		res, err := chromedp.RunResponse(ctx, chromedp.Navigate(b.url("/queues")))
		if err != nil && strings.Contains(err.Error(), "ERR_INVALID_AUTH_CREDENTIALS") {
			return http.StatusUnauthorized, ""
		}
		if err != nil {
			t.Fatalf("navigate: %v", err)
		}
		retry := ""
		for k, v := range res.Headers {
			if strings.EqualFold(k, "Retry-After") {
				retry = fmt.Sprint(v)
			}
		}
		return res.Status, retry
	}
	if st, _ := visit(token); st != http.StatusOK {
		t.Fatalf("the right token: %d; want 200", st)
	}
	for i := range LoginFailureLimit {
		if st, _ := visit(fmt.Sprintf("wrong-token-number-%d", i)); st != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d; want 401", i+1, st)
		}
	}
	for _, bearer := range []string{"wrong-token-once-more", token} {
		if st, retry := visit(bearer); st != http.StatusTooManyRequests || retry != "60" {
			t.Fatalf("after %d failures: %d, Retry-After %q; want 429 and 60", LoginFailureLimit, st, retry)
		}
	}
	clock.advance(time.Minute)
	if st, _ := visit(token); st != http.StatusOK {
		t.Fatalf("once the window ended, the right token: %d; want 200", st)
	}
}
