// Package connect opens the connection pools of the fenceq command and its demo, and
// turns a failure to connect into one line that names the server without its password.
package connect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/redact"
)

// DefaultURL is the local server, used when no database is given.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Open connects to the database at raw (a URL or key=value string) with at most
// maxConns connections and checks that it answers. Unless raw says otherwise, a
// connection attempt gives up after 5s and sessions are named "fenceq"
// (application_name).
func Open(ctx context.Context, raw string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s (hint: postgres://user:password@host:5432/db)", redact.URL(raw))
	}
	cfg.MaxConns = maxConns
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "fenceq"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, connectError(raw, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, connectError(raw, err)
	}
	return pool, nil
}

// connectError is the one line reporting that the database at raw cannot be reached: the
// server without its password, each distinct reason once, and a hint.
func connectError(raw string, err error) error {
	reason := err.Error()
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && ce.Unwrap() != nil {
		reason = ce.Unwrap().Error()
	}
	// pgx joins the errors of each attempt (TLS, then plain) on lines of their own.
	var parts []string
	for _, l := range strings.Split(reason, "\n") {
		if l = strings.TrimSpace(l); l != "" && !slices.Contains(parts, l) {
			parts = append(parts, l)
		}
	}
	// Never echo the connection string back: it may hold the password.
	return fmt.Errorf("cannot connect to %s: %s (hint: set --database-url or DATABASE_URL)",
		redact.URL(raw), strings.Join(parts, "; "))
}
