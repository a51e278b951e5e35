package cli_test

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/stockcli"
)

// flagColumn is the left column of a flag's line in --help: its names, each with its
// placeholder ("value", or an upper-case word the flag's usage gives between
// backticks), then for a repeatable flag the same again in brackets.
var flagColumn = func() *regexp.Regexp {
	name := `--?[a-z0-9][a-z0-9-]*( (value|[A-Z][A-Z0-9_]*))?`
	names := name + `(, ` + name + `)*`
	return regexp.MustCompile(`^` + names + `( \[ ` + names + ` \])?$`)
}()

// optionProblems checks the option lines of one rendered --help and returns what is
// wrong with them: urfave/cli reads the first backtick-quoted text of a flag's usage as
// the flag's placeholder, so a usage that quotes a command in backticks renders that
// command as the placeholder in the left column, and a lone backtick is printed as is.
func optionProblems(help string) []string {
	var problems []string
	in, flags := false, 0
	for line := range strings.SplitSeq(help, "\n") {
		if strings.HasSuffix(line, "OPTIONS:") {
			in = true
			continue
		}
		if !in || strings.TrimSpace(line) == "" {
			continue
		}
		if !strings.HasPrefix(line, "   -") {
			problems = append(problems, "option line does not start with a flag: "+line)
			continue
		}
		flags++
		if strings.Contains(line, "`") {
			problems = append(problems, "backtick in an option line (an unbalanced placeholder): "+line)
		}
		left, usage, ok := strings.Cut(strings.TrimSpace(line), "  ")
		if !ok || strings.TrimSpace(usage) == "" {
			problems = append(problems, "option line without usage: "+line)
			continue
		}
		if !flagColumn.MatchString(left) {
			problems = append(problems, fmt.Sprintf(
				"garbled flag column %q (a placeholder must be one upper-case word): %s", left, line))
		}
	}
	if flags == 0 {
		problems = append(problems, "no option lines")
	}
	return problems
}

// Every command's --help renders each of its flags as the flag's names, a placeholder
// and its usage, with no usage text spilled into the placeholder.
func TestHelpPlaceholders(t *testing.T) {
	t.Parallel()
	var paths [][]string
	var walk func(prefix []string, cmds []*ucli.Command)
	walk = func(prefix []string, cmds []*ucli.Command) {
		for _, c := range cmds {
			path := append(append([]string(nil), prefix...), c.Name)
			// A command that skips flag parsing parses its own arguments (the chaos
			// naive worker, started by fenceq chaos) and has no flags of urfave/cli's.
			if !c.SkipFlagParsing {
				paths = append(paths, path)
			}
			walk(path, c.Subcommands)
		}
	}
	walk(nil, stockcli.New(io.Discard, io.Discard).Commands)
	if len(paths) < 10 {
		t.Fatalf("walked only %d commands: %q", len(paths), paths)
	}
	paths = append(paths, nil) // fenceq --help itself
	for _, path := range paths {
		name := strings.Join(path, " ")
		r := runCLI(t.Context(), append(path, "--help")...)
		if r.code != 0 {
			t.Errorf("fenceq %s --help: exit %d, stderr %q", name, r.code, r.stderr)
			continue
		}
		for _, p := range optionProblems(r.stdout) {
			t.Errorf("fenceq %s --help: %s", name, p)
		}
	}
}

// The check itself catches the placeholder a backtick-quoted command makes and a lone
// backtick, and accepts a placeholder word.
func TestHelpPlaceholdersCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		usage string
		ok    bool
	}{
		{"label the job (find it with `fenceq jobs list --tag`)", false},
		{"a lone ` backtick", false},
		{"label the job with `TAG`", true},
		{"label the job", true},
	} {
		var b strings.Builder
		app := &ucli.App{Name: "x", Writer: &b, HideHelp: true,
			Flags: []ucli.Flag{&ucli.StringSliceFlag{Name: "tag", Aliases: []string{"t"}, Usage: c.usage}}}
		if err := ucli.ShowAppHelp(ucli.NewContext(app, nil, nil)); err != nil {
			t.Fatal(err)
		}
		if problems := optionProblems(b.String()); (len(problems) == 0) != c.ok {
			t.Errorf("usage %q rendered as\n%s\nproblems %q, want ok %v", c.usage, b.String(), problems, c.ok)
		}
	}
}
