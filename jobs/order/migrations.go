package order

import (
	"embed"

	"github.com/fenceq/fenceq/migrations"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationsTable records the applied version of the order tables' migrations.
const MigrationsTable = "order_schema_migrations"

// Migrations returns the migrations of the order tables (orders, order_items). Apply
// them after the core's (migrations.Up).
func Migrations() migrations.Set {
	return migrations.Set{Name: "order", FS: migrationFiles, Dir: "migrations", Table: MigrationsTable}
}
