package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/fenceqweb"
	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/internal/httpserver"
)

func uiCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "ui",
		Usage: "serve the web dashboard until SIGINT or SIGTERM",
		Description: "Queues, jobs and their lease timelines, workers, the outbox and idempotency keys, with\n" +
			"the operator actions of `fenceq jobs`, `queues` and `outbox`. It serves loopback only\n" +
			"unless --auth-basic or --auth-token is set (prefer the environment variables: flags\n" +
			"show in the process list). Without auth it answers only to loopback host names and\n" +
			"--allowed-hosts. --tls-cert and --tls-key serve HTTPS; behind a reverse proxy that\n" +
			"terminates TLS, set --trust-proxy. --read-only hides every action.",
		Flags: append(append(uiFlags(""), healthFlags()...),
			append([]ucli.Flag{
				&ucli.IntFlag{Name: "max-conns", Value: 4, Usage: "database connections of this process"},
				&ucli.DurationFlag{Name: "shutdown-timeout", Value: 5 * time.Second, Usage: "how long requests in flight may finish on shutdown"},
			}, append(logFlags(), databaseURLFlag())...)...),
		Action: uiAction,
	}
}

// uiFlags are the dashboard's flags; `fenceq worker` takes them with the prefix "ui-".
func uiFlags(prefix string) []ucli.Flag {
	addr := &ucli.StringFlag{Name: prefix + "addr", Usage: "serve the dashboard here, e.g. 127.0.0.1:8081"}
	if prefix == "" {
		addr.Name, addr.Value, addr.Usage = "addr", "127.0.0.1:8081", "listen address"
	}
	return []ucli.Flag{
		addr,
		&ucli.BoolFlag{Name: prefix + "read-only", Usage: "dashboard without actions: forms hidden, every POST refused"},
		&ucli.StringFlag{Name: prefix + "auth-basic", EnvVars: []string{"FENCEQ_UI_BASIC_AUTH"},
			Usage: "require HTTP basic auth USER:PASSWORD for the dashboard"},
		&ucli.StringFlag{Name: prefix + "auth-token", EnvVars: []string{"FENCEQ_UI_TOKEN"},
			Usage: "require this bearer token for the dashboard (browsers: any user name, the token as password)"},
		&ucli.DurationFlag{Name: prefix + "refresh", Value: fenceqweb.DefaultRefreshInterval,
			Usage: "how often dashboard pages refresh their data (at least 2s)"},
		&ucli.StringSliceFlag{Name: prefix + "allowed-hosts",
			Usage: "host names the dashboard answers to besides loopback ones, comma-separated or repeated: " +
				"NAME (any port) or NAME:PORT; * allows any (without auth only loopback names are allowed)"},
		&ucli.BoolFlag{Name: prefix + "trust-proxy",
			Usage: "a reverse proxy in front of the dashboard sets X-Forwarded-Proto and X-Forwarded-For: honour them"},
		&ucli.StringFlag{Name: prefix + "tls-cert", Usage: "serve the dashboard over HTTPS with this PEM certificate (with --" + prefix + "tls-key)"},
		&ucli.StringFlag{Name: prefix + "tls-key", Usage: "the PEM private key of --" + prefix + "tls-cert"},
	}
}

// credentialFlag refuses a password or token too short to withstand guessing.
func credentialFlag(flag, env, what, secret string) error {
	if n := len(secret); n < fenceqweb.MinCredentialLen {
		return usageError{Err: fmt.Errorf("--%s (or %s): the %s is %d bytes; want at least %d, as a shorter one "+
			"can be guessed by brute force (make one with `openssl rand -hex 16`)", flag, env, what, n, fenceqweb.MinCredentialLen)}
	}
	return nil
}

