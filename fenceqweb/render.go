package fenceqweb

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/queue"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// page is what a page handler returns: which template renders which data.
type page struct {
	title string
	// template names the page's file, templates/NAME.html, which defines "content"
	// and, for a page with a live part, "live".
	template string
	// nav is the path of the section the page belongs to, highlighted in the navigation.
	nav    string
	status int
	data   any
}

// view is what every template receives.
type view struct {
	Title    string
	Root     string // relative URL of the dashboard's root, ending in "/"
	Nav      []navItem
	ReadOnly bool
	CSRF     string
	Flash    string
	// Refresh is the live part's refresh interval in milliseconds.
	Refresh int64
	Static  map[string]string
	// Zone names the time zone times are shown in.
	Zone string
	Data any
}

type navItem struct {
	Name, Href string
	Active     bool
}

// fragmentHeader asks for a page's live part alone; the response carries it back.
const fragmentHeader = "X-Fenceq-Fragment"

// flashes are the messages an action's redirect may show, by code: a code from the
// URL selects one of these and nothing else.
var flashes = map[string]string{
	"retried":        "Job retried: it is available again.",
	"cancelled":      "Job cancelled.",
	"requeued":       "Job requeued: it is available again; a running holder's lease was revoked.",
	"paused":         "Queue paused: workers claim nothing from it; running jobs continue.",
	"resumed":        "Queue resumed.",
	"outbox-retried": "Outbox row retried: it is pending with a new delivery job.",

	"bulk-retry":   "Bulk retry done: the jobs it applied to are available again. The job pages' audit sections name each one.",
	"bulk-cancel":  "Bulk cancel done: running jobs' leases were revoked; finished jobs were left as they were.",
	"bulk-requeue": "Bulk requeue done: the jobs are available again; running holders' leases were revoked.",
	"bulk-delete":  "Bulk delete done: running jobs were left alone (cancel or requeue them first).",

	"periodic-paused":    "Schedule paused: no worker enqueues its slots until it is resumed.",
	"periodic-resumed":   "Schedule resumed: it goes on at its next slot.",
	"periodic-triggered": "Schedule triggered: this job was enqueued now, outside its slots.",
}

// templates holds one template set per page file, each with the layout.
type templates struct {
	pages map[string]*template.Template
}

func parseTemplates() (*templates, error) {
	base, err := template.New("base").Funcs(funcs()).ParseFS(templateFS, "templates/layout.html", "templates/parts.html")
	if err != nil {
		return nil, fmt.Errorf("parse layout: %w", err)
	}
	files, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	t := &templates{pages: map[string]*template.Template{}}
	for _, f := range files {
		name := strings.TrimSuffix(path.Base(f), ".html")
		if name == "layout" || name == "parts" {
			continue
		}
		set, err := base.Clone()
		if err != nil {
			return nil, err
		}
		if _, err := set.ParseFS(templateFS, f); err != nil {
			return nil, fmt.Errorf("parse %s: %w", f, err)
		}
		t.pages[name] = set
	}
	return t, nil
}

// render writes a page, or only its live part when the request asks for it. Output is
// rendered into a buffer first, so a template error becomes a 500, not half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, p *page) {
	set, ok := h.tmpl.pages[p.template]
	if !ok {
		http.Error(w, "no template "+p.template, http.StatusInternalServerError)
		return
	}
	v := view{
		Title: p.title, Root: relRoot(r.URL.Path), ReadOnly: h.cfg.ReadOnly,
		Refresh: h.cfg.RefreshInterval.Milliseconds(), Static: h.static.urls, Zone: h.cfg.Location.String(), Data: p.data,
	}
	if !h.cfg.ReadOnly {
		v.CSRF = h.csrf.token(h.csrf.session(w, r, h.secure(r)))
	}
	v.Flash = flashes[r.URL.Query().Get("flash")]
	for _, s := range sections() {
		if s.name == "" {
			continue
		}
		v.Nav = append(v.Nav, navItem{Name: s.name, Href: v.Root + strings.TrimPrefix(s.path, "/"), Active: s.path == p.nav})
	}
	name := "layout"
	if r.Header.Get(fragmentHeader) == "live" && set.Lookup("live") != nil {
		name = "live"
	}
	var buf bytes.Buffer
	if err := set.ExecuteTemplate(&buf, name, v); err != nil {
		h.cfg.Logger.Error("dashboard template failed", "template", p.template, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Add("Vary", fragmentHeader)
	if name == "live" {
		hd.Set(fragmentHeader, "live")
	}
	status := p.status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// staticFiles serves the embedded script, stylesheet and icon. Their URLs carry a hash
// of the content, so they can be cached for long.
type staticFiles struct {
	files map[string][]byte
	urls  map[string]string // file name -> "static/NAME?v=HASH", relative to the root
}

func loadStatic() (*staticFiles, error) {
	s := &staticFiles{files: map[string][]byte{}, urls: map[string]string{}}
	entries, err := fs.ReadDir(staticFS, "static")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := fs.ReadFile(staticFS, "static/"+e.Name())
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		s.files[e.Name()] = b
		s.urls[e.Name()] = "static/" + e.Name() + "?v=" + hex.EncodeToString(sum[:6])
	}
	return s, nil
}

func (s *staticFiles) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	b, ok := s.files[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "public, max-age=86400")
	_, _ = w.Write(b)
}

