package cli_test

import (
	"strings"
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/migrations"
)

func TestMigrateRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, fenceqtest.Options{NoMigrate: true})
	latest := migrations.Latest()

	// Before migrations, admin commands say what to do.
	oneErrorLine(t, b.run(t, "jobs", "list"), "run `fenceq migrate up`")

	var reps []migrations.Report
	var st migrations.Report
	status := func() {
		t.Helper()
		b.okJSON(t, &reps, "migrate", "status")
		if len(reps) != 3 || reps[0].Set != "fenceq" || reps[1].Set != "invoice" || reps[2].Set != "order" {
			t.Fatalf("status reports sets %+v, want fenceq, invoice, order", reps)
		}
		st = reps[0]
	}
	status()
	if st.Version != 0 || len(st.Migrations) == 0 || st.Migrations[len(st.Migrations)-1].Version != latest || reps[1].Version != 0 {
		t.Fatalf("fresh status: %+v, want version 0 of %d", reps, latest)
	}
	// Versions need not be contiguous (numbers are assigned to work in progress):
	// stepping down goes to the previous version that exists.
	versions := make([]uint, len(st.Migrations))
	for i, m := range st.Migrations {
		versions[i] = m.Version
	}
	before := func(steps int) uint { return versions[len(versions)-1-steps] }
	// The stock migrate up installs the core alone; the built-in jobs' sets show as
	// not installed, not as pending, until they are named.
	out := b.ok(t, "migrate", "up")
	if !strings.Contains(out, "fenceq: migrated from version 0") || strings.Contains(out, "invoice") || strings.Contains(out, "order") {
		t.Errorf("migrate up printed %q, want the core alone migrated", out)
	}
	status()
	if st.Version != latest || reps[1].Installed || reps[2].Installed || reps[1].Dirty || reps[2].Dirty {
		t.Fatalf("after plain up: %+v, want the core current and the built-in sets not installed", reps)
	}
	if out := b.ok(t, "migrate", "status"); !strings.Contains(out, "invoice: version 0 of 1, not installed (install it with `fenceq migrate up --set invoice`)") ||
		strings.Contains(out, "pending") {
		t.Errorf("status after plain up: %q", out)
	}
	out = b.ok(t, "migrate", "up", "--set", "invoice", "--set", "order")
	if !strings.Contains(out, "invoice: migrated from version 0 to 1") || !strings.Contains(out, "order: migrated from version 0 to 1") {
		t.Errorf("migrate up --set invoice --set order printed %q", out)
	}
	if out := b.ok(t, "migrate", "up", "--set", "invoice", "--set", "order"); strings.Count(out, "schema is current") != 3 {
		t.Errorf("second migrate up printed %q, want every set current", out)
	}
	oneErrorLine(t, b.run(t, "migrate", "up", "--set", "nope"), `invalid --set "nope": want one of fenceq, invoice, order`)
	status()
	if st.Version != latest || !reps[1].Current() || !reps[2].Current() {
		t.Fatalf("after up: %+v, want every set current", reps)
	}
	b.ok(t, "jobs", "list")

	b.ok(t, "migrate", "down", "2")
	status()
	if st.Version != before(2) {
		t.Fatalf("after down 2: version %d, want %d", st.Version, before(2))
	}
	oneErrorLine(t, b.run(t, "jobs", "list"), "run `fenceq migrate up`")
	if out := b.ok(t, "migrate", "status"); !strings.Contains(out, "2 pending") {
		t.Errorf("status after down 2: %q", out)
	}

	b.ok(t, "migrate", "down")
	status()
	if st.Version != before(3) {
		t.Fatalf("after down: version %d, want %d", st.Version, before(3))
	}
	oneErrorLine(t, b.run(t, "migrate", "down", "99"), "only")
	oneErrorLine(t, b.run(t, "migrate", "down", "zero"), "invalid number of migrations")
	oneErrorLine(t, b.run(t, "migrate", "down", "--set", "nope"), "invalid --set")
	// The order set's tables go with its own down, and only they.
	b.ok(t, "migrate", "down", "--set", "order")
	status()
	if reps[2].Version != 0 || reps[1].Version == 0 {
		t.Fatalf("after down --set order: %+v", reps)
	}
	b.ok(t, "migrate", "down", "--all")
	var tables int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1
		AND NOT tablename LIKE '%schema_migrations'`, b.db.Schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d tables left after migrate down --all", tables)
	}
	b.ok(t, "migrate", "up", "--set", "invoice", "--set", "order")
	status()
	if st.Version != latest || !reps[1].Current() || !reps[2].Current() {
		t.Fatalf("after down --all and up: %+v", reps)
	}
}

// In a database with a table of its own called orders, installing the order set fails
// cleanly: rolled back, no dirty flag, the error naming the set, the version and the
// statement; the core is untouched and the set still shows as not installed.
func TestMigrateOrderSetOverExistingOrdersTable(t *testing.T) {
	t.Parallel()
	b := setup(t, fenceqtest.Options{NoMigrate: true})
	if _, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE orders (sku text PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}
	b.ok(t, "migrate", "up")
	r := b.run(t, "migrate", "up", "--set", "order")
	// The set adopts an orders table of its own shape (CREATE TABLE IF NOT EXISTS), so
	// the first statement that meets the foreign table's shape is the one that fails.
	oneErrorLine(t, r, "migrate up (order): set order, version 1 (000001_create_orders.up.sql), statement ")
	for _, want := range []string{` ON orders `, "does not exist (SQLSTATE", "rolled back, nothing of this migration is applied"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr %q lacks %q", r.stderr, want)
		}
	}
	var reps []migrations.Report
	b.okJSON(t, &reps, "migrate", "status", "--set", "order")
	if len(reps) != 1 || reps[0].Set != "order" || reps[0].Dirty || reps[0].Installed || reps[0].Version != 0 {
		t.Fatalf("order set after the failure: %+v, want not installed and clean", reps)
	}
	// The application's table is as it was: no column of the order set's was added.
	var cols int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'orders'`, b.db.Schema).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if cols != 2 {
		t.Errorf("orders has %d columns, want its own 2", cols)
	}
	b.ok(t, "jobs", "list") // the core is current
}
