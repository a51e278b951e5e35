// Package api holds the record of fenceq's public Go API (fenceq.txt) and the test that
// keeps it true: every exported identifier of every public package of the module, one
// per line, in the style of Go's own api/go1.N.txt files.
//
// TestAPI computes the API from the packages as they are built and fails when it differs
// from the record, so an API change is a reviewed decision: `go test ./api -update`
// rewrites the record, and the change gets its line in CHANGELOG.md.
package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/constant"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite api/"+recordFile+" with the current API")

// recordFile is the record's name, in this directory of the module.
const recordFile = "fenceq.txt"

// recordHeader opens the record; lines starting with '#' are comments.
const recordHeader = `# The exported API of fenceq's public packages, one identifier a line, sorted.
# Generated and checked by api/api_test.go; rewrite it with: go test ./api -update
# A change here is an API change: it needs its line in CHANGELOG.md (docs/versioning.md).
`

func TestAPI(t *testing.T) {
	t.Parallel()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	current, err := computeAPI(root)
	if err != nil {
		t.Fatalf("compute the API: %v", err)
	}
	path := filepath.Join(root, "api", recordFile)
	if *update {
		if err := os.WriteFile(path, []byte(recordHeader+strings.Join(current, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d lines", path, len(current))
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("read the API record: %v (create it with: go test ./api -update)", err)
	}
	defer f.Close()
	recorded, err := readRecord(f)
	if err != nil {
		t.Fatalf("read the API record %s: %v", path, err)
	}
	added, removed := diffAPI(recorded, current)
	if len(added)+len(removed) > 0 {
		t.Error(diffReport(added, removed))
	}
}

// diffReport explains a difference between the record and the current API.
func diffReport(added, removed []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the exported API differs from api/%s (%d added, %d removed):\n", recordFile, len(added), len(removed))
	for _, l := range removed {
		fmt.Fprintf(&b, "-%s\n", l)
	}
	for _, l := range added {
		fmt.Fprintf(&b, "+%s\n", l)
	}
	b.WriteString("An API change is a deliberate decision: if this one is, run `go test ./api -update` " +
		"to rewrite the record, and add its line to CHANGELOG.md under [Unreleased] " +
		"(a removed or changed line, or a method added to an interface, is a breaking change: " +
		"name its upgrade step). " +
		"If it is not, undo the change.")
	return b.String()
}

// diffAPI returns the lines of current missing from recorded (added) and the lines of
// recorded missing from current (removed), each sorted.
func diffAPI(recorded, current []string) (added, removed []string) {
	in := func(set []string) map[string]bool {
		m := make(map[string]bool, len(set))
		for _, l := range set {
			m[l] = true
		}
		return m
	}
	rec, cur := in(recorded), in(current)
	for l := range cur {
		if !rec[l] {
			added = append(added, l)
		}
	}
	for l := range rec {
		if !cur[l] {
			removed = append(removed, l)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	return added, removed
}

// readRecord reads the record's lines, without comments and blank lines.
func readRecord(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// moduleRoot returns the directory of the module's go.mod, asked of the go command so
// that the test does not depend on its working directory within the module.
func moduleRoot() (string, error) {
	out, err := goCmd("", "env", "GOMOD")
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("go env GOMOD: not inside the fenceq module")
	}
	return filepath.Dir(gomod), nil
}

func goCmd(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// listedPackage is the part of `go list -json` this test reads.
type listedPackage struct {
	ImportPath string
	Name       string
	Export     string
	GoFiles    []string
	DepOnly    bool
}

// goList runs `go list -json` with args in dir and decodes its stream of packages.
func goList(dir string, args ...string) ([]listedPackage, error) {
	out, err := goCmd(dir, append([]string{"list", "-json=ImportPath,Name,Export,GoFiles,DepOnly"}, args...)...)
	if err != nil {
		return nil, err
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
}

// public reports whether a package of the module is public: importable by users
// (no internal element), a library (not main), not an example and not this record.
func public(modPath string, p listedPackage) bool {
	if p.Name == "main" || len(p.GoFiles) == 0 {
		return false
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, modPath), "/")
	if rel == "api" {
		return false
	}
	for _, el := range strings.Split(rel, "/") {
		if el == "internal" || el == "testdata" || el == "examples" {
			return false
		}
	}
	return true
}

// computeAPI returns the sorted lines of the API of the module's public packages. It
// reads the compiler's export data, which `go list -export` builds (or finds in the
// build cache), so no source is type-checked here.
func computeAPI(root string) ([]string, error) {
	modOut, err := goCmd(root, "list", "-m")
	if err != nil {
		return nil, err
	}
	modPath := strings.TrimSpace(string(modOut))
	all, err := goList(root, "./...")
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, p := range all {
		if public(modPath, p) {
			paths = append(paths, p.ImportPath)
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no public packages found in module %s at %s", modPath, root)
	}
	deps, err := goList(root, append([]string{"-export", "-deps"}, paths...)...)
	if err != nil {
		return nil, err
	}
	exports := make(map[string]string, len(deps))
	for _, p := range deps {
		exports[p.ImportPath] = p.Export
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %q", path)
		}
		return os.Open(file)
	})
	var lines []string
	for _, path := range paths {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", path, err)
		}
		lines = append(lines, packageAPI(pkg)...)
	}
	slices.Sort(lines)
	return slices.Compact(lines), nil
}

// packageAPI returns the API lines of one package.
func packageAPI(pkg *types.Package) []string {
	w := &writer{pkg: pkg}
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		if !token.IsExported(name) {
			continue
		}
		switch obj := scope.Lookup(name).(type) {
		case *types.Const:
			w.emit("const %s %s", name, w.constType(obj.Type()))
			w.emit("const %s = %s", name, constValue(obj.Val()))
		case *types.Var:
			w.emit("var %s %s", name, w.typ(obj.Type()))
		case *types.Func:
			sig := obj.Type().(*types.Signature)
			w.emit("func %s%s%s", name, w.typeParams(sig.TypeParams()), w.signature(sig))
		case *types.TypeName:
			w.typeName(obj)
		}
	}
	return w.lines
}

// writer prints the declarations of one package in the record's notation: types of the
// package unqualified, others qualified by their package's name, no parameter names.
type writer struct {
	pkg   *types.Package
	lines []string
}

func (w *writer) emit(format string, args ...any) {
	w.lines = append(w.lines, "pkg "+w.pkg.Path()+", "+fmt.Sprintf(format, args...))
}

func (w *writer) typeName(obj *types.TypeName) {
	name := obj.Name()
	if obj.IsAlias() {
		alias, _ := obj.Type().(*types.Alias)
		if alias == nil { // aliases not materialized (GODEBUG gotypesalias=0)
			w.emit("type %s = %s", name, w.typ(obj.Type()))
			return
		}
		w.emit("type %s%s = %s", name, w.typeParams(alias.TypeParams()), w.typ(alias.Rhs()))
		return
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		return
	}
	decl := name + w.typeParams(named.TypeParams())
	switch u := named.Underlying().(type) {
	case *types.Struct:
		w.emit("type %s struct", decl)
		for i := range u.NumFields() {
			f := u.Field(i)
			if !f.Exported() {
				continue
			}
			if f.Embedded() {
				w.emit("type %s struct, embedded %s", decl, w.typ(f.Type()))
			} else {
				w.emit("type %s struct, %s %s", decl, f.Name(), w.typ(f.Type()))
			}
		}
	case *types.Interface:
		var names []string
		unexported := false
		for i := range u.NumMethods() {
			m := u.Method(i)
			if !m.Exported() {
				unexported = true
				continue
			}
			names = append(names, m.Name())
			w.emit("type %s interface, %s%s", decl, m.Name(), w.signature(m.Type().(*types.Signature)))
		}
		slices.Sort(names)
		if unexported {
			names = append(names, "unexported methods")
		}
		// Type terms of a constraint (~int | ~int64), from its embedded non-interfaces.
		for i := range u.NumEmbeddeds() {
			if e := u.EmbeddedType(i); !types.IsInterface(e) {
				w.emit("type %s interface, %s", decl, w.typ(e))
				names = append(names, w.typ(e))
			}
		}
		if len(names) == 0 {
			w.emit("type %s interface {}", decl)
		} else {
			w.emit("type %s interface { %s }", decl, strings.Join(names, ", "))
		}
		return // an interface's methods are listed above, not as methods
	default:
		w.emit("type %s %s", decl, w.typ(u))
	}
	// Methods of T, then those of *T only, including those promoted from embedded fields.
	recv := name
	if tp := named.TypeParams(); tp.Len() > 0 {
		var ps []string
		for i := range tp.Len() {
			ps = append(ps, tp.At(i).Obj().Name())
		}
		recv += "[" + strings.Join(ps, ", ") + "]"
	}
	value := types.NewMethodSet(named)
	for i := range value.Len() {
		m := value.At(i).Obj()
		if m.Exported() {
			w.emit("method (%s) %s%s", recv, m.Name(), w.signature(m.Type().(*types.Signature)))
		}
	}
	ptr := types.NewMethodSet(types.NewPointer(named))
	for i := range ptr.Len() {
		m := ptr.At(i).Obj()
		if m.Exported() && value.Lookup(m.Pkg(), m.Name()) == nil {
			w.emit("method (*%s) %s%s", recv, m.Name(), w.signature(m.Type().(*types.Signature)))
		}
	}
}

// constType is a constant's type, "ideal-int" and the like for untyped constants.
func (w *writer) constType(t types.Type) string {
	if b, ok := t.(*types.Basic); ok && b.Info()&types.IsUntyped != 0 {
		switch b.Kind() {
		case types.UntypedBool:
			return "ideal-bool"
		case types.UntypedInt, types.UntypedRune:
			return "ideal-int"
		case types.UntypedFloat:
			return "ideal-float"
		case types.UntypedComplex:
			return "ideal-complex"
		case types.UntypedString:
			return "ideal-string"
		}
	}
	return w.typ(t)
}

func constValue(v constant.Value) string {
	if v.Kind() == constant.Float {
		if f, exact := constant.Float64Val(v); exact {
			return fmt.Sprint(f)
		}
	}
	return v.ExactString()
}

func (w *writer) typeParams(tp *types.TypeParamList) string {
	if tp == nil || tp.Len() == 0 {
		return ""
	}
	var ps []string
	for i := range tp.Len() {
		p := tp.At(i)
		ps = append(ps, p.Obj().Name()+" "+w.typ(p.Constraint()))
	}
	return "[" + strings.Join(ps, ", ") + "]"
}

// signature prints a function's parameters and results, without names.
func (w *writer) signature(sig *types.Signature) string {
	var b strings.Builder
	b.WriteString("(")
	params := sig.Params()
	for i := range params.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		t := params.At(i).Type()
		if sig.Variadic() && i == params.Len()-1 {
			if s, ok := t.(*types.Slice); ok {
				b.WriteString("..." + w.typ(s.Elem()))
				continue
			}
		}
		b.WriteString(w.typ(t))
	}
	b.WriteString(")")
	res := sig.Results()
	switch res.Len() {
	case 0:
	case 1:
		b.WriteString(" " + w.typ(res.At(0).Type()))
	default:
		var rs []string
		for i := range res.Len() {
			rs = append(rs, w.typ(res.At(i).Type()))
		}
		b.WriteString(" (" + strings.Join(rs, ", ") + ")")
	}
	return b.String()
}

// typ prints a type: named types of this package unqualified, of others with their
// package's name.
func (w *writer) typ(t types.Type) string {
	switch t := t.(type) {
	case *types.Basic:
		if t.Kind() == types.UnsafePointer {
			return "unsafe.Pointer"
		}
		return t.Name()
	case *types.Pointer:
		return "*" + w.typ(t.Elem())
	case *types.Slice:
		return "[]" + w.typ(t.Elem())
	case *types.Array:
		return fmt.Sprintf("[%d]%s", t.Len(), w.typ(t.Elem()))
	case *types.Map:
		return "map[" + w.typ(t.Key()) + "]" + w.typ(t.Elem())
	case *types.Chan:
		switch t.Dir() {
		case types.SendOnly:
			return "chan<- " + w.typ(t.Elem())
		case types.RecvOnly:
			return "<-chan " + w.typ(t.Elem())
		}
		if c, ok := t.Elem().(*types.Chan); ok && c.Dir() == types.RecvOnly {
			return "chan (" + w.typ(t.Elem()) + ")"
		}
		return "chan " + w.typ(t.Elem())
	case *types.Signature:
		return "func" + w.signature(t)
	case *types.Struct:
		if t.NumFields() == 0 {
			return "struct{}"
		}
		var fs []string
		for i := range t.NumFields() {
			f := t.Field(i)
			if f.Embedded() {
				fs = append(fs, w.typ(f.Type()))
			} else {
				fs = append(fs, f.Name()+" "+w.typ(f.Type()))
			}
		}
		return "struct{ " + strings.Join(fs, "; ") + " }"
	case *types.Interface:
		var parts []string
		for i := range t.NumEmbeddeds() {
			parts = append(parts, w.typ(t.EmbeddedType(i)))
		}
		for i := range t.NumExplicitMethods() {
			m := t.ExplicitMethod(i)
			parts = append(parts, m.Name()+w.signature(m.Type().(*types.Signature)))
		}
		if len(parts) == 0 {
			return "interface{}"
		}
		return "interface{ " + strings.Join(parts, "; ") + " }"
	case *types.Union:
		var terms []string
		for i := range t.Len() {
			term := t.Term(i)
			s := w.typ(term.Type())
			if term.Tilde() {
				s = "~" + s
			}
			terms = append(terms, s)
		}
		return strings.Join(terms, " | ")
	case *types.TypeParam:
		return t.Obj().Name()
	case *types.Alias:
		return w.qualified(t.Obj()) + w.typeArgs(t.TypeArgs())
	case *types.Named:
		return w.qualified(t.Obj()) + w.typeArgs(t.TypeArgs())
	case *types.Tuple:
		var ts []string
		for i := range t.Len() {
			ts = append(ts, w.typ(t.At(i).Type()))
		}
		return "(" + strings.Join(ts, ", ") + ")"
	}
	return types.TypeString(t, func(p *types.Package) string { return p.Name() })
}

// qualified names a type: unqualified in its own package, else by its package's name,
// or its path when that name is also this package's (cli's *cli.App is urfave/cli's).
func (w *writer) qualified(obj *types.TypeName) string {
	p := obj.Pkg()
	switch {
	case p == nil || p == w.pkg:
		return obj.Name()
	case p.Name() == w.pkg.Name():
		return p.Path() + "." + obj.Name()
	}
	return p.Name() + "." + obj.Name()
}

func (w *writer) typeArgs(ta *types.TypeList) string {
	if ta == nil || ta.Len() == 0 {
		return ""
	}
	var as []string
	for i := range ta.Len() {
		as = append(as, w.typ(ta.At(i)))
	}
	return "[" + strings.Join(as, ", ") + "]"
}