// funcs are the helpers templates use. Everything they return is text that
// html/template escapes; none returns template.HTML.
func funcs() template.FuncMap {
	return template.FuncMap{
		"num":        formatInt,
		"age":        health.Age,
		"str":        func(s *string) string { return deref(s) },
		"short":      shorten,
		"json":       prettyJSON,
		"bytes":      printable,
		"hexs":       func(b []byte) string { return hex.EncodeToString(b) },
		"stateCls":   func(s any) string { return "st-" + fmt.Sprint(s) },
		"query":      query,
		"lastError":  lastError,
		"add":        func(a, b int) int { return a + b },
		"int64":      func(i int) int64 { return int64(i) },
		"states":     queue.JobStates,
		"orDash":     orDash,
		"eventLabel": func(k queue.LeaseEventKind) string { return eventLabels[k] },
		"f1":         func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"plus":       func(a, b float64) float64 { return a + b },
		"leaseView": func(root string, c clock, jobs []*queue.JobRow) leaseView {
			return leaseView{Root: root, Clock: c, Jobs: jobs}
		},
	}
}

// eventLabels name the lease event kinds for people.
var eventLabels = map[queue.LeaseEventKind]string{
	queue.EventRevoked:            "leases revoked",
	queue.EventStaleWriteRejected: "stale writes rejected",
	queue.EventExpiredHolderAlive: "expired, holder alive",
	queue.EventHeartbeatLost:      "heartbeats found the lease gone",
}

// leaseView is what the "leases" template of the workers page receives.
type leaseView struct {
	Root  string
	Clock clock
	Jobs  []*queue.JobRow
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// formatInt prints 1234567 as 1,234,567.
func formatInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// shorten cuts s to at most n bytes at a character boundary, with "…" when cut, and
// puts it on one line.
func shorten(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return queue.StorableText(s, n)
}

// prettyJSON indents a JSON document for reading; invalid JSON comes back as it is.
func prettyJSON(b json.RawMessage) string {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}

// printable shows stored bytes as text when they are UTF-8, else as hex, at most 4 KiB.
func printable(b []byte) string {
	const max = 4 << 10
	cut := ""
	if len(b) > max {
		b, cut = b[:max], fmt.Sprintf("… (%d bytes more)", len(b)-max)
	}
	if utf8.Valid(b) {
		return string(b) + cut
	}
	return "hex " + hex.EncodeToString(b) + cut
}

// query builds a query string from name/value pairs, leaving out empty values.
func query(kv ...any) string {
	var parts []string
	for i := 0; i+1 < len(kv); i += 2 {
		v := fmt.Sprint(kv[i+1])
		if v == "" || v == "0" {
			continue
		}
		parts = append(parts, url.QueryEscape(fmt.Sprint(kv[i]))+"="+url.QueryEscape(v))
	}
	if len(parts) == 0 {
		return ""
	}
	return "?" + strings.Join(parts, "&")
}

// timeFormat is how times are shown: to the second, with the zone.
const timeFormat = "2006-01-02 15:04:05 MST"

// clock formats times in the configured location, and ages against the database's now.
type clock struct {
	now time.Time
	loc *time.Location
}

// At formats t; the zero time and nil are "—".
func (c clock) At(t any) string {
	switch v := t.(type) {
	case time.Time:
		if v.IsZero() {
			return "—"
		}
		return v.In(c.loc).Format(timeFormat)
	case *time.Time:
		if v == nil {
			return "—"
		}
		return c.At(*v)
	}
	return "—"
}

// Precise formats t to the millisecond, for the entries of a lease timeline: several
// happen within one second.
func (c clock) Precise(t time.Time) string { return t.In(c.loc).Format("2006-01-02 15:04:05.000 MST") }

// Since says how long ago t was ("12s ago"), or how far ahead ("in 40s").
func (c clock) Since(t any) string {
	var tt time.Time
	switch v := t.(type) {
	case time.Time:
		tt = v
	case *time.Time:
		if v == nil {
			return ""
		}
		tt = *v
	}
	if tt.IsZero() {
		return ""
	}
	d := c.now.Sub(tt)
	if d < 0 {
		return "in " + health.Age(-d)
	}
	return health.Age(d) + " ago"
}

// Past reports whether t is before now.
func (c clock) Past(t *time.Time) bool { return t != nil && t.Before(c.now) }

func (h *Handler) clockAt(now time.Time) clock { return clock{now: now, loc: h.cfg.Location} }
