package fenceqweb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// chromiumPath is Debian's chromium package; FENCEQ_CHROMIUM overrides it.
func chromiumPath() string {
	if p := os.Getenv("FENCEQ_CHROMIUM"); p != "" {
		return p
	}
	return "/usr/bin/chromium"
}

// artifactsDir is where the browser test saves its screenshots: FENCEQ_ARTIFACTS, else
// testdata/artifacts beside this file (ignored by git).
func artifactsDir(t *testing.T) string {
	dir := os.Getenv("FENCEQ_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newBrowser starts headless Chromium that can reach nothing but loopback: no
// background networking, component updates, sync or QUIC; every host name resolves
// to nothing except 127.0.0.1, and any other address would go through a proxy on a
// loopback port where nothing listens (Chromium sends loopback addresses direct).
// extra adds or overrides flags.
func newBrowser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path := chromiumPath()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("headless Chromium is missing at %s: install it with `apt-get install -y chromium` (or set FENCEQ_CHROMIUM)", path)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"),
		chromedp.Flag("proxy-server", "http://127.0.0.1:9"),
		chromedp.Flag("user-data-dir", t.TempDir()),
		chromedp.Flag("window-size", "1400,1000"),
		chromedp.Flag("hide-scrollbars", true),
	)
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000)); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// populate gives the dashboard an hour of history to show: jobs finished in every
// minute of the last hour (some after failed attempts), a backlog, and live workers.
func (b *testBundle) populate(t *testing.T) {
	t.Helper()
	for _, w := range []struct {
		id     string
		queues []string
	}{{"billing-7f9c", []string{"billing", "default"}}, {"mailer-1a2b", []string{"outbox", "email"}}} {
		if err := store.RegisterWorker(b.ctx, b.db.Pool, w.id, "app-"+w.id[:6], 4100, w.queues, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.db.Pool.Exec(b.ctx, `
INSERT INTO fenceq_jobs (queue, kind, args, state, attempt, lease_gen, leased_by, attempted_at, heartbeat_at,
    errors, created_at, finished_at)
SELECT q, k, jsonb_build_object('customer_id', n % 500), s, 1 + (n % 9 = 0)::int, 1 + (n % 9 = 0)::int,
       'billing-7f9c', f - interval '2 seconds', f - interval '1 second',
       CASE WHEN n % 9 = 0 THEN jsonb_build_array(jsonb_build_object('at', f - interval '20 seconds', 'attempt', 1,
            'lease_gen', 1, 'worker', 'billing-7f9c', 'error', 'tax service: 503')) ELSE '[]' END,
       f - interval '3 seconds', f
FROM (
    SELECT m, n, now() - (m * 60 + n % 60) * interval '1 second' AS f,
           (ARRAY['default', 'billing', 'outbox', 'email'])[1 + n % 4] AS q,
           (ARRAY['invoice', 'order.place', 'outbox.deliver', 'noop'])[1 + n % 4] AS k,
           CASE WHEN n % 97 = 0 THEN 'discarded' ELSE 'completed' END AS s
    FROM generate_series(0, 59) AS m,
         LATERAL generate_series(1, (40 + 25 * sin(m / 6.0) + 10 * cos(m / 2.0))::int) AS n) x`)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		q := []string{"default", "billing", "outbox"}[i%3]
		b.insert(t, store.InsertParams{Queue: q, Kind: "invoice", Args: []byte(fmt.Sprintf(`{"customer_id": %d}`, i))})
	}
	for i := range 12 {
		b.insert(t, store.InsertParams{Queue: "default", Kind: "email.send", RunIn: time.Hour,
			Args: []byte(fmt.Sprintf(`{"to": "user%d@example.com"}`, i))})
	}
	for range 3 {
		b.claim(t, "default", "billing-7f9c", time.Hour)
	}
	b.rollUpToNow(t)
}

func (b *testBundle) save(t *testing.T, dir, name string, png []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	// FENCEQ_DOCS_IMG=1 refreshes the README's screenshots.
	if os.Getenv("FENCEQ_DOCS_IMG") == "1" && (name == "overview.png" || name == "lease-timeline.png") {
		docs := filepath.Join("..", "docs", "img")
		if err := os.MkdirAll(docs, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(docs, "dashboard-"+name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBrowser drives the dashboard in headless Chromium: the overview, a job whose
// lease went through several generations (claim, revocation of a paused holder,
// re-claim, the old holder's stale write rejected), a live update without a reload,
// pausing a queue through its confirmation step, and retrying a job; each change is
// checked in the database.
func TestBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := newBrowser(t)
	dir := artifactsDir(t)
	j := b.generations(t, "billing")
	b.populate(t)

	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	shot := func(name, sel string) {
		t.Helper()
		var png []byte
		var err error
		if sel == "" {
			png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
		} else {
			png, err = chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(sel)))
		}
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		b.save(t, dir, name, png)
	}

	// The overview: its alert tiles, chart and queues, and the live script running.
	run("load the overview", chromedp.Navigate(b.url("/")), chromedp.WaitVisible(chromedp.CSS("svg.chart")),
		chromedp.WaitVisible(chromedp.CSS("#live-status.ok")))
	alerts := text(".alerts")
	for _, want := range []string{"ALERT", "stale writes rejected", "leases expired while the holder lived"} {
		if !strings.Contains(alerts, want) {
			t.Errorf("overview alerts lack %q: %q", want, alerts)
		}
	}
	if q := text("section.card:last-of-type table"); !strings.Contains(q, "billing") || !strings.Contains(q, "email") {
		t.Errorf("overview queues: %q", q)
	}
	shot("overview.png", "")

	// The job with several generations, opened from the overview's lease events.
	run("open the job", chromedp.Click(chromedp.CSS(fmt.Sprintf(`.card a[href="./jobs/%d"]`, j.ID))),
		chromedp.WaitVisible(chromedp.CSS("ol.timeline")))
	tl := text("ol.timeline")
	for _, want := range []string{"gen 1", "worker-a", "expired while the holder lived", "stale write rejected by the database",
		"gen 2", "no holder", "gen 3", "worker-b", "holds the lease now"} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %q:\n%s", want, tl)
		}
	}
	shot("lease-timeline.png", ".timeline-card")
	shot("job.png", "")

	// A change in the database shows without a reload: an operator cancels the job
	// from the CLI; the page's live part refreshes and the document stays the same.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int]("window.fenceqTestMarker = 7")); err != nil {
		t.Fatal(err)
	}
	if _, err := store.CancelJob(b.ctx, b.db.Pool, j.ID, "cancelled from the CLI"); err != nil {
		t.Fatal(err)
	}
	run("see the cancellation live", chromedp.WaitVisible(chromedp.CSS("h1 .st-cancelled")))
	if m, err := chromedp.Run(ctx, chromedp.Evaluate[int]("window.fenceqTestMarker")); err != nil || m != 7 {
		t.Fatalf("the page reloaded to show the change (marker %d, %v)", m, err)
	}
	if tl := text("ol.timeline"); !strings.Contains(tl, "revoked: cancelled by operator") || !strings.Contains(tl, "gen 4") {
		t.Errorf("timeline after the cancellation:\n%s", tl)
	}

	// Retry it from its page.
	run("retry the job", chromedp.Click(chromedp.CSS(`form[action$="/retry"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".flash")))
	if f := text(".flash"); !strings.Contains(f, "Job retried") {
		t.Errorf("flash after retry: %q", f)
	}
	if got := b.job(t, j.ID); got.State != queue.StateAvailable {
		t.Fatalf("after the browser's retry the job is %s; want available", got.State)
	}

	// Pause a queue: the confirmation page, then the queue is paused in the database.
	run("pause billing", chromedp.Navigate(b.url("/queues")),
		chromedp.Click(chromedp.CSS(`form[action$="queues/billing/pause"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".confirm-form")))
	if h := text("h1"); !strings.Contains(h, "Pause queue billing?") {
		t.Errorf("confirmation heading %q", h)
	}
	if b.queuePaused(t, "billing") {
		t.Fatal("the confirmation page paused the queue")
	}
	shot("confirm-pause.png", "")
	run("confirm the pause", chromedp.Click(chromedp.CSS(".confirm-form button")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	if !b.queuePaused(t, "billing") {
		t.Fatal("billing is not paused after the confirmation")
	}
	if row := text("table tbody"); !strings.Contains(row, "paused") {
		t.Errorf("queues page after pausing: %q", row)
	}
	shot("queues.png", "")
	t.Logf("screenshots in %s", dir)
}

// TestBrowserBulkActionByFilter drives a bulk cancel by filter end to end in Chromium:
// filter the job list, ask to cancel all, read the count on the confirmation page,
// confirm, and find the jobs cancelled and the action in the audit trail.
func TestBrowserBulkActionByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := newBrowser(t)
	var reports []int64
	for i := range 4 {
		j := b.insert(t, store.InsertParams{Queue: "reports", Kind: "report.build", Args: []byte(fmt.Sprintf(`{"month": %d}`, i+1))})
		reports = append(reports, j.ID)
	}
	other := b.insert(t, store.InsertParams{Queue: "reports", Kind: "report.mail"})
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	run("filter the job list", chromedp.Navigate(b.url("/jobs?kind=report.build")),
		chromedp.WaitVisible(chromedp.CSS(`#bulk-filter button[value="cancel"]`)))
	run("cancel all", chromedp.Click(chromedp.CSS(`#bulk-filter button[value="cancel"]`)),
		chromedp.WaitVisible(chromedp.CSS("#bulk-confirm")))
	count, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(".bulk-count")))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(count) != "4" {
		t.Fatalf("the confirmation page counts %q jobs; want 4", count)
	}
	// Nothing has changed before the confirmation.
	if j, err := store.GetJob(b.ctx, b.db.Pool, reports[0]); err != nil || j.State != queue.StateAvailable {
		t.Fatalf("job %d before the confirmation: %+v, %v", reports[0], j, err)
	}
	run("confirm", chromedp.Click(chromedp.CSS("#bulk-confirm")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	for _, id := range reports {
		if j, err := store.GetJob(b.ctx, b.db.Pool, id); err != nil || j.State != queue.StateCancelled {
			t.Fatalf("job %d after the bulk cancel: %+v, %v", id, j, err)
		}
	}
	if j, err := store.GetJob(b.ctx, b.db.Pool, other.ID); err != nil || j.State != queue.StateAvailable {
		t.Fatalf("a job of another kind after the bulk cancel: %+v, %v", j, err)
	}
	recs, err := store.ListAudit(b.ctx, b.db.Pool, queue.AuditParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Action != queue.AuditCancel || len(recs[0].JobIDs) != 4 || recs[0].Filter == nil ||
		recs[0].Filter.Kind != "report.build" || !strings.HasPrefix(recs[0].Actor, "dashboard:") || recs[0].Detail != "confirmed 4 jobs" {
		t.Fatalf("audit after the bulk cancel: %+v", recs)
	}
	// The job's page shows the record.
	run("open a cancelled job", chromedp.Navigate(b.url(fmt.Sprintf("/jobs/%d", reports[0]))),
		chromedp.WaitVisible(chromedp.CSS("table.audit")))
	audit, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("table.audit")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(audit, "cancel") || !strings.Contains(audit, "bulk by filter") {
		t.Fatalf("the job page's audit section: %q", audit)
	}
}
