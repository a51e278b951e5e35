// Package migrations holds fenceq's numbered SQL migrations, embedded in the binary, and
// runs them with golang-migrate (iofs source, pgx/v5 driver). They create fenceq_*
// tables only: an application's own tables stay its own.
//
// Tables are created unqualified, so the connection's search_path decides the schema.
// Applied versions are recorded in fenceq_schema_migrations, apart from any
// schema_migrations table an application keeps for itself.
//
// A Set is any such group of embedded migrations with a version table of its own; the
// built-in jobs keep their business tables in sets of their own, and an application
// can do the same.
package migrations

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/fenceq/fenceq/queue"
)

//go:embed *.sql
var files embed.FS

// Table is the table in which the core's applied migration versions are recorded.
const Table = "fenceq_schema_migrations"

// Core returns the set of fenceq's own tables.
func Core() Set { return Set{Name: "fenceq", FS: files, Dir: ".", Table: Table} }

// ErrDirty reports a migration that failed half-way; fix the schema by hand, then force
// the version with golang-migrate's tooling.
var ErrDirty = errors.New("database schema is dirty: a migration failed half-way")

// Set is a group of numbered migrations (NNNNNN_name.up.sql and .down.sql files in Dir
// of FS) whose applied version is recorded in Table. Validate checks one; Up, Migrate,
// Down, Status and UpAll refuse an invalid set before they touch the database.
type Set struct {
	// Name names the set in errors and reports, e.g. "invoice": 1–64 ASCII letters,
	// digits and "_ . : -", starting with a letter or digit.
	Name string
	// FS holds the files, typically an embed.FS.
	FS fs.FS
	// Dir is the directory of FS that holds them; "." for the root.
	Dir string
	// Table records the applied version; it must differ between sets in one schema. It
	// is a plain PostgreSQL name: 1–63 lower-case ASCII letters, digits and "_",
	// starting with a letter or "_".
	Table string
}

// MaxTableLen is the longest Set.Table: PostgreSQL cuts longer names to this many bytes,
// so two longer names could name one table.
const MaxTableLen = 63

// fileRe is the form golang-migrate reads a migration file's name in.
var fileRe = regexp.MustCompile(`^([0-9]+)_(.*)\.(down|up)\.(.*)$`)

// Validate checks the set without touching the database: its Name, its Table, and the
// migration files in Dir of FS (at least one, each version once per direction, within
// uint range). Errors are *queue.ValidationError naming the field ("Name", "Table",
// "Dir" or "FS"); they match queue.ErrInvalid.
func (s Set) Validate() error {
	if err := queue.ValidateName("Name", s.Name, 64); err != nil {
		return err
	}
	if err := validateTable(s.Table); err != nil {
		return fmt.Errorf("migration set %s: %w", s.Name, err)
	}
	if s.FS == nil {
		return fmt.Errorf("migration set %s: %w", s.Name, invalid("FS", "is nil; want the file system holding the migrations"))
	}
	if !fs.ValidPath(s.Dir) {
		return fmt.Errorf("migration set %s: %w", s.Name,
			invalid("Dir", "%q is not a path within FS (use \"/\"-separated names without \"..\"; \".\" for the root)",
				queue.StorableText(s.Dir, 60)))
	}
	entries, err := fs.ReadDir(s.FS, s.Dir)
	if err != nil {
		return fmt.Errorf("migration set %s: %w", s.Name, invalid("Dir", "%q cannot be read: %v", queue.StorableText(s.Dir, 60), err))
	}
	seen := map[string]string{}
	ups := 0
	for _, e := range entries {
		m := fileRe.FindStringSubmatch(e.Name())
		if m == nil || e.IsDir() {
			continue
		}
		v, err := strconv.ParseUint(m[1], 10, 0)
		if err != nil {
			return fmt.Errorf("migration set %s: %w", s.Name,
				invalid("FS", "%s: version %s is out of range", queue.StorableText(e.Name(), 60), queue.StorableText(m[1], 30)))
		}
		key := strconv.FormatUint(v, 10) + "." + m[3]
		if other, dup := seen[key]; dup {
			return fmt.Errorf("migration set %s: %w", s.Name, invalid("FS", "%s and %s are both the %s migration of version %d",
				queue.StorableText(other, 60), queue.StorableText(e.Name(), 60), m[3], v))
		}
		seen[key] = e.Name()
		if m[3] == "up" {
			ups++
		}
	}
	if ups == 0 {
		return fmt.Errorf("migration set %s: %w", s.Name,
			invalid("Dir", "%q holds no migration (NNNNNN_name.up.sql)", queue.StorableText(s.Dir, 60)))
	}
	return nil
}

