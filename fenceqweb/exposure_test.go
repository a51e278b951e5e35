package fenceqweb

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
)

// requestAs sends a request to the test server with the given Host header.
func (b *testBundle) requestAs(t *testing.T, method, host, path string, form url.Values) response {
	t.Helper()
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, b.url(path), body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Host = host
	return b.do(t, req)
}

// port is the test server's port.
func (b *testBundle) port(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(b.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

// A page of another site whose name was rebound to 127.0.0.1 sends the dashboard its
// own name as Host: without auth such requests get 421 before any handler runs. A page
// hands out no session cookie or token, and an action changes nothing even with a
// valid session and token.
func TestForeignHostIsRefusedWithoutAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Queue: "billing"})
	foreign := "rebind.example:" + b.port(t)
	for _, p := range []string{"/", "/jobs", "/queues", "/static/style.css", "/nope"} {
		r := b.requestAs(t, http.MethodGet, foreign, p, nil)
		if r.status != http.StatusMisdirectedRequest {
			t.Errorf("GET %s for host %s: %d; want 421", p, foreign, r.status)
		}
		if ck := r.header.Get("Set-Cookie"); ck != "" {
			t.Errorf("GET %s for a foreign host set a cookie: %q", p, ck)
		}
		mustNotContain(t, p, r.body, csrfField, "Overview")
	}
	// A session and token the browser got under the dashboard's own name are of no use
	// under the foreign one: the pause is refused and the queue stays as it was.
	tok := b.token(t, "/queues")
	for _, form := range []url.Values{{csrfField: {tok}}, {csrfField: {tok}, "confirm": {"yes"}}} {
		r := b.requestAs(t, http.MethodPost, foreign, "/queues/billing/pause", form)
		if r.status != http.StatusMisdirectedRequest {
			t.Errorf("POST pause for host %s: %d; want 421", foreign, r.status)
		}
	}
	if b.queuePaused(t, "billing") {
		t.Fatal("a request for a foreign host paused the queue")
	}
	// The same action under the dashboard's own name goes through.
	if r := b.act(t, "/queues", "/queues/billing/pause", "confirm", "yes"); r.status != http.StatusSeeOther || !b.queuePaused(t, "billing") {
		t.Fatalf("the genuine pause: %d, paused %v", r.status, b.queuePaused(t, "billing"))
	}
}

