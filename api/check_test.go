package api

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"slices"
	"strings"
	"testing"
)

// TestDiffAPI checks that the comparison flags an added and a removed line, so TestAPI
// can fail.
func TestDiffAPI(t *testing.T) {
	recorded := []string{
		"pkg example.com/m, func A() error",
		"pkg example.com/m, func B(int) string",
		"pkg example.com/m, type T struct",
	}
	current := []string{
		"pkg example.com/m, func A() error",
		"pkg example.com/m, func B(int64) string", // changed signature: one removed, one added
		"pkg example.com/m, func C()",
		"pkg example.com/m, type T struct",
	}
	added, removed := diffAPI(recorded, current)
	wantAdded := []string{"pkg example.com/m, func B(int64) string", "pkg example.com/m, func C()"}
	wantRemoved := []string{"pkg example.com/m, func B(int) string"}
	if !slices.Equal(added, wantAdded) {
		t.Errorf("added = %q, want %q", added, wantAdded)
	}
	if !slices.Equal(removed, wantRemoved) {
		t.Errorf("removed = %q, want %q", removed, wantRemoved)
	}
	if a, r := diffAPI(current, current); len(a)+len(r) != 0 {
		t.Errorf("same API: added %q, removed %q, want none", a, r)
	}

	msg := diffReport(added, removed)
	for _, want := range []string{"-pkg example.com/m, func B(int) string", "+pkg example.com/m, func C()",
		"go test ./api -update", "CHANGELOG.md", "deliberate decision"} {
		if !strings.Contains(msg, want) {
			t.Errorf("report lacks %q:\n%s", want, msg)
		}
	}
}

func TestReadRecordSkipsComments(t *testing.T) {
	got, err := readRecord(strings.NewReader("# header\n\npkg m, func A()\n  # indented comment\npkg m, func B()\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"pkg m, func A()", "pkg m, func B()"}; !slices.Equal(got, want) {
		t.Errorf("readRecord = %q, want %q", got, want)
	}
}

func TestPublic(t *testing.T) {
	const mod = "github.com/fenceq/fenceq"
	files := []string{"x.go"}
	for _, tc := range []struct {
		p    listedPackage
		want bool
	}{
		{listedPackage{ImportPath: mod, Name: "fenceq", GoFiles: files}, true},
		{listedPackage{ImportPath: mod + "/jobs/email/emailtest", Name: "emailtest", GoFiles: files}, true},
		{listedPackage{ImportPath: mod + "/internal/demo", Name: "demo", GoFiles: files}, false},
		{listedPackage{ImportPath: mod + "/jobs/internal/x", Name: "x", GoFiles: files}, false},
		{listedPackage{ImportPath: mod + "/cmd/fenceq", Name: "main", GoFiles: files}, false},
		{listedPackage{ImportPath: mod + "/examples/basic", Name: "basic", GoFiles: files}, false},
		{listedPackage{ImportPath: mod + "/api", Name: "api"}, false},
		{listedPackage{ImportPath: mod + "/internalize", Name: "internalize", GoFiles: files}, true},
	} {
		if got := public(mod, tc.p); got != tc.want {
			t.Errorf("public(%s) = %v, want %v", tc.p.ImportPath, got, tc.want)
		}
	}
}

// TestPackageAPI checks the notation of each kind of declaration on a small package.
func TestPackageAPI(t *testing.T) {
	t.Parallel()
	const src = `package m

import "context"

const Untyped = 3
const Typed State = "on"
const unexported = 1

type State string

var ErrX error

type Alias = State

type Args interface{ Kind() string }

type Hook interface{}

type Number interface{ ~int | ~int64 }

type Base struct{ ID int64 }

func (Base) Describe() string { return "" }

type Job[T Args] struct {
	*Base
	Args T
	Tags []string
	hidden int
}

func (j *Job[T]) Commit(ctx context.Context, fn func(context.Context) error) error { return nil }

func Add[T Args](jobs ...*Job[T]) (int, error) { return 0, nil }

func Sum[N Number](ns map[string]N) N { var n N; return n }

type Runner interface {
	Run(context.Context) error
	Args
	stop()
}

type Handler func(context.Context, *Job[Args]) error

func hidden() {}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "m.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check("example.com/m", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := packageAPI(pkg)
	slices.Sort(got)
	want := []string{
		"const Typed = \"on\"",
		"const Typed State",
		"const Untyped = 3",
		"const Untyped ideal-int",
		"func Add[T Args](...*Job[T]) (int, error)",
		"func Sum[N Number](map[string]N) N",
		"method (*Job[T]) Commit(context.Context, func(context.Context) error) error",
		"method (Base) Describe() string",
		"method (Job[T]) Describe() string",
		"type Alias = State",
		"type Args interface { Kind }",
		"type Args interface, Kind() string",
		"type Base struct",
		"type Base struct, ID int64",
		"type Handler func(context.Context, *Job[Args]) error",
		"type Hook interface {}",
		"type Job[T Args] struct",
		"type Job[T Args] struct, Args T",
		"type Job[T Args] struct, Tags []string",
		"type Job[T Args] struct, embedded *Base",
		"type Number interface, ~int | ~int64",
		"type Number interface { ~int | ~int64 }",
		"type Runner interface { Kind, Run, unexported methods }",
		"type Runner interface, Kind() string",
		"type Runner interface, Run(context.Context) error",
		"type State string",
		"var ErrX error",
	}
	for i := range want {
		want[i] = "pkg example.com/m, " + want[i]
	}
	added, removed := diffAPI(want, got)
	if len(added)+len(removed) > 0 {
		t.Errorf("packageAPI: unexpected lines %q\nmissing lines %q", added, removed)
	}
}
