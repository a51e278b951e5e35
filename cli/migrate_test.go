package cli_test

import (
	"strings"
	"testing"

	"github.com/fenceq/fenceq/internal/dbtest"
	"github.com/fenceq/fenceq/migrations"
)

func TestMigrateRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, dbtest.Options{NoMigrate: true})
	latest := migrations.Latest()

	// Before migrations, admin commands say what to do.
	oneErrorLine(t, b.run(t, "jobs", "list"), "run `fenceq migrate up`")

	var st migrations.Report
	b.okJSON(t, &st, "migrate", "status")
	if st.Version != 0 || len(st.Migrations) != int(latest) {
		t.Fatalf("fresh status: %+v, want version 0 of %d", st, latest)
	}
	out := b.ok(t, "migrate", "up")
	if !strings.Contains(out, "applied") {
		t.Errorf("migrate up printed %q", out)
	}
	if out := b.ok(t, "migrate", "up"); !strings.Contains(out, "schema is current") {
		t.Errorf("second migrate up printed %q, want current", out)
	}
	b.okJSON(t, &st, "migrate", "status")
	if st.Version != latest {
		t.Fatalf("after up: version %d, want %d", st.Version, latest)
	}
	b.ok(t, "jobs", "list")

	b.ok(t, "migrate", "down", "2")
	b.okJSON(t, &st, "migrate", "status")
	if st.Version != latest-2 {
		t.Fatalf("after down 2: version %d, want %d", st.Version, latest-2)
	}
	oneErrorLine(t, b.run(t, "jobs", "list"), "run `fenceq migrate up`")
	if out := b.ok(t, "migrate", "status"); !strings.Contains(out, "2 pending") {
		t.Errorf("status after down 2: %q", out)
	}

	b.ok(t, "migrate", "down")
	b.okJSON(t, &st, "migrate", "status")
	if st.Version != latest-3 {
		t.Fatalf("after down: version %d, want %d", st.Version, latest-3)
	}
	oneErrorLine(t, b.run(t, "migrate", "down", "99"), "only")
	oneErrorLine(t, b.run(t, "migrate", "down", "zero"), "invalid number of migrations")
	b.ok(t, "migrate", "down", "--all")
	var tables int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1
		AND tablename <> $2`, b.db.Schema, migrations.Table).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d tables left after migrate down --all", tables)
	}
	b.ok(t, "migrate", "up")
	b.okJSON(t, &st, "migrate", "status")
	if st.Version != latest {
		t.Fatalf("after down --all and up: version %d, want %d", st.Version, latest)
	}
}