func TestAllowedHosts(t *testing.T) {
	t.Parallel()
	const token = "tok-0123456789abcdef"
	for _, c := range []struct {
		name  string
		cfg   func(*Config)
		allow []string
		deny  []string
	}{
		{"loopback only without auth", nil,
			[]string{"127.0.0.1", "127.0.0.1:8081", "127.9.8.7:1", "localhost", "LOCALHOST:8081", "localhost.", "app.localhost:3000",
				"[::1]", "[::1]:8081"},
			[]string{"rebind.example", "rebind.example:8081", "localhost.rebind.example", "10.0.0.5", "[fd00::5]:8081", "0.0.0.0", ""}},
		{"allowed hosts add to loopback", func(c *Config) {
			c.AllowedHosts = []string{"dash.example.com", "ops.example.com:8443", "10.0.0.5", "[fd00::5]:8081", "Upper.Example."}
		},
			[]string{"127.0.0.1:9", "localhost", "dash.example.com", "DASH.example.com.:8081", "ops.example.com:8443", "10.0.0.5:80",
				"[fd00::5]:8081", "upper.example"},
			[]string{"ops.example.com", "ops.example.com:9999", "sub.dash.example.com", "[fd00::5]:8082", "10.0.0.6", "rebind.example"}},
		{"any host with *", func(c *Config) { c.AllowedHosts = []string{"*"} },
			[]string{"rebind.example", "10.0.0.6:1", "localhost"}, nil},
		{"any host with auth and no allowed hosts", func(c *Config) { c.Auth = Auth{Token: token} },
			[]string{"rebind.example", "dash.example.com:8443"}, nil},
		{"allowed hosts enforced with auth", func(c *Config) { c.Auth = Auth{Token: token}; c.AllowedHosts = []string{"dash.example.com"} },
			[]string{"dash.example.com:443", "127.0.0.1"}, []string{"rebind.example"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{}
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			hp, err := newHostPolicy(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, host := range c.allow {
				if !hp.allows(&http.Request{Host: host}) {
					t.Errorf("host %q refused", host)
				}
			}
			for _, host := range c.deny {
				if hp.allows(&http.Request{Host: host}) {
					t.Errorf("host %q allowed", host)
				}
			}
		})
	}

	// Through the handler: with auth and allowed hosts, a foreign host gets 421 even
	// with the right token; an allowed one gets the page.
	b := setup(t, func(c *Config) { c.Auth = Auth{Token: token}; c.AllowedHosts = []string{"dash.example.com"} })
	for host, want := range map[string]int{"dash.example.com:" + b.port(t): http.StatusOK, "rebind.example": http.StatusMisdirectedRequest} {
		req, _ := http.NewRequest(http.MethodGet, b.url("/"), nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+token)
		if r := b.do(t, req); r.status != want {
			t.Errorf("GET / for host %s with the token: %d; want %d", host, r.status, want)
		}
	}

	// Bad entries are refused by New, naming the field and the entry.
	db := fenceqtest.New(t, nil)
	for _, bad := range []string{"", "http://dash.example.com", "dash.example.com/", "dash.example.com:", "dash.example.com:0",
		"dash.example.com:99999", "*.example.com", "dash example", "fd00::5:8081]"} {
		_, err := New(Config{DB: db.Pool, AllowedHosts: []string{bad}})
		if err == nil || !strings.Contains(err.Error(), "AllowedHosts") || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("AllowedHosts %q: %v; want an error naming the field and the entry", bad, err)
		}
	}
}

// An action's body over the limit gets 413 and changes nothing.
func TestOversizedFormIs413(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Queue: "billing"})
	tok := b.token(t, "/queues")
	form := url.Values{csrfField: {tok}, "confirm": {"yes"}, "pad": {strings.Repeat("x", maxFormBytes)}}
	r := b.post(t, "/queues/billing/pause", form)
	if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(r.body, "larger than") {
		t.Fatalf("an oversized form: %d; want 413\n%s", r.status, r.body)
	}
	if b.queuePaused(t, "billing") {
		t.Fatal("an oversized form paused the queue")
	}
	// Just under the limit it goes through: the refusal was the size's.
	form.Set("pad", strings.Repeat("x", maxFormBytes-len(url.Values{csrfField: {tok}, "confirm": {"yes"}}.Encode())-len("&pad=")))
	if enc := form.Encode(); len(enc) != maxFormBytes {
		t.Fatalf("the form is %d bytes; want exactly %d", len(enc), maxFormBytes)
	}
	if r := b.post(t, "/queues/billing/pause", form); r.status != http.StatusSeeOther || !b.queuePaused(t, "billing") {
		t.Fatalf("a form of exactly the limit: %d, paused %v", r.status, b.queuePaused(t, "billing"))
	}
}

