// Package migrations holds fenceq's numbered SQL migrations, embedded in the binary, and
// runs them with golang-migrate (iofs source, pgx/v5 driver).
//
// Tables are created unqualified, so the connection's search_path decides the schema.
// Applied versions are recorded in fenceq_schema_migrations, apart from any
// schema_migrations table an application keeps for itself.
package migrations

import (
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
)

//go:embed *.sql
var files embed.FS

// Table is the table in which applied migration versions are recorded.
const Table = "fenceq_schema_migrations"

// ErrDirty reports a migration that failed half-way; fix the schema by hand, then force
// the version with golang-migrate's tooling.
var ErrDirty = errors.New("database schema is dirty: a migration failed half-way")

// Migration is one numbered migration and whether it is applied.
type Migration struct {
	Version uint   `json:"version"`
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

// Report is the state of the schema: the current version and every known migration.
type Report struct {
	Version    uint        `json:"version"`
	Dirty      bool        `json:"dirty"`
	Migrations []Migration `json:"migrations"`
}

// Latest returns the highest migration version embedded in this build.
func Latest() uint {
	all, _ := list()
	if len(all) == 0 {
		return 0
	}
	return all[len(all)-1].Version
}

// Up applies every pending migration. It is a no-op when the schema is current.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	return run(ctx, pool, "migrate up", true, func(m *migrate.Migrate) error { return m.Up() })
}

// Down reverts the given number of applied migrations; steps <= 0 reverts all of them.
func Down(ctx context.Context, pool *pgxpool.Pool, steps int) error {
	return run(ctx, pool, "migrate down", true, func(m *migrate.Migrate) error {
		if steps <= 0 {
			return m.Down()
		}
		return m.Steps(-steps)
	})
}

// Status reports the current version and which embedded migrations are applied.
func Status(ctx context.Context, pool *pgxpool.Pool) (Report, error) {
	var rep Report
	err := run(ctx, pool, "migrate status", false, func(m *migrate.Migrate) error {
		v, dirty, err := m.Version()
		if err != nil && !errors.Is(err, migrate.ErrNilVersion) {
			return err
		}
		rep.Version, rep.Dirty = v, dirty
		all, err := list()
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

// run opens golang-migrate on pool and calls fn. With refuseDirty it first refuses a
// dirty schema (Up and Down); Status reports it instead.
func run(ctx context.Context, pool *pgxpool.Pool, what string, refuseDirty bool, fn func(*migrate.Migrate) error) error {
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	src, err := iofs.New(files, ".")
	if err != nil {
		return fmt.Errorf("%s: open embedded migrations: %w", what, err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	drv, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: Table})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
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
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

var nameRe = regexp.MustCompile(`^(\d+)_(.+)\.up\.sql$`)

func list() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		m := nameRe.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: uint(v), Name: m[2]})
	}
	slices.SortFunc(out, func(a, b Migration) int { return int(a.Version) - int(b.Version) })
	return out, nil
}
