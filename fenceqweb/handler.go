package fenceqweb

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// Handler is the dashboard. It is safe for concurrent use.
type Handler struct {
	cfg      Config
	mux      *http.ServeMux
	csrf     *csrf
	origin   *http.CrossOriginProtection
	hosts    *hostPolicy
	throttle *loginThrottle
	tmpl     *templates
	static   *staticFiles
}

var _ http.Handler = (*Handler)(nil)

// New returns the dashboard for cfg. Errors name the Config field that is wrong.
func New(cfg Config) (*Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("fenceqweb: %w", err)
	}
	c, err := newCSRF(cfg.Secret)
	if err != nil {
		return nil, fmt.Errorf("fenceqweb: %w", err)
	}
	hosts, err := newHostPolicy(cfg)
	if err != nil {
		return nil, fmt.Errorf("fenceqweb: %w", err)
	}
	tmpl, err := parseTemplates()
	if err != nil {
		return nil, fmt.Errorf("fenceqweb: %w", err)
	}
	st, err := loadStatic()
	if err != nil {
		return nil, fmt.Errorf("fenceqweb: %w", err)
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), csrf: c, origin: http.NewCrossOriginProtection(),
		hosts: hosts, throttle: newLoginThrottle(), tmpl: tmpl, static: st}
	h.mux.Handle("GET /static/{file}", st)
	for _, s := range sections() {
		s.routes(h, &router{h: h})
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, &httpError{status: http.StatusNotFound, msg: "no such page: " + r.URL.Path})
	})
	return h, nil
}