// Actions on a queue or schedule that does not exist get 404 and create nothing; a
// schedule whose stored spec or kind no longer holds is not run by hand.
func TestActionsOnMissingOrBrokenTargets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	queueRows := func() int {
		var n int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_queues`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	jobCount := func() int {
		var n int
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, action := range []string{"/queues/nobody-uses-this/pause", "/queues/nobody-uses-this/resume",
		"/periodic/missing/trigger", "/periodic/missing/pause", "/periodic/missing/resume"} {
		for _, confirm := range []string{"", "yes"} {
			r := b.act(t, "/queues", action, "confirm", confirm)
			if r.status != http.StatusNotFound {
				t.Errorf("POST %s (confirm %q): %d; want 404\n%s", action, confirm, r.status, r.body)
			}
		}
	}
	if n := queueRows(); n != 0 {
		t.Fatalf("actions on a queue nobody uses created %d fenceq_queues rows", n)
	}

	// Queues in use: with a job (unfinished or finished in the last hour), with a worker
	// that serves it, with settings alone.
	b.insert(t, store.InsertParams{Queue: "with-job"})
	b.insert(t, store.InsertParams{Queue: "finished"})
	c := b.claim(t, "finished", "w", time.Minute)
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(c)); err != nil {
		t.Fatal(err)
	}
	if err := store.RegisterWorker(b.ctx, b.db.Pool, "w-served", "host", 1, []string{"served"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := store.AddQueue(b.ctx, b.db.Pool, "added"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"with-job", "finished", "served", "added"} {
		if r := b.act(t, "/queues", "/queues/"+q+"/pause", "confirm", "yes"); r.status != http.StatusSeeOther || !b.queuePaused(t, q) {
			t.Errorf("pause %s: %d, paused %v", q, r.status, b.queuePaused(t, q))
		}
	}

	// A schedule whose spec no longer parses, and one whose kind is not valid.
	b.addSchedule(t, "broken-spec")
	b.addSchedule(t, "broken-kind")
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_periodic SET spec = 'every blue moon' WHERE name = 'broken-spec'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_periodic SET kind = 'report job' WHERE name = 'broken-kind'`); err != nil {
		t.Fatal(err)
	}
	before := jobCount()
	for name, want := range map[string]string{"broken-spec": "spec does not parse", "broken-kind": "kind is not valid"} {
		for _, confirm := range []string{"", "yes"} {
			r := b.act(t, "/queues", "/periodic/"+name+"/trigger", "confirm", confirm)
			if r.status != http.StatusConflict || !strings.Contains(r.body, want) {
				t.Errorf("trigger %s (confirm %q): %d; want 409 saying %q\n%s", name, confirm, r.status, want, r.body)
			}
		}
	}
	if r := b.act(t, "/queues", "/periodic/broken-spec/trigger", "confirm", "yes"); !strings.Contains(r.body, "expected 5 to 6 fields") {
		t.Errorf("the refusal does not give the parse error:\n%s", r.body)
	}
	if n := jobCount(); n != before {
		t.Fatalf("refused triggers enqueued %d jobs", n-before)
	}
}

// Tokens and passwords shorter than MinCredentialLen are refused, saying why.
func TestShortCredentialsAreRefused(t *testing.T) {
	t.Parallel()
	db := fenceqtest.New(t, nil)
	long := strings.Repeat("k", MinCredentialLen)
	for _, a := range []Auth{{Token: long[1:]}, {Username: "ops", Password: long[1:]}, {Username: "ops", Password: long, Token: "short"}} {
		_, err := New(Config{DB: db.Pool, Auth: a})
		if err == nil || !strings.Contains(err.Error(), "Auth") || !strings.Contains(err.Error(), "brute force") {
			t.Errorf("New with %s of short credentials: %v; want a refusal naming Auth and saying why", a, err)
		}
	}
	for _, a := range []Auth{{Token: long}, {Username: "ops", Password: long}} {
		if _, err := New(Config{DB: db.Pool, Auth: a}); err != nil {
			t.Errorf("New with %s of %d bytes: %v", a, len(long), err)
		}
	}
}

// selfSigned makes a certificate for 127.0.0.1 and localhost.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fenceq test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, pool
}

func sessionSetCookie(t *testing.T, h http.Header) *http.Cookie {
	t.Helper()
	for _, line := range h.Values("Set-Cookie") {
		ck, err := http.ParseSetCookie(line)
		if err == nil && strings.Contains(ck.Name, sessionCookie) {
			return ck
		}
	}
	t.Fatalf("no session cookie in %q", h.Values("Set-Cookie"))
	return nil
}

