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
	out := b.ok(t, "migrate", "up")
	if !strings.Contains(out, "applied") {
		t.Errorf("migrate up printed %q", out)
	}
	if out := b.ok(t, "migrate", "up"); strings.Count(out, "schema is current") != 3 {
		t.Errorf("second migrate up printed %q, want every set current", out)
	}
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
	b.ok(t, "migrate", "up")
	status()
	if st.Version != latest || !reps[1].Current() || !reps[2].Current() {
		t.Fatalf("after down --all and up: %+v", reps)
	}
}
