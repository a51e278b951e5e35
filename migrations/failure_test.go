package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/migrations"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

// A migration whose second statement fails is rolled back whole: its first
// statement's table does not exist, the set is not dirty and stays at the version it
// had, and the error names the set, the version, the file and the statement.
func TestFailedMigrationRollsBackClean(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	set := migrations.Set{Name: "shaky", Dir: ".", Table: "shaky_schema_migrations", FS: fstest.MapFS{
		"000001_one.up.sql":   file("CREATE TABLE shaky_one (id int);"),
		"000001_one.down.sql": file("DROP TABLE shaky_one;"),
		"000002_two.up.sql": file("CREATE TABLE shaky_two (id int);\n" +
			"INSERT INTO shaky_missing VALUES (1);\nCREATE TABLE shaky_three (id int);"),
		"000002_two.down.sql": file("DROP TABLE shaky_two;"),
	}}
	err := set.Up(ctx, db.Pool)
	var se *migrations.StatementError
	if !errors.As(err, &se) {
		t.Fatalf("Up: %v, want a *StatementError", err)
	}
	// The fault really happened where it was put: statement 2 of version 2.
	if se.Set != "shaky" || se.Version != 2 || se.Index != 2 || !se.RolledBack ||
		!strings.Contains(se.Statement, "INSERT INTO shaky_missing") {
		t.Fatalf("StatementError %+v", se)
	}
	for _, want := range []string{"set shaky", "version 2", "000002_two.up.sql", "statement 2", "shaky_missing", "does not exist", "rolled back"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	have := tables(t, db)
	if !have["shaky_one"] || have["shaky_two"] || have["shaky_three"] {
		t.Errorf("tables %v: want shaky_one (version 1) and nothing of version 2", have)
	}
	rep, err := set.Status(ctx, db.Pool)
	if err != nil || rep.Dirty || rep.Version != 1 || !rep.Installed {
		t.Fatalf("status after the failure: %+v, %v; want clean at version 1", rep, err)
	}
	// Clean means it can go on: once the cause is gone the same Up succeeds.
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE shaky_missing (id int)`); err != nil {
		t.Fatal(err)
	}
	if err := set.Up(ctx, db.Pool); err != nil {
		t.Fatalf("Up after the fix: %v", err)
	}
	if rep, err := set.Status(ctx, db.Pool); err != nil || rep.Version != 2 || rep.Dirty {
		t.Fatalf("status after the fix: %+v, %v", rep, err)
	}
}

// A set whose first migration fails stays not installed, not dirty; Status of a set
// never installed reads without creating its version table.
func TestFailedFirstMigrationLeavesSetNotInstalled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	set := migrations.Set{Name: "clash", Dir: ".", Table: "clash_schema_migrations", FS: fstest.MapFS{
		"000001_create.up.sql":   file("CREATE TABLE clash_a (id int); CREATE TABLE clash_taken (id int);"),
		"000001_create.down.sql": file("DROP TABLE clash_a; DROP TABLE clash_taken;"),
	}}
	rep, err := set.Status(ctx, db.Pool)
	if err != nil || rep.Installed || rep.Version != 0 || len(rep.Migrations) != 1 {
		t.Fatalf("status before: %+v, %v", rep, err)
	}
	if tables(t, db)["clash_schema_migrations"] {
		t.Fatal("Status created the version table of a set never installed")
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE clash_taken (note text)`); err != nil {
		t.Fatal(err)
	}
	err = set.Up(ctx, db.Pool)
	var se *migrations.StatementError
	if !errors.As(err, &se) || se.Version != 1 || se.Index != 2 || !strings.Contains(err.Error(), `already exists`) {
		t.Fatalf("Up: %v, want statement 2 of version 1 to fail on the existing table", err)
	}
	if tables(t, db)["clash_a"] {
		t.Error("clash_a exists: statement 1 was not rolled back")
	}
	rep, err = set.Status(ctx, db.Pool)
	if err != nil || rep.Installed || rep.Dirty || rep.Version != 0 {
		t.Fatalf("status after the failure: %+v, %v; want not installed, clean", rep, err)
	}
}