// Over TLS (Config.TLS through Listen) the session cookie is Secure and named with the
// __Host- prefix, and actions work with it.
func TestTLSListenSecureCookie(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
	db := fenceqtest.New(t, nil)
	h, err := New(Config{DB: db.Pool, Logger: fenceqtest.QuietLogger(),
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := h.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	jar, _ := cookiejar.New(nil)
	b := &testBundle{ctx: context.Background(), db: db, h: h, client: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		srv: &httptest.Server{URL: "https://" + ln.Addr().String()}}
	checkSecureSession(t, b, "")

	// Config.TLS without a certificate is refused.
	if _, err := New(Config{DB: db.Pool, TLS: &tls.Config{}}); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Errorf("TLS without a certificate: %v", err)
	}
	// Plain HTTP to the TLS port gets nothing from the dashboard.
	if res, err := http.Get("http://" + ln.Addr().String() + "/"); err == nil {
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP on the TLS listener: %d", res.StatusCode)
		}
	}
}

// checkSecureSession loads a page of the dashboard (mounted at mount) over HTTPS and
// checks its session cookie, then pauses a queue with it.
func checkSecureSession(t *testing.T, b *testBundle, mount string) {
	t.Helper()
	b.insert(t, store.InsertParams{Queue: "billing"})
	r := b.get(t, "/queues")
	if r.status != http.StatusOK {
		t.Fatalf("GET /queues over TLS: %d", r.status)
	}
	ck := sessionSetCookie(t, r.header)
	if ck.Name != secureSessionCookie || !ck.Secure || ck.Path != "/" || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("session cookie over TLS: %+v; want %s, Secure, Path=/", ck, secureSessionCookie)
	}
	if r := b.act(t, "/queues", "/queues/billing/pause", "confirm", "yes"); r.status != http.StatusSeeOther || !b.queuePaused(t, "billing") {
		t.Fatalf("pause over TLS%s: %d\n%s", mount, r.status, r.body)
	}
}

