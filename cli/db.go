package cli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/connect"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/migrations"
)

const (
	flagDatabaseURL = "database-url"
	flagJSON        = "json"
)

// databaseURLFlag is --database-url: the database a command works on.
func databaseURLFlag() ucli.Flag {
	return &ucli.StringFlag{Name: flagDatabaseURL, EnvVars: []string{"DATABASE_URL"}, Value: DefaultDatabaseURL,
		Usage: "PostgreSQL connection URL; add ?search_path=SCHEMA to use a schema other than public"}
}

// jsonFlag is --json: a command's report for scripts.
func jsonFlag() ucli.Flag {
	return &ucli.BoolFlag{Name: flagJSON, Usage: "print machine-readable JSON instead of tables", DisableDefaultText: true}
}

// withReportFlags gives every leaf command of cmd --database-url and --json, after its
// own flags: the flags of the commands that read or change the database and print what
// they found or did. Commands that print no report (worker, serve) or pick their own
// database (demo, chaos) list the flags they read themselves.
func withReportFlags(cmd *ucli.Command) *ucli.Command {
	if len(cmd.Subcommands) > 0 {
		for _, sub := range cmd.Subcommands {
			withReportFlags(sub)
		}
		return cmd
	}
	cmd.Flags = append(cmd.Flags, databaseURLFlag(), jsonFlag())
	return cmd
}

// RedactURL hides the password of a connection string, URL or key=value form:
// postgres://u:secret@host/db becomes postgres://u:xxxxx@host/db.
func RedactURL(raw string) string { return redact.URL(raw) }

// dbURL returns the database URL of the command.
func dbURL(c *ucli.Context) string { return c.String(flagDatabaseURL) }

// openPool connects to the command's database, checking that it answers.
func openPool(c *ucli.Context, maxConns int32) (*pgxpool.Pool, error) {
	return connect.Open(c.Context, dbURL(c), maxConns)
}

// sqlSetVersion reads a migration set's version table, if it exists: the check runs
// without golang-migrate, whose session advisory lock a pooler in transaction mode
// cannot carry.
const sqlTableExists = `SELECT to_regclass($1) IS NOT NULL`

// setBehind checks one migration set: nil when it is current, else one clear line.
func setBehind(ctx context.Context, pool *pgxpool.Pool, raw string, s migrations.Set) error {
	var exists bool
	if err := pool.QueryRow(ctx, sqlTableExists, s.Table).Scan(&exists); err != nil {
		return fmt.Errorf("check the %s schema: %w", s.Name, err)
	}
	if !exists {
		if s.Name == migrations.Core().Name {
			return fmt.Errorf("the database at %s has no fenceq tables (run `fenceq migrate up`)", RedactURL(raw))
		}
		return fmt.Errorf("the database at %s has no %s tables (run `fenceq migrate up`)", RedactURL(raw), s.Name)
	}
	var v int64
	var dirty bool
	err := pool.QueryRow(ctx, `SELECT version, dirty FROM `+pgx.Identifier{s.Table}.Sanitize()+` LIMIT 1`).Scan(&v, &dirty)
	if err != nil {
		return fmt.Errorf("the database at %s has no recorded %s schema version (run `fenceq migrate up`): %w", RedactURL(raw), s.Name, err)
	}
	if dirty {
		return fmt.Errorf("the %s schema at %s is dirty: migration %d failed half-way; repair it by hand", s.Name, RedactURL(raw), v)
	}
	if latest := int64(s.Latest()); v < latest {
		return fmt.Errorf("the %s schema at %s is at version %d, this build needs %d (run `fenceq migrate up`)", s.Name, RedactURL(raw), v, latest)
	}
	return nil
}

// openSchema connects and checks that the given migration sets (the core's when none)
// are current: what every admin command starts with.
func openSchema(c *ucli.Context, maxConns int32, sets ...migrations.Set) (*pgxpool.Pool, error) {
	if len(sets) == 0 {
		sets = []migrations.Set{migrations.Core()}
	}
	pool, err := openPool(c, maxConns)
	if err != nil {
		return nil, err
	}
	for _, s := range sets {
		if err := setBehind(c.Context, pool, dbURL(c), s); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// openMigrated connects and applies the migrations of every built-in set that is
// behind, as the commands that run the built-in jobs do at start. A schema that is
// current is only read, so a worker behind a pooler in transaction mode starts on a
// schema migrated beforehand.
func openMigrated(c *ucli.Context, maxConns int32) (*pgxpool.Pool, error) {
	pool, err := openPool(c, maxConns)
	if err != nil {
		return nil, err
	}
	for _, s := range builtin.Migrations() {
		if setBehind(c.Context, pool, dbURL(c), s) == nil {
			continue
		}
		if err := s.Up(c.Context, pool); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}