// ServeHTTP implements http.Handler: security headers, the Host check, the login
// throttle and auth, then the page or action.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w.Header())
	if !h.hosts.allows(r) {
		h.cfg.Logger.Warn("dashboard: request for a host that is not allowed refused", "host", r.Host,
			"remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
		http.Error(w, fmt.Sprintf("misdirected request: this dashboard does not answer to host %q "+
			"(allow it with AllowedHosts, --allowed-hosts)", r.Host), http.StatusMisdirectedRequest)
		return
	}
	if h.cfg.Auth.Configured() && !h.login(w, r) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// login checks the request's credentials, refusing an address that failed too often
// (429 with Retry-After) before looking at them; it answers the request itself and
// returns false when it must go no further.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) bool {
	addr := clientAddr(r, h.cfg.TrustProxy)
	key := throttleKey(addr)
	if wait := h.throttle.retryAfter(key); wait > 0 {
		secs := int64((wait + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		http.Error(w, fmt.Sprintf("too many failed logins from this address: try again in %d s", secs),
			http.StatusTooManyRequests)
		return false
	}
	if h.cfg.Auth.authorized(r) {
		return true
	}
	// A request without credentials is a browser about to ask for them, not a failure.
	if r.Header.Get("Authorization") != "" {
		h.throttle.fail(key)
		h.cfg.Logger.Warn("dashboard: login failed", "addr", addr, "method", r.Method, "path", r.URL.Path)
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="fenceq", charset="UTF-8"`)
	http.Error(w, "authentication required", http.StatusUnauthorized)
	return false
}

// section is one page of the dashboard, in a file of its own: its entry in the
// navigation and the routes it registers. sections lists them in navigation order; a
// new page is a new file and one line here.
type section struct {
	// name is the navigation label; path the page's URL below the root ("/" for the
	// overview). A section with an empty name has no navigation entry.
	name, path string
	routes     func(h *Handler, rt *router)
}

func sections() []section {
	return []section{
		overviewSection(),
		jobsSection(),
		queuesSection(),
		workersSection(),
		outboxSection(),
		idempotencySection(),
		periodicSection(),
		flowSection(),
		workflowsSection(),
	}
}

// router registers a section's handlers with the shared wrapping: a page renders a
// template (or its live part alone); an action runs only for a POST that passes the
// read-only, cross-origin and token checks.
type router struct{ h *Handler }

// pageFunc loads one page's data.
type pageFunc func(ctx context.Context, r *http.Request) (*page, error)

// actionFunc performs one action and returns where to go next (relative to the
// dashboard's root) and the flash message code shown there; a nil page means done.
// When it returns a page instead (a confirmation step), that page is rendered.
type actionFunc func(ctx context.Context, w http.ResponseWriter, r *http.Request) (*redirect, *page, error)

// redirect is where an action sends the browser: a path below the root and a flash.
type redirect struct {
	to    string
	flash string
}

func (rt *router) page(pattern string, fn pageFunc) {
	h := rt.h
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := h.requestContext(r)
		defer cancel()
		p, err := fn(ctx, r)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		h.render(w, r, p)
	})
}

func (rt *router) action(pattern string, fn actionFunc) {
	h := rt.h
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if h.cfg.ReadOnly {
			h.fail(w, r, &httpError{status: http.StatusForbidden, msg: "the dashboard is read-only: actions are disabled"})
			return
		}
		if err := h.origin.Check(r); err != nil {
			h.fail(w, r, &httpError{status: http.StatusForbidden, msg: "cross-origin request refused: " + err.Error()})
			return
		}
		if err := readForm(w, r); err != nil {
			h.fail(w, r, err)
			return
		}
		if err := h.csrf.check(r, h.secure(r)); err != nil {
			h.fail(w, r, &httpError{status: http.StatusForbidden, msg: err.Error()})
			return
		}
		ctx, cancel := h.requestContext(r)
		defer cancel()
		ctx = fenceq.WithActor(ctx, h.actor(r))
		to, p, err := fn(ctx, w, r)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if p != nil {
			h.render(w, r, p)
			return
		}
		target := relRoot(r.URL.Path) + strings.TrimPrefix(to.to, "/")
		if to.flash != "" {
			sep := "?"
			if strings.Contains(target, "?") {
				sep = "&"
			}
			target += sep + "flash=" + to.flash
		}
		w.Header().Set("Location", target)
		w.WriteHeader(http.StatusSeeOther)
	})
}

// maxFormBytes bounds the body of an action: its forms hold a token and a few fields.
const maxFormBytes = 64 << 10

// readForm reads an action's form, at most maxFormBytes of it: a larger body gets 413
// and one that cannot be read 400, before the form is looked at.
func readForm(w http.ResponseWriter, r *http.Request) error {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	err := r.ParseForm()
	if err == nil && strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/form-data") {
		err = r.ParseMultipartForm(maxFormBytes)
	}
	var tooBig *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooBig):
		return &httpError{status: http.StatusRequestEntityTooLarge,
			msg: fmt.Sprintf("the form is larger than %d bytes", tooBig.Limit)}
	default:
		return &httpError{status: http.StatusBadRequest, msg: "the form cannot be read: " + err.Error()}
	}
}

func (h *Handler) requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	if h.cfg.RequestTimeout <= 0 {
		return context.WithCancel(r.Context())
	}
	return context.WithTimeout(r.Context(), h.cfg.RequestTimeout)
}

// relRoot is the relative URL of the dashboard's root from the page at path (as the
// handler sees it, prefix stripped): "./" for "/" and "/jobs", "../" for "/jobs/12".
// Every link is relative to it, so the dashboard works under any prefix, even one a
// proxy strips before the request arrives.
func relRoot(path string) string {
	n := strings.Count(path, "/") - 1
	if n <= 0 {
		return "./"
	}
	return strings.Repeat("../", n)
}

// httpError is an error with the status and the message the page shows.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// fail renders an error page. Errors the engine explains (not found, wrong state,
// invalid input) are shown as they are; others are logged and shown as a failure of
// the database request, without details.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, msg := http.StatusInternalServerError, "the request failed; the server's log has the details"
	var he *httpError
	switch {
	case errors.As(err, &he):
		status, msg = he.status, he.msg
	case errors.Is(err, queue.ErrNotFound):
		status, msg = http.StatusNotFound, err.Error()
	case errors.Is(err, queue.ErrWrongState):
		status, msg = http.StatusConflict, err.Error()
	case errors.Is(err, queue.ErrInvalid):
		status, msg = http.StatusBadRequest, err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		status, msg = http.StatusGatewayTimeout, "the database did not answer in time"
	}
	if status >= 500 {
		h.cfg.Logger.Error("dashboard request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	h.render(w, r, &page{title: http.StatusText(status), template: "error", status: status,
		data: errorData{Status: status, Message: msg}})
}

type errorData struct {
	Status  int
	Message string
}

// pathID reads a positive integer path value.
func pathID(r *http.Request, name, what string) (int64, error) {
	s := r.PathValue(name)
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no %s %q: want a positive integer", what, s)}
	}
	return id, nil
}

// dbNow reads the database's clock, against which pages show ages.
func (h *Handler) dbNow(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := h.cfg.DB.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("read the database's clock: %w", err)
	}
	return now, nil
}
