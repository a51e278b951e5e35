// Package clikit holds what the commands of package cli and of the stock fenceq binary
// share: the error kinds that decide the exit status, argument checks, the
// --database-url and --json flags, report output, logging flags and the schema checks
// every database command starts with.
package clikit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/connect"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/migrations"
)

// Flag names shared by the commands.
const (
	FlagDatabaseURL = "database-url"
	FlagJSON        = "json"
)

// DefaultDatabaseURL is the database used when neither --database-url nor DATABASE_URL
// is given: the local server.
const DefaultDatabaseURL = connect.DefaultURL

// UsageError is a bad command line: the command exits with status 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// SilentError ends a command whose output already said what went wrong (a failed
// verify, an alerting health check): exit 1 with at most a short summary line.
type SilentError struct{ Msg string }

func (e SilentError) Error() string { return e.Msg }

// OneLine folds a multi-line message into one line.
func OneLine(s string) string {
	s = strings.ReplaceAll(s, "\n\t", " ")
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.TrimSpace(s)
}

// NeedArgs checks the number of positional arguments.
func NeedArgs(c *ucli.Context, min, max int, usage string) error {
	n := c.Args().Len()
	if n < min || (max >= 0 && n > max) {
		return UsageError{fmt.Errorf("usage: %s %s", c.Command.HelpName, usage)}
	}
	return nil
}

// DatabaseURLFlag is --database-url: the database a command works on.
func DatabaseURLFlag() ucli.Flag {
	return &ucli.StringFlag{Name: FlagDatabaseURL, EnvVars: []string{"DATABASE_URL"}, Value: DefaultDatabaseURL,
		Usage: "PostgreSQL connection URL; add ?search_path=SCHEMA to use a schema other than public"}
}

// JSONFlag is --json: a command's report for scripts.
func JSONFlag() ucli.Flag {
	return &ucli.BoolFlag{Name: FlagJSON, Usage: "print machine-readable JSON instead of tables", DisableDefaultText: true}
}

// WithReportFlags gives every leaf command of cmd --database-url and --json, after its
// own flags: the flags of the commands that read or change the database and print what
// they found or did. Commands that print no report (worker, serve) or pick their own
// database (demo, chaos) list the flags they read themselves.
func WithReportFlags(cmd *ucli.Command) *ucli.Command {
	if len(cmd.Subcommands) > 0 {
		for _, sub := range cmd.Subcommands {
			WithReportFlags(sub)
		}
		return cmd
	}
	cmd.Flags = append(cmd.Flags, DatabaseURLFlag(), JSONFlag())
	return cmd
}

// DBURL returns the database URL of the command.
func DBURL(c *ucli.Context) string { return c.String(FlagDatabaseURL) }

// OpenPool connects to the command's database, checking that it answers.
func OpenPool(c *ucli.Context, maxConns int32) (*pgxpool.Pool, error) {
	return connect.Open(c.Context, DBURL(c), maxConns)
}

// Stdout and Stderr are the command's writers.
func Stdout(c *ucli.Context) io.Writer { return c.App.Writer }

// Stderr is where the command logs and reports errors.
func Stderr(c *ucli.Context) io.Writer { return c.App.ErrWriter }

// Output prints v as JSON with --json, else calls human.
func Output(c *ucli.Context, v any, human func(w io.Writer) error) error {
	if c.Bool(FlagJSON) {
		enc := json.NewEncoder(Stdout(c))
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return human(Stdout(c))
}

// Table writes rows as aligned columns under upper-case headers.
func Table(w io.Writer, headers []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(headers, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// LogFlags are --log-level and --log-format.
func LogFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
		&ucli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json (log/slog records on stderr)"},
	}
}

// NewLogger builds the command's slog logger on stderr from LogFlags.
func NewLogger(c *ucli.Context) (*slog.Logger, error) {
	return MakeLogger(Stderr(c), c.String("log-level"), c.String("log-format"))
}

// MakeLogger builds a slog logger writing to w at level in format (text or json).
func MakeLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, UsageError{fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", level)}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, UsageError{fmt.Errorf("invalid --log-format %q: want text or json", format)}
}

// sqlTableExists looks a version table up in the connection's current schema. The
// check runs without golang-migrate, whose session advisory lock a pooler in
// transaction mode cannot carry.
const sqlTableExists = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = $1)`

// SetBehind checks one migration set: nil when it is current, else one clear line
// naming the command that fixes it (prog migrate up, with --set NAME unless the set is
// one plain `migrate up` installs).
func SetBehind(ctx context.Context, pool *pgxpool.Pool, raw string, s migrations.Set, fix string) error {
	var exists bool
	if err := pool.QueryRow(ctx, sqlTableExists, s.Table).Scan(&exists); err != nil {
		return fmt.Errorf("check the %s schema: %w", s.Name, err)
	}
	if !exists {
		if s.Name == migrations.Core().Name {
			return fmt.Errorf("the database at %s has no fenceq tables (run `%s`)", redact.URL(raw), fix)
		}
		return fmt.Errorf("the database at %s has no %s tables (run `%s`)", redact.URL(raw), s.Name, fix)
	}
	var v int64
	var dirty bool
	err := pool.QueryRow(ctx, `SELECT version, dirty FROM `+pgx.Identifier{s.Table}.Sanitize()+` LIMIT 1`).Scan(&v, &dirty)
	if err != nil {
		return fmt.Errorf("the database at %s has no recorded %s schema version (run `%s`): %w", redact.URL(raw), s.Name, fix, err)
	}
	if dirty {
		return fmt.Errorf("the %s schema at %s is dirty: migration %d failed half-way; repair it by hand", s.Name, redact.URL(raw), v)
	}
	if latest := int64(s.Latest()); v < latest {
		return fmt.Errorf("the %s schema at %s is at version %d, this build needs %d (run `%s`)", s.Name, redact.URL(raw), v, latest, fix)
	}
	return nil
}

// OpenSchema connects and checks that the given migration sets (the core's when none)
// are current: what every admin command starts with. prog names the binary in the
// advice to migrate.
func OpenSchema(c *ucli.Context, maxConns int32, prog string, sets ...migrations.Set) (*pgxpool.Pool, error) {
	if len(sets) == 0 {
		sets = []migrations.Set{migrations.Core()}
	}
	pool, err := OpenPool(c, maxConns)
	if err != nil {
		return nil, err
	}
	for _, s := range sets {
		fix := prog + " migrate up"
		if s.Name != migrations.Core().Name {
			fix += " --set " + s.Name
		}
		if err := SetBehind(c.Context, pool, DBURL(c), s, fix); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}
