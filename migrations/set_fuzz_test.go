package migrations_test

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

var (
	plainTable = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	upFile     = regexp.MustCompile(`^([0-9]+)_(.*)\.up\.(.*)$`) // as golang-migrate reads names
)

// fuzzSet builds a set whose Dir holds the files named in names (one per line).
func fuzzSet(name, table, dir, names string) migrations.Set {
	files := fstest.MapFS{}
	for _, n := range strings.Split(names, "\n") {
		if n != "" {
			files[path.Join(dir, n)] = &fstest.MapFile{Data: []byte("SELECT 1;")}
		}
	}
	return migrations.Set{Name: name, FS: files, Dir: dir, Table: table}
}

// FuzzSetValidate checks fuzzed migration sets: names, version tables, directories and
// file names. A bad set is a ValidationError naming Name, Table, Dir or FS; a good one
// has a plain table name PostgreSQL keeps as it is, and Latest is its highest up
// migration.
func FuzzSetValidate(f *testing.F) {
	for _, s := range []struct{ name, table, dir, files string }{
		// valid
		{"invoice", "invoice_schema_migrations", "migrations", "000001_create.up.sql\n000001_create.down.sql"},
		{"a", "_t", ".", "1_a.up.sql"},
		{"app.v2:x-y", "t9", "sql/app", "000002_b.up.sql\n000001_a.up.sql\nREADME.md\n000003_c.down.sql"},
		{"fenceq", strings.Repeat("t", 63), ".", "18446744073709551615_max.up.sql"},
		// invalid
		{"", "t", ".", "1_a.up.sql"},
		{"-x", "t", ".", "1_a.up.sql"},
		{strings.Repeat("n", 65), "t", ".", "1_a.up.sql"},
		{"bad name", "t", ".", "1_a.up.sql"},
		{"x", "", ".", "1_a.up.sql"},
		{"x", "Schema_Migrations", ".", "1_a.up.sql"},
		{"x", "9t", ".", "1_a.up.sql"},
		{"x", "public.t", ".", "1_a.up.sql"},
		{"x", "t\x00", ".", "1_a.up.sql"},
		{"x", `t"; DROP TABLE fenceq_jobs; --`, ".", "1_a.up.sql"},
		{"x", strings.Repeat("t", 64), ".", "1_a.up.sql"},
		{"x", "t", "", "1_a.up.sql"},
		{"x", "t", "../migrations", "1_a.up.sql"},
		{"x", "t", "/abs", "1_a.up.sql"},
		{"x", "t", "nowhere", ""},
		{"x", "t", ".", "README.md"},
		{"x", "t", ".", "1_a.up.sql\n01_b.up.sql"},
		{"x", "t", ".", "18446744073709551616_big.up.sql"},
	} {
		f.Add(s.name, s.table, s.dir, s.files)
	}
	f.Fuzz(func(t *testing.T, name, table, dir, files string) {
		set := fuzzSet(name, table, dir, files)
		err := set.Validate()
		if err != nil {
			var ve *queue.ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, queue.ErrInvalid) {
				t.Fatalf("Validate(%+v) = %v (%T), want a *queue.ValidationError", set, err, err)
			}
			switch ve.Field {
			case "Name", "Table", "Dir", "FS":
			default:
				t.Fatalf("Validate(%+v) = %v names the field %q", set, err, ve.Field)
			}
			return
		}
		if queue.ValidateName("Name", name, 64) != nil || !plainTable.MatchString(table) || !fs.ValidPath(dir) {
			t.Fatalf("Validate accepted name %q, table %q, dir %q", name, table, dir)
		}
		var latest uint64
		ups := 0
		for _, n := range strings.Split(files, "\n") {
			if m := upFile.FindStringSubmatch(path.Base(path.Join(dir, n))); m != nil && path.Dir(path.Join(dir, n)) == path.Clean(dir) {
				v, err := strconv.ParseUint(m[1], 10, 0)
				if err != nil {
					t.Fatalf("Validate accepted the version of %q: %v", n, err)
				}
				latest = max(latest, v)
				ups++
			}
		}
		if ups == 0 || uint64(set.Latest()) != latest {
			t.Fatalf("Validate accepted %+v with %d up migrations; Latest() = %d, want %d", set, ups, set.Latest(), latest)
		}
		if err := migrations.UpAll(context.Background(), nil, set, set); err == nil || !errors.Is(err, queue.ErrInvalid) {
			t.Fatalf("UpAll with the set twice: %v, want a ValidationError", err)
		}
	})
}

// An invalid set is refused before anything reaches the database: no version table, no
// statement of another set listed with it.
func TestInvalidSetWritesNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{NoMigrate: true})
	good := migrations.Set{Name: "app", Table: "app_schema_migrations", Dir: ".",
		FS: fstest.MapFS{"000001_t.up.sql": {Data: []byte("CREATE TABLE app_t (id int);")},
			"000001_t.down.sql": {Data: []byte("DROP TABLE app_t;")}}}
	for _, c := range []struct {
		what  string
		sets  []migrations.Set
		field string
	}{
		{"an empty table", []migrations.Set{good, {Name: "x", FS: good.FS, Dir: "."}}, "Table"},
		{"a shared table", []migrations.Set{good, {Name: "x", FS: good.FS, Dir: ".", Table: good.Table}}, "Table"},
		{"a shared name", []migrations.Set{good, {Name: "app", FS: good.FS, Dir: ".", Table: "other"}}, "Name"},
		{"no migrations", []migrations.Set{good, {Name: "x", FS: fstest.MapFS{}, Dir: ".", Table: "x_v"}}, "Dir"},
	} {
		err := migrations.UpAll(ctx, db.Pool, c.sets...)
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			t.Fatalf("UpAll with %s: %v, want a ValidationError naming %s", c.what, err, c.field)
		}
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("UpAll with %s failed but created %d tables", c.what, n)
		}
	}
	bad := migrations.Set{Name: "x", FS: good.FS, Dir: "."}
	if _, err := bad.Status(ctx, db.Pool); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("Status of a set without a table: %v, want ErrInvalid", err)
	}
	if err := bad.Up(ctx, db.Pool); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("Up of a set without a table: %v, want ErrInvalid", err)
	}
}
