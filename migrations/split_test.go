package migrations

import (
	"io/fs"
	"path"
	"slices"
	"strings"
	"testing"
)

func TestSplitStatements(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []string
	}{
		{"plain", "CREATE TABLE a (x int);\nCREATE INDEX ON a (x);", []string{"CREATE TABLE a (x int)", "CREATE INDEX ON a (x)"}},
		{"no final semicolon", "SELECT 1;SELECT 2", []string{"SELECT 1", "SELECT 2"}},
		{"comments only dropped", "-- nothing; here\n/* nor; here */\n;  ;", nil},
		{"line comment", "SELECT 1 -- a; b\n;", []string{"SELECT 1 -- a; b"}},
		{"nested block comment", "SELECT /* a /* ; */ ; */ 1; SELECT 2", []string{"SELECT /* a /* ; */ ; */ 1", "SELECT 2"}},
		{"string", "SELECT 'a;''b'; SELECT 2", []string{"SELECT 'a;''b'", "SELECT 2"}},
		{"escape string", `SELECT E'a\';b'; SELECT 2`, []string{`SELECT E'a\';b'`, "SELECT 2"}},
		{"not an escape string", `SELECT 'a\'; SELECT 2`, []string{`SELECT 'a\'`, "SELECT 2"}},
		{"quoted identifier", `SELECT 1 AS "x;""y"; SELECT 2`, []string{`SELECT 1 AS "x;""y"`, "SELECT 2"}},
		{"dollar body", "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END; $$;\nSELECT f();",
			[]string{"CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END; $$", "SELECT f()"}},
		{"tagged dollar body holding $$", "DO $body$ BEGIN EXECUTE $$SELECT 1; SELECT 2$$; END $body$; SELECT 3",
			[]string{"DO $body$ BEGIN EXECUTE $$SELECT 1; SELECT 2$$; END $body$", "SELECT 3"}},
		{"parameter is no dollar quote", "PREPARE p AS SELECT $1; SELECT 2", []string{"PREPARE p AS SELECT $1", "SELECT 2"}},
		{"dollar inside identifier", "SELECT a$b$ FROM t; SELECT 2", []string{"SELECT a$b$ FROM t", "SELECT 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := splitStatements(tc.in); !slices.Equal(got, tc.want) {
				t.Fatalf("splitStatements(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

// Every statement of every core migration is one the splitter keeps whole: each piece
// of a file that holds a dollar-quoted body holds the whole body.
func TestSplitCoreMigrations(t *testing.T) {
	set := Core()
	names, err := fs.Glob(set.FS, path.Join(set.Dir, "*.sql"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no migration files: %v", err)
	}
	for _, n := range names {
		b, err := fs.ReadFile(set.FS, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range splitStatements(string(b)) {
			if strings.Count(s, "$$")%2 != 0 {
				t.Errorf("%s: a statement cuts a $$ body: %q", n, s)
			}
			if strings.HasSuffix(s, ";") {
				t.Errorf("%s: a statement keeps its semicolon: %q", n, s)
			}
		}
	}
}