// dashboardTLS loads the certificate and key of --tls-cert and --tls-key (with the
// prefix): both or neither.
func dashboardTLS(c *ucli.Context, prefix string) (*tls.Config, error) {
	cert, key := c.String(prefix+"tls-cert"), c.String(prefix+"tls-key")
	switch {
	case cert == "" && key == "":
		return nil, nil
	case cert == "" || key == "":
		return nil, usageError{Err: fmt.Errorf("--%stls-cert and --%stls-key go together: set both or neither", prefix, prefix)}
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, usageError{Err: fmt.Errorf("--%stls-cert %s, --%stls-key %s: %w", prefix, cert, prefix, key, err)}
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// newDashboard builds the dashboard from the flags with the given prefix.
func newDashboard(c *ucli.Context, prefix string, pool *pgxpool.Pool, th health.Thresholds, log *slog.Logger) (*fenceqweb.Handler, error) {
	cfg := fenceqweb.Config{DB: pool, ReadOnly: c.Bool(prefix + "read-only"), Health: th, Logger: log,
		RefreshInterval: c.Duration(prefix + "refresh"), TrustProxy: c.Bool(prefix + "trust-proxy")}
	if s := c.String(prefix + "auth-basic"); s != "" {
		a, err := fenceqweb.ParseBasicAuth(s)
		if err != nil {
			return nil, usageError{Err: fmt.Errorf("invalid --%sauth-basic (or FENCEQ_UI_BASIC_AUTH): want USER:PASSWORD", prefix)}
		}
		if err := credentialFlag(prefix+"auth-basic", "FENCEQ_UI_BASIC_AUTH", "password", a.Password); err != nil {
			return nil, err
		}
		cfg.Auth = a
	}
	if tok := c.String(prefix + "auth-token"); tok != "" {
		if err := credentialFlag(prefix+"auth-token", "FENCEQ_UI_TOKEN", "token", tok); err != nil {
			return nil, err
		}
		cfg.Auth.Token = tok
	}
	for _, s := range c.StringSlice(prefix + "allowed-hosts") {
		for _, host := range strings.Split(s, ",") {
			if host = strings.TrimSpace(host); host != "" {
				cfg.AllowedHosts = append(cfg.AllowedHosts, host)
			}
		}
	}
	tlsCfg, err := dashboardTLS(c, prefix)
	if err != nil {
		return nil, err
	}
	cfg.TLS = tlsCfg
	h, err := fenceqweb.New(cfg)
	if err != nil {
		return nil, usageError{Err: fmt.Errorf("dashboard: %w", err)}
	}
	return h, nil
}

// startDashboard listens on addr (refusing a non-loopback address without auth) and
// serves h.
func startDashboard(h *fenceqweb.Handler, addr, flag string, log *slog.Logger) (*httpserver.Server, error) {
	ln, err := h.Listen(addr)
	if errors.Is(err, fenceqweb.ErrInsecureBind) {
		return nil, usageError{Err: fmt.Errorf("--%s %s: %w", flag, addr, err)}
	}
	if err != nil {
		return nil, err
	}
	return httpserver.Serve(ln, h, log, "dashboard"), nil
}

func uiAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--addr HOST:PORT]"); err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	th, err := healthThresholds(c)
	if err != nil {
		return err
	}
	if c.Int("max-conns") < 1 {
		return usageError{Err: fmt.Errorf("invalid --max-conns %d: must be at least 1", c.Int("max-conns"))}
	}
	if strings.TrimSpace(c.String("addr")) == "" {
		return usageError{Err: errors.New("--addr must not be empty")}
	}
	pool, err := openSchema(c, int32(c.Int("max-conns")))
	if err != nil {
		return err
	}
	defer pool.Close()
	h, err := newDashboard(c, "", pool, th, log)
	if err != nil {
		return err
	}
	srv, err := startDashboard(h, c.String("addr"), "addr", log)
	if err != nil {
		return err
	}
	scheme := "http"
	if c.String("tls-cert") != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout(c), "fenceq dashboard on %s://%s/ (%s%s)\n", scheme, srv.Addr, fenceqAuth(c, ""), readOnlyNote(c, ""))
	select {
	case <-c.Context.Done():
		return srv.Stop(c.Duration("shutdown-timeout"))
	case <-srv.Done():
		if err := srv.Err(); err != nil {
			return fmt.Errorf("dashboard stopped: %w", err)
		}
		return nil
	}
}

// fenceqAuth describes the dashboard's auth without its secrets.
func fenceqAuth(c *ucli.Context, prefix string) string {
	a := fenceqweb.Auth{Token: c.String(prefix + "auth-token")}
	if s := c.String(prefix + "auth-basic"); s != "" {
		a, _ = fenceqweb.ParseBasicAuth(s)
		a.Token = c.String(prefix + "auth-token")
	}
	return a.String()
}

func readOnlyNote(c *ucli.Context, prefix string) string {
	if c.Bool(prefix + "read-only") {
		return ", read-only"
	}
	return ""
}