// Mounted under a prefix behind httptest's TLS server, the same holds.
func TestTLSServerSecureCookie(t *testing.T) {
	t.Parallel()
	db := fenceqtest.New(t, nil)
	h, err := New(Config{DB: db.Pool, Logger: fenceqtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	client := srv.Client()
	client.Jar, _ = cookiejar.New(nil)
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	b := &testBundle{ctx: context.Background(), db: db, h: h, srv: srv, client: client}
	checkSecureSession(t, b, " under "+prefix)
}

// X-Forwarded-Proto makes the cookie Secure only with TrustProxy.
func TestForwardedProtoOnlyWithTrustProxy(t *testing.T) {
	t.Parallel()
	for _, trust := range []bool{false, true} {
		b := setup(t, func(c *Config) { c.TrustProxy = trust })
		req, _ := http.NewRequest(http.MethodGet, b.url("/"), nil)
		req.Header.Set("X-Forwarded-Proto", "https")
		ck := sessionSetCookie(t, b.do(t, req).header)
		if trust != (ck.Name == secureSessionCookie && ck.Secure && ck.Path == "/") {
			t.Errorf("TrustProxy %v, X-Forwarded-Proto https: cookie %s Secure %v Path %s", trust, ck.Name, ck.Secure, ck.Path)
		}
		if !trust && (ck.Name != sessionCookie || ck.Path != prefix+"/") {
			t.Errorf("without TrustProxy the header changed the cookie: %+v", ck)
		}
		// The last value counts: the one the proxy in front of the dashboard added.
		req, _ = http.NewRequest(http.MethodGet, b.url("/"), nil)
		b.client.Jar, _ = cookiejar.New(nil)
		req.Header.Add("X-Forwarded-Proto", "https")
		req.Header.Add("X-Forwarded-Proto", "http")
		if ck := sessionSetCookie(t, b.do(t, req).header); ck.Secure {
			t.Errorf("TrustProxy %v, X-Forwarded-Proto https then http: the cookie is Secure", trust)
		}
	}
	// With TrustProxy, an action behind a TLS-terminating proxy goes through with the
	// secure cookie and its token.
	b := setup(t, func(c *Config) { c.TrustProxy = true })
	b.insert(t, store.InsertParams{Queue: "billing"})
	req, _ := http.NewRequest(http.MethodGet, b.url("/queues"), nil)
	req.Header.Set("X-Forwarded-Proto", "https")
	r := b.do(t, req)
	ck := sessionSetCookie(t, r.header)
	m := tokenRE.FindStringSubmatch(r.body)
	if m == nil {
		t.Fatal("no token on the queues page")
	}
	form := url.Values{csrfField: {m[1]}, "confirm": {"yes"}}
	post := func(ck *http.Cookie) int {
		req, _ := http.NewRequest(http.MethodPost, b.url("/queues/billing/pause"), strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-Proto", "https")
		b.client.Jar = nil
		req.AddCookie(ck)
		return b.do(t, req).status
	}
	// The same session under the plain cookie's name is not the secure session.
	if st := post(&http.Cookie{Name: sessionCookie, Value: ck.Value}); st != http.StatusForbidden || b.queuePaused(t, "billing") {
		t.Fatalf("the session under the plain name over HTTPS: %d", st)
	}
	if st := post(&http.Cookie{Name: ck.Name, Value: ck.Value}); st != http.StatusSeeOther || !b.queuePaused(t, "billing") {
		t.Fatalf("pause behind the proxy: %d", st)
	}
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// lockedBuffer collects a log.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// clientFrom is an HTTP client whose connections come from the loopback address ip.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// Failed logins are throttled per client address, on an injected clock: after
// LoginFailureLimit failures the address gets 429 with Retry-After, even with the right
// credentials, until the window ends; another address is unaffected; requests without
// credentials and successful logins are no failures.
func TestLoginThrottle(t *testing.T) {
	t.Parallel()
	const pass = "correct-horse-battery"
	log := &lockedBuffer{}
	b := setup(t, func(c *Config) {
		c.Auth = Auth{Username: "ops", Password: pass}
		c.Logger = slog.New(slog.NewTextHandler(log, nil))
	})
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	b.h.throttle.now = clock.now
	try := func(from, user, password string) response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, b.url("/"), nil)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		res, err := clientFrom(from).Do(req)
		if err != nil {
			t.Fatalf("GET from %s: %v", from, err)
		}
		defer res.Body.Close()
		return response{status: res.StatusCode, header: res.Header}
	}
	// Requests without credentials and successful logins do not count.
	for range 2 * LoginFailureLimit {
		if r := try("127.0.0.1", "", ""); r.status != http.StatusUnauthorized {
			t.Fatalf("no credentials: %d; want 401", r.status)
		}
		if r := try("127.0.0.1", "ops", pass); r.status != http.StatusOK {
			t.Fatalf("the right password: %d; want 200", r.status)
		}
	}
	for i := range LoginFailureLimit {
		if r := try("127.0.0.1", "ops", fmt.Sprintf("wrong-password-%d", i)); r.status != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d; want 401", i+1, r.status)
		}
	}
	for _, password := range []string{"wrong-again", pass} {
		r := try("127.0.0.1", "ops", password)
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "60" {
			t.Fatalf("after %d failures: %d Retry-After %q; want 429, 60", LoginFailureLimit, r.status, r.header.Get("Retry-After"))
		}
	}
	// Another address signs in.
	if r := try("127.0.0.2", "ops", pass); r.status != http.StatusOK {
		t.Fatalf("the right password from another address: %d; want 200", r.status)
	}
	clock.advance(45 * time.Second)
	if r := try("127.0.0.1", "ops", pass); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "15" {
		t.Fatalf("45 s later: %d Retry-After %q; want 429, 15", r.status, r.header.Get("Retry-After"))
	}
	clock.advance(15 * time.Second)
	if r := try("127.0.0.1", "ops", pass); r.status != http.StatusOK {
		t.Fatalf("once the window ended: %d; want 200", r.status)
	}
	// Each failure was logged with the address, never with the password.
	logged := log.String()
	if n := strings.Count(logged, "login failed"); n != LoginFailureLimit {
		t.Errorf("%d failures logged; want %d\n%s", n, LoginFailureLimit, logged)
	}
	mustContain(t, "log", logged, "addr=127.0.0.1")
	mustNotContain(t, "log", logged, "wrong-password", pass)
}

// X-Forwarded-For names the client only with TrustProxy: without it a client cannot
// escape the throttle by sending the header.
func TestLoginThrottleForwardedFor(t *testing.T) {
	t.Parallel()
	const pass = "correct-horse-battery"
	for _, trust := range []bool{false, true} {
		b := setup(t, func(c *Config) { c.Auth = Auth{Username: "ops", Password: pass}; c.TrustProxy = trust })
		clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
		b.h.throttle.now = clock.now
		try := func(xff, password string) int {
			req, _ := http.NewRequest(http.MethodGet, b.url("/"), nil)
			req.SetBasicAuth("ops", password)
			req.Header.Set("X-Forwarded-For", xff)
			return b.do(t, req).status
		}
		for i := range LoginFailureLimit {
			// The client claims another address each time; the proxy appends the real one.
			try(fmt.Sprintf("10.9.9.%d, 192.0.2.7", i), "wrong")
		}
		if st := try("192.0.2.7", pass); st != http.StatusTooManyRequests {
			t.Errorf("TrustProxy %v: the failing client: %d; want 429", trust, st)
		}
		want := http.StatusTooManyRequests // without TrustProxy every request is 127.0.0.1
		if trust {
			want = http.StatusOK
		}
		if st := try("192.0.2.8", pass); st != want {
			t.Errorf("TrustProxy %v: another client behind the proxy: %d; want %d", trust, st, want)
		}
	}
}

// The throttle remembers a bounded number of addresses, and an address it evicted to
// stay within the bound starts afresh.
func TestLoginThrottleIsBounded(t *testing.T) {
	t.Parallel()
	th := newLoginThrottle()
	if th.max != maxThrottled {
		t.Fatalf("the throttle's bound is %d; want %d", th.max, maxThrottled)
	}
	th.max = 200 // the same code with a bound small enough to fill quickly
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	th.now = clock.now
	for i := range 3 * th.max {
		th.fail(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))
		if i%10 == 0 {
			clock.advance(time.Millisecond)
		}
	}
	if n := th.size(); n > th.max {
		t.Fatalf("the throttle holds %d addresses; want at most %d", n, th.max)
	}
	// A new address that keeps failing is still refused: the newest ones stay.
	for range LoginFailureLimit {
		th.fail("192.0.2.1")
	}
	if th.retryAfter("192.0.2.1") <= 0 {
		t.Fatal("an address that failed LoginFailureLimit times is not refused")
	}
	// Once every window has ended the old entries go first.
	clock.advance(LoginFailureWindow)
	th.fail("192.0.2.2")
	if n := th.size(); n > 2 {
		t.Fatalf("after every window ended the throttle still holds %d addresses", n)
	}
	// IPv6 clients are counted by their /64.
	if a, b := throttleKey("2001:db8:1:2::1"), throttleKey("2001:db8:1:2:ffff::9"); a != b {
		t.Errorf("one /64 counted as two: %s %s", a, b)
	}
	if throttleKey("2001:db8:1:3::1") == throttleKey("2001:db8:1:2::1") {
		t.Error("two /64s counted as one")
	}
}
