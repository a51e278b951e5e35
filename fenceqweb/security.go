package fenceqweb

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// ErrInsecureBind is returned by Listen for an address that is not loopback when no
// Auth is configured.
var ErrInsecureBind = errors.New("refusing to serve the dashboard on a non-loopback address without auth")

// contentSecurityPolicy allows the dashboard's own script, stylesheet and icon, and
// nothing inline: html/template escapes every value, and this is the second wall.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// setSecurityHeaders sets the headers every response carries.
func setSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// Listen opens a TCP listener for the dashboard on addr (host:port), serving TLS with
// Config.TLS when it is set. An address whose host is not a loopback address
// (127.0.0.0/8, ::1, or a name that resolves to one locally, such as localhost) is
// refused with ErrInsecureBind unless auth is configured: an empty host or 0.0.0.0
// listens on every interface.
func (h *Handler) Listen(addr string) (net.Listener, error) {
	ln, err := listen(addr, h.cfg.Auth.Configured())
	if err != nil {
		return nil, err
	}
	if h.cfg.TLS != nil {
		return tls.NewListener(ln, h.cfg.TLS.Clone()), nil
	}
	return ln, nil
}

// secure reports whether the request reached the dashboard over HTTPS: directly, or,
// with TrustProxy, through a proxy that says so in X-Forwarded-Proto (its last value,
// the one the proxy in front of the dashboard set or appended).
func (h *Handler) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	if !h.cfg.TrustProxy {
		return false
	}
	vs := r.Header.Values("X-Forwarded-Proto")
	if len(vs) == 0 {
		return false
	}
	parts := strings.Split(vs[len(vs)-1], ",")
	return strings.EqualFold(strings.TrimSpace(parts[len(parts)-1]), "https")
}

func listen(addr string, auth bool) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dashboard address %q: %w", addr, err)
	}
	tcp, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dashboard address %q: %w", addr, err)
	}
	if !auth && (host == "" || tcp.IP == nil || !tcp.IP.IsLoopback()) {
		return nil, fmt.Errorf("%w: %s (serve it on 127.0.0.1, or configure basic auth or a token)", ErrInsecureBind, addr)
	}
	ln, err := net.ListenTCP("tcp", tcp)
	if err != nil {
		return nil, fmt.Errorf("listen for the dashboard on %s: %w", addr, err)
	}
	return ln, nil
}

// authorized checks the request's credentials against the configured Auth, in
// constant time.
func (a Auth) authorized(r *http.Request) bool {
	if !a.Configured() {
		return true
	}
	authz := r.Header.Get("Authorization")
	if tok, ok := strings.CutPrefix(authz, "Bearer "); ok {
		return a.Token != "" && equal(tok, a.Token)
	}
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	if a.Token != "" && equal(pass, a.Token) {
		return true
	}
	if a.Username == "" {
		return false
	}
	// Both compared, so timing does not tell which one was wrong.
	u, p := equal(user, a.Username), equal(pass, a.Password)
	return u && p
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// Sessions and action tokens. A browser gets a random session id in an HttpOnly,
// SameSite=Strict cookie on its first page; each form carries HMAC(secret, session id).
// A POST must carry both, matching: a page of another site can neither read the cookie
// nor compute the token, and a cookie planted by a sibling domain has no valid token.
// Over HTTPS the cookie is Secure and named with the __Host- prefix, which browsers
// accept only from a secure origin, for the whole host (Path=/) and with no Domain: a
// plain-HTTP page or a sibling domain cannot set or overwrite it.
const (
	sessionCookie       = "fenceq_session"
	secureSessionCookie = "__Host-fenceq_session"
	csrfField           = "csrf_token"
	sessionBytes        = 32
)

// sessionCookieName is the session cookie's name for a request over HTTPS or not.
func sessionCookieName(secure bool) string {
	if secure {
		return secureSessionCookie
	}
	return sessionCookie
}

// csrf issues and checks tokens.
type csrf struct {
	key []byte
}

func newCSRF(secret []byte) (*csrf, error) {
	if secret == nil {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, fmt.Errorf("generate the dashboard secret: %w", err)
		}
	}
	return &csrf{key: append([]byte(nil), secret...)}, nil
}

func (c *csrf) token(session string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("fenceqweb csrf\x00"))
	m.Write([]byte(session))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// validSession reports whether s looks like a session id this package issued.
func validSession(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == sessionBytes
}

// session returns the request's session id, issuing a new one (and its cookie) when
// the request has none. secure says the request came over HTTPS.
func (c *csrf) session(w http.ResponseWriter, r *http.Request, secure bool) string {
	name := sessionCookieName(secure)
	if ck, err := r.Cookie(name); err == nil && validSession(ck.Value) {
		return ck.Value
	}
	b := make([]byte, sessionBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	id := base64.RawURLEncoding.EncodeToString(b)
	path := cookiePath(r)
	if secure {
		path = "/" // the __Host- prefix requires it
	}
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: id, Path: path,
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode,
	})
	return id
}

// check reports why a POST must be refused, or nil when its token matches its session.
func (c *csrf) check(r *http.Request, secure bool) error {
	ck, err := r.Cookie(sessionCookieName(secure))
	if err != nil || !validSession(ck.Value) {
		return errors.New("no dashboard session: reload the page and try again")
	}
	got := r.PostFormValue(csrfField)
	if got == "" {
		return errors.New("the form has no token: reload the page and try again")
	}
	if !hmac.Equal([]byte(got), []byte(c.token(ck.Value))) {
		return errors.New("the form's token does not match this session: reload the page and try again")
	}
	return nil
}

// cookiePath is the path the handler is mounted at, so the session cookie is sent to
// every page of it and nowhere else: the part of the request URI before the path the
// handler sees (http.StripPrefix removes the prefix from URL.Path only). It is "/" when
// that cannot be told, e.g. behind a proxy that strips the prefix itself.
func cookiePath(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return "/"
	}
	full, seen := u.EscapedPath(), r.URL.EscapedPath()
	prefix, ok := strings.CutSuffix(full, seen)
	if !ok || prefix == "" || !strings.HasPrefix(prefix, "/") {
		return "/"
	}
	return prefix + "/"
}
