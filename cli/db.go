package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/migrations"
)

const (
	flagDatabaseURL = "database-url"
	flagJSON        = "json"
)

// addCommonFlags gives every leaf command --database-url and --json, so they can be
// written after the command (`fenceq jobs list --json`).
func addCommonFlags(cmds []*ucli.Command) {
	for _, c := range cmds {
		if len(c.Subcommands) > 0 {
			addCommonFlags(c.Subcommands)
			continue
		}
		c.Flags = append(c.Flags,
			&ucli.StringFlag{Name: flagDatabaseURL, EnvVars: []string{"DATABASE_URL"}, Value: DefaultDatabaseURL,
				Usage: "PostgreSQL connection URL; add ?search_path=SCHEMA to use a schema other than public"},
			&ucli.BoolFlag{Name: flagJSON, Usage: "print machine-readable JSON instead of tables", DisableDefaultText: true},
		)
	}
}

// RedactURL hides the password of a connection string, URL or key=value form:
// postgres://u:secret@host/db becomes postgres://u:xxxxx@host/db.
func RedactURL(raw string) string { return redact.URL(raw) }

// connectError is the one line printed when the database cannot be reached.
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
		RedactURL(raw), strings.Join(parts, "; "))
}

// dbURL returns the database URL of the command.
func dbURL(c *ucli.Context) string { return c.String(flagDatabaseURL) }

// openPool connects to the command's database, checking that it answers.
func openPool(c *ucli.Context, maxConns int32) (*pgxpool.Pool, error) {
	return openPoolURL(c.Context, dbURL(c), maxConns)
}

func openPoolURL(ctx context.Context, raw string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL %s (hint: postgres://user:password@host:5432/db)", RedactURL(raw))
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

const sqlSchemaVersion = `
SELECT to_regclass('fenceq_jobs') IS NOT NULL, to_regclass('` + migrations.Table + `') IS NOT NULL`

const sqlMigrationVersion = `SELECT version, dirty FROM ` + migrations.Table + ` LIMIT 1`

// requireSchema fails with one clear line unless the fenceq tables exist at the
// version this build needs.
func requireSchema(ctx context.Context, pool *pgxpool.Pool, raw string) error {
	var jobs, mig bool
	if err := pool.QueryRow(ctx, sqlSchemaVersion).Scan(&jobs, &mig); err != nil {
		return fmt.Errorf("check the fenceq schema: %w", err)
	}
	if !jobs || !mig {
		return fmt.Errorf("the database at %s has no fenceq tables (run `fenceq migrate up`)", RedactURL(raw))
	}
	var v int64
	var dirty bool
	if err := pool.QueryRow(ctx, sqlMigrationVersion).Scan(&v, &dirty); err != nil {
		return fmt.Errorf("the database at %s has no recorded fenceq schema version (run `fenceq migrate up`): %w", RedactURL(raw), err)
	}
	if dirty {
		return fmt.Errorf("the fenceq schema at %s is dirty: migration %d failed half-way; repair it by hand", RedactURL(raw), v)
	}
	if latest := int64(migrations.Latest()); v < latest {
		return fmt.Errorf("the fenceq schema at %s is at version %d, this build needs %d (run `fenceq migrate up`)", RedactURL(raw), v, latest)
	}
	return nil
}

// openSchema connects and checks the schema: what every admin command starts with.
func openSchema(c *ucli.Context, maxConns int32) (*pgxpool.Pool, error) {
	pool, err := openPool(c, maxConns)
	if err != nil {
		return nil, err
	}
	if err := requireSchema(c.Context, pool, dbURL(c)); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