// validateTable checks a version table's name: a plain lower-case PostgreSQL name,
// which golang-migrate's quoting leaves as it is.
func validateTable(t string) error {
	if t == "" {
		return invalid("Table", "must not be empty (golang-migrate would use schema_migrations, which may be the application's)")
	}
	if len(t) > MaxTableLen {
		return invalid("Table", "%q is %d bytes, longer than %d", queue.StorableText(t, 40), len(t), MaxTableLen)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return invalid("Table", "%q: byte %q at position %d is not allowed (use lower-case letters, digits and _, starting with a letter or _)",
				queue.StorableText(t, 40), c, i)
		}
	}
	return nil
}

func invalid(field, format string, args ...any) error {
	return &queue.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validateAll checks each set and that no two share a name or a version table.
func validateAll(sets []Set) error {
	names, tables := map[string]bool{}, map[string]bool{}
	for _, s := range sets {
		if err := s.Validate(); err != nil {
			return err
		}
		if names[s.Name] {
			return invalid("Name", "two migration sets are named %s", s.Name)
		}
		if tables[s.Table] {
			return fmt.Errorf("migration set %s: %w", s.Name, invalid("Table", "%s is the version table of another set too", s.Table))
		}
		names[s.Name], tables[s.Table] = true, true
	}
	return nil
}

// Migration is one numbered migration and whether it is applied.
type Migration struct {
	Version uint   `json:"version"`
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

// Report is the state of one set in the schema: its current version and every known
// migration.
type Report struct {
	Set string `json:"set"`
	// Installed is false while no migration of the set is applied (nor failed half-way).
	Installed  bool        `json:"installed"`
	Version    uint        `json:"version"`
	Latest     uint        `json:"latest"`
	Dirty      bool        `json:"dirty"`
	Migrations []Migration `json:"migrations"`
}

// Current reports whether every migration of the set is applied and none failed.
func (r Report) Current() bool { return !r.Dirty && r.Version >= r.Latest }

// Latest returns the highest version of the core's migrations.
func Latest() uint { return Core().Latest() }

// Up applies every pending migration of the core. It is a no-op when the schema is
// current.
func Up(ctx context.Context, pool *pgxpool.Pool) error { return Core().Up(ctx, pool) }

// Down reverts the given number of the core's applied migrations; steps <= 0 reverts
// all of them.
func Down(ctx context.Context, pool *pgxpool.Pool, steps int) error {
	return Core().Down(ctx, pool, steps)
}

// Status reports the core's current version and which of its migrations are applied.
func Status(ctx context.Context, pool *pgxpool.Pool) (Report, error) { return Core().Status(ctx, pool) }

// Latest returns the highest migration version of the set.
func (s Set) Latest() uint {
	all, _ := s.list()
	if len(all) == 0 {
		return 0
	}
	return all[len(all)-1].Version
}

// Up applies every pending migration of the set. It is a no-op when the set is current.
func (s Set) Up(ctx context.Context, pool *pgxpool.Pool) error {
	return s.run(ctx, pool, "migrate up", true, func(m *migrate.Migrate) error { return m.Up() })
}

// Migrate moves the set up or down to version, applying or reverting the migrations
// in between (version 0 reverts all of them). It is a no-op at that version.
func (s Set) Migrate(ctx context.Context, pool *pgxpool.Pool, version uint) error {
	what := fmt.Sprintf("migrate to %d", version)
	if version == 0 {
		return s.run(ctx, pool, what, true, func(m *migrate.Migrate) error { return m.Down() })
	}
	return s.run(ctx, pool, what, true, func(m *migrate.Migrate) error { return m.Migrate(version) })
}

// Down reverts the given number of applied migrations of the set; steps <= 0 reverts
// all of them.
func (s Set) Down(ctx context.Context, pool *pgxpool.Pool, steps int) error {
	return s.run(ctx, pool, "migrate down", true, func(m *migrate.Migrate) error {
		if steps <= 0 {
			return m.Down()
		}
		return m.Steps(-steps)
	})
}

// Status reports the set's current version and which of its migrations are applied.
func (s Set) Status(ctx context.Context, pool *pgxpool.Pool) (Report, error) {
	rep := Report{Set: s.Name, Latest: s.Latest()}
	if err := s.Validate(); err != nil {
		return rep, fmt.Errorf("migrate status: %w", err)
	}
	// A set never installed has no version table; reading it must not create one.
	var exists bool
	if err := pool.QueryRow(ctx, sqlVersionTableExists, s.Table).Scan(&exists); err != nil {
		return rep, fmt.Errorf("migrate status (%s): %w", s.Name, err)
	}
	if !exists {
		all, err := s.list()
		if err != nil {
			return rep, fmt.Errorf("migrate status (%s): %w", s.Name, err)
		}
		rep.Migrations = all
		return rep, nil
	}
	err := s.run(ctx, pool, "migrate status", false, func(m *migrate.Migrate) error {
		v, dirty, err := m.Version()
		if err != nil && !errors.Is(err, migrate.ErrNilVersion) {
			return err
		}
		rep.Version, rep.Dirty = v, dirty
		rep.Installed = err == nil
		all, err := s.list()
		if err != nil {
			return err
		}
		for _, mg := range all {
			mg.Applied = mg.Version <= v && v > 0
			rep.Migrations = append(rep.Migrations, mg)
		}
		return nil
	})
	return rep, err
}

// sqlVersionTableExists looks a set's version table up where golang-migrate keeps it:
// the connection's current schema.
const sqlVersionTableExists = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = $1)`

// run opens golang-migrate on pool and calls fn. With refuseDirty it first refuses a
// dirty schema (Up and Down); Status reports it instead.
func (s Set) run(ctx context.Context, pool *pgxpool.Pool, what string, refuseDirty bool, fn func(*migrate.Migrate) error) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	what = what + " (" + s.Name + ")"
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	src, err := iofs.New(s.FS, s.Dir)
	if err != nil {
		return fmt.Errorf("%s: open embedded migrations: %w", what, err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	drv, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: s.Table})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	start, _, err := drv.Version()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	sd := &stepDriver{Driver: drv, clean: start, target: start}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", sd)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _, _ = m.Close() }()
	if _, dirty, verr := m.Version(); refuseDirty && verr == nil && dirty {
		return fmt.Errorf("%s: %w", what, ErrDirty)
	}
	err = fn(m)
	if errors.Is(err, migrate.ErrNoChange) {
		return nil
	}
	if err == nil {
		return nil
	}
	if f := sd.failed; f != nil {
		f.Set = s.Name
		if all, lerr := s.list(); lerr == nil {
			for _, mg := range all {
				if mg.Version == f.Version {
					f.Name = fmt.Sprintf("%06d_%s", mg.Version, mg.Name)
				}
			}
		}
		if f.RolledBack {
			// golang-migrate marked the version dirty before running the file; the file
			// left nothing behind, so the set goes back to the version it had.
			if ferr := m.Force(sd.clean); ferr != nil {
				return fmt.Errorf("%s: %w (and clearing the dirty mark failed: %v)", what, f, ferr)
			}
		}
		return fmt.Errorf("%s: %w", what, f)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (s Set) list() ([]Migration, error) {
	entries, err := fs.ReadDir(s.FS, s.Dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		m := fileRe.FindStringSubmatch(e.Name())
		if m == nil || m[3] != "up" || e.IsDir() {
			continue
		}
		v, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: uint(v), Name: m[2]})
	}
	slices.SortFunc(out, func(a, b Migration) int { return cmp.Compare(a.Version, b.Version) })
	return out, nil
}

// UpAll applies the pending migrations of each set, in order: the core first when a
// caller lists it first, as the sets of business tables may refer to it. It checks every
// set, and that no two share a name or a version table, before it applies any.
func UpAll(ctx context.Context, pool *pgxpool.Pool, sets ...Set) error {
	if err := validateAll(sets); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	for _, s := range sets {
		if err := s.Up(ctx, pool); err != nil {
			return err
		}
	}
	return nil
}
