package invoice

import (
	"embed"

	"github.com/fenceq/fenceq/migrations"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationsTable records the applied version of the billing tables' migrations.
const MigrationsTable = "invoice_schema_migrations"

// Migrations returns the migrations of the billing tables (customers, usage_records,
// invoices, invoice_lines). Apply them after the core's (migrations.Up).
func Migrations() migrations.Set {
	return migrations.Set{Name: "invoice", FS: migrationFiles, Dir: "migrations", Table: MigrationsTable}
}
