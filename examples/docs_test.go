package examples_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the module's root, seen from this package's directory.
const repoRoot = ".."

// TestReadmeQuickstart checks that the README's quickstart is the quickstart program, byte
// for byte, and its migration: the code a reader copies is the code that
// TestExamples runs.
func TestReadmeQuickstart(t *testing.T) {
	t.Parallel()
	readme := readFile(t, filepath.Join(repoRoot, "README.md"))
	for _, c := range []struct{ lang, file string }{
		{"go", "quickstart/main.go"},
		{"sql", "quickstart/migrations/000001_create_greetings.up.sql"},
	} {
		block := "```" + c.lang + "\n" + readFile(t, c.file) + "```\n"
		if !strings.Contains(readme, block) {
			t.Errorf("README.md does not hold examples/%s verbatim in a ```%s block: copy the file into the README's quickstart", c.file, c.lang)
		}
	}
}

// pendingDocs are pages that the README links to and that are written on other branches.
// The test accepts them missing and fails once they exist, so that the list empties as
// they arrive.
var pendingDocs = []string{}

// TestDocLinks checks every relative link of the README, the changelog and docs/*.md: the
// target file or directory exists and, for a #fragment, the target page has a heading
// with that anchor.
func TestDocLinks(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "CHANGELOG.md"))
	for _, p := range pendingDocs {
		if _, err := os.Stat(filepath.Join(repoRoot, p)); err == nil {
			t.Errorf("%s exists now: remove it from pendingDocs", p)
		}
	}
	anchors := map[string]map[string]bool{} // page path → its heading anchors
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		a := headingAnchors(readFile(t, page))
		anchors[page] = a
		return a
	}
	checked := 0
	for _, page := range pages {
		for _, l := range markdownLinks(readFile(t, page)) {
			if isExternal(l.target) {
				continue
			}
			checked++
			where := fmt.Sprintf("%s:%d: link %q", rel(page), l.line, l.target)
			path, frag, _ := strings.Cut(l.target, "#")
			target := page
			if path != "" {
				target = filepath.Join(filepath.Dir(page), path)
				if slices.Contains(pendingDocs, rel(target)) {
					continue
				}
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s: no such file or directory %s", where, rel(target))
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				t.Errorf("%s: a #fragment on a file that is not markdown", where)
				continue
			}
			if !anchorsOf(target)[frag] {
				t.Errorf("%s: %s has no heading with anchor #%s", where, rel(target), frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link parser is broken")
	}
}

// TestMarkdownParsers pins the link and anchor extraction that TestDocLinks relies on.
func TestMarkdownParsers(t *testing.T) {
	t.Parallel()
	doc := "# Guarantees and their limits\n" +
		"See [a](docs/a.md#x-y) and ![img](img/p.png), not `[b](nope.md)`.\n" +
		"```go\n[c](inside-code.md)\n# not a heading\n```\n" +
		"## Why: two incidents\n## `Job.Commit` in one round trip\n## Why: two incidents\n"
	var got []string
	for _, l := range markdownLinks(doc) {
		got = append(got, fmt.Sprintf("%d:%s", l.line, l.target))
	}
	if want := []string{"2:docs/a.md#x-y", "2:img/p.png"}; !slices.Equal(got, want) {
		t.Errorf("markdownLinks = %q, want %q", got, want)
	}
	a := headingAnchors(doc)
	for _, want := range []string{"guarantees-and-their-limits", "why-two-incidents", "jobcommit-in-one-round-trip", "why-two-incidents-1"} {
		if !a[want] {
			t.Errorf("headingAnchors lacks %q: %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Errorf("headingAnchors took a line of a code block: %v", a)
	}
}

type link struct {
	line   int
	target string
}

var (
	linkRE       = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	inlineCodeRE = regexp.MustCompile("`[^`]*`")
)

// markdownLinks returns the inline links and images of a markdown text, outside code
// blocks and code spans.
func markdownLinks(text string) []link {
	var out []link
	forEachProseLine(text, func(n int, line string) {
		line = inlineCodeRE.ReplaceAllString(line, "")
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			out = append(out, link{line: n, target: m[1]})
		}
	})
	return out
}

// headingAnchors returns the anchors GitHub gives the headings of a markdown text:
// lower case, punctuation dropped, spaces as hyphens, and -1, -2 … on repeats.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	forEachProseLine(text, func(_ int, line string) {
		if !strings.HasPrefix(line, "#") {
			return
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	})
	return anchors
}

// forEachProseLine calls fn with each line (numbered from 1) that is outside a fenced
// code block.
func forEachProseLine(text string, fn func(n int, line string)) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	inCode := false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			fn(n, line)
		}
	}
}

func isExternal(target string) bool {
	for _, p := range []string{"http://", "https://", "mailto:"} {
		if strings.HasPrefix(target, p) {
			return true
		}
	}
	return false
}

func rel(path string) string {
	r, err := filepath.Rel(repoRoot, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n")))
}
