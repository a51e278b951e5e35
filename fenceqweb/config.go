package fenceqweb

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/queue"
)

// Defaults and limits of Config.
const (
	// DefaultRefreshInterval is how often pages refresh their live part.
	DefaultRefreshInterval = 2 * time.Second
	// MinRefreshInterval is the shortest refresh interval allowed.
	MinRefreshInterval = 2 * time.Second
	// DefaultPageSize is how many rows a list page shows.
	DefaultPageSize = 50
	// MaxPageSize bounds PageSize.
	MaxPageSize = 500
	// DefaultRequestTimeout bounds the database work of one request.
	DefaultRequestTimeout = 10 * time.Second
	// MinSecretLen is the shortest Secret accepted.
	MinSecretLen = 32
	// MinCredentialLen is the shortest Auth.Password and Auth.Token accepted, in bytes: a
	// shorter one is within reach of guessing by brute force.
	MinCredentialLen = 16
	// LoginFailureLimit failed logins from one client address within LoginFailureWindow
	// make every further request from it get 429 until the window ends.
	LoginFailureLimit = 5
	// LoginFailureWindow is the period over which failed logins are counted.
	LoginFailureWindow = time.Minute
)

// Config configures the dashboard.
type Config struct {
	// DB is the database, usually a *pgxpool.Pool whose search_path names fenceq's
	// schema. Required.
	DB queue.Beginner
	// ReadOnly hides every action and refuses every POST with 403. Defaults to false.
	ReadOnly bool
	// Auth, when set, is required of every request (see Auth). Defaults to none: the
	// application that mounts the handler guards it, or it serves loopback only
	// (Listen refuses other addresses without Auth).
	Auth Auth
	// AllowedHosts are the names the dashboard answers to, beside the loopback ones
	// (localhost, *.localhost, 127.0.0.0/8 and ::1, with any port), which it always
	// answers to. A request whose Host header is not allowed gets 421 Misdirected Request
	// before anything else happens. An entry is a host name or IP address, matched with
	// any port ("dash.example.com", "10.0.0.5", "::1"), or one with a port, matched with
	// that port only ("dash.example.com:8443", "[fd00::5]:8081"); names are compared
	// without case and without a trailing dot. The entry "*" allows every host.
	//
	// Without Auth the Host header is always checked: a page of another site whose DNS
	// name is rebound to 127.0.0.1 would otherwise drive the dashboard from the
	// operator's browser. With Auth and no AllowedHosts every host is allowed: such a
	// page gets 401, for the browser holds no credentials for its name. Defaults to none.
	AllowedHosts []string
	// TrustProxy says that a reverse proxy stands in front of the dashboard and sets
	// X-Forwarded-Proto and X-Forwarded-For: the request counts as HTTPS when the last
	// X-Forwarded-Proto value is https (the session cookie is then Secure), and the
	// client address that failed logins are counted by is the last X-Forwarded-For
	// entry. Without it both headers are ignored. Defaults to false.
	TrustProxy bool
	// TLS, when set, makes Listen serve HTTPS with it (see tls.Config; it needs a
	// certificate). Defaults to none: plain HTTP.
	TLS *tls.Config
	// Secret keys the HMAC of the actions' tokens: at least MinSecretLen bytes. Set the
	// same secret on every instance behind one address. Defaults to random bytes, new
	// with each Handler (a restart makes open pages fetch a new token: their forms then
	// get 403 once).
	Secret []byte
	// Health bounds the alert conditions shown on the overview. Defaults to
	// health.Thresholds' defaults.
	Health health.Thresholds
	// RefreshInterval is how often a page refreshes its live part; at least
	// MinRefreshInterval. Defaults to DefaultRefreshInterval.
	RefreshInterval time.Duration
	// PageSize is how many rows list pages show, 1–MaxPageSize. Defaults to
	// DefaultPageSize.
	PageSize int
	// RequestTimeout bounds the database work of one request. Defaults to
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Location is the time zone times are shown in. Defaults to UTC.
	Location *time.Location
	// Logger receives failed requests and actions taken. Defaults to slog.Default().
	Logger *slog.Logger
}

// Auth is the credential the dashboard requires. Set Username and Password for HTTP
// basic auth, Token for a bearer token (a browser, which cannot send one, signs in
// with basic auth, any user name, and the token as password), or both.
type Auth struct {
	Username string
	Password string
	Token    string
}

// Configured reports whether any credential is set.
func (a Auth) Configured() bool { return a.Username != "" || a.Password != "" || a.Token != "" }

// String never shows a secret.
func (a Auth) String() string {
	var parts []string
	if a.Username != "" || a.Password != "" {
		parts = append(parts, "basic auth for user "+fmt.Sprintf("%q", a.Username))
	}
	if a.Token != "" {
		parts = append(parts, "bearer token")
	}
	if len(parts) == 0 {
		return "no auth"
	}
	return strings.Join(parts, " and ")
}

// ParseBasicAuth reads "user:password", as the CLI's --auth-basic takes it.
func ParseBasicAuth(s string) (Auth, error) {
	user, pass, ok := strings.Cut(s, ":")
	if !ok || user == "" || pass == "" {
		return Auth{}, &queue.ValidationError{Field: "basic_auth", Reason: "want USER:PASSWORD, both not empty"}
	}
	return Auth{Username: user, Password: pass}, nil
}

func invalid(field, format string, args ...any) error {
	return &queue.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// withDefaults fills the zero fields; validate checks the result.
func (c Config) withDefaults() Config {
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Location == nil {
		c.Location = time.UTC
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Health = c.Health.WithDefaults()
	return c
}

func (c Config) validate() error {
	switch {
	case c.DB == nil:
		return invalid("DB", "is required")
	case c.RefreshInterval < MinRefreshInterval:
		return invalid("RefreshInterval", "%s is shorter than %s", c.RefreshInterval, MinRefreshInterval)
	case c.PageSize < 1 || c.PageSize > MaxPageSize:
		return invalid("PageSize", "%d is outside 1–%d", c.PageSize, MaxPageSize)
	case c.RequestTimeout < 0:
		return invalid("RequestTimeout", "%s is negative", c.RequestTimeout)
	case c.Secret != nil && len(c.Secret) < MinSecretLen:
		return invalid("Secret", "is %d bytes; want at least %d", len(c.Secret), MinSecretLen)
	case (c.Auth.Username == "") != (c.Auth.Password == ""):
		return invalid("Auth", "basic auth needs both a user name and a password")
	case c.Auth.Password != "" && len(c.Auth.Password) < MinCredentialLen:
		return invalid("Auth", "the password is %d bytes; want at least %d: a shorter one can be guessed by brute force",
			len(c.Auth.Password), MinCredentialLen)
	case c.Auth.Token != "" && len(c.Auth.Token) < MinCredentialLen:
		return invalid("Auth", "the token is %d bytes; want at least %d: a shorter one can be guessed by brute force",
			len(c.Auth.Token), MinCredentialLen)
	case c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil:
		return invalid("TLS", "has no certificate (set Certificates or GetCertificate)")
	}
	if _, err := parseAllowedHosts(c.AllowedHosts); err != nil {
		return err
	}
	if err := c.Health.Validate(); err != nil {
		return fmt.Errorf("invalid Health: %w", err)
	}
	return nil
}
