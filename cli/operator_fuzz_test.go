package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/builtin"
)

// fuzzCommands are operator commands taking outside input; "{}" is the fuzzed value.
var fuzzCommands = [][]string{
	{"jobs", "show", "{}"},
	{"jobs", "retry", "{}"},
	{"jobs", "cancel", "{}"},
	{"jobs", "requeue", "{}"},
	{"outbox", "retry", "{}"},
	{"periodic", "pause", "{}"},
	{"periodic", "resume", "{}"},
	{"periodic", "trigger", "{}"},
	{"jobs", "list", "--state={}"},
	{"jobs", "list", "--queue={}"},
	{"jobs", "list", "--kind={}"},
	{"jobs", "list", "--tag={}"},
	{"jobs", "list", "--limit={}"},
	{"jobs", "list", "--unknown-kinds", "--live-within={}"},
	{"outbox", "list", "--state={}"},
	{"outbox", "list", "--topic={}"},
}

// FuzzOperatorCommands runs operator commands with a fuzzed job or outbox id, schedule
// name, filter, limit or duration against a real schema. Each ends with exit 0, a
// usage error (exit 2) or an error saying what is wrong with the row (exit 1), in one
// stderr line; never with a database error caused by the input (SQLSTATE), which means
// the input reached the database unchecked.
func FuzzOperatorCommands(f *testing.F) {
	db := fenceqtest.New(f, &fenceqtest.Options{Migrations: builtin.Migrations()})
	ctx := context.Background()
	for _, kind := range []string{"noop", "noop"} {
		if r := runCLI(ctx, "enqueue", kind, "--tag", "nightly", "--database-url", db.URL); r.code != 0 {
			f.Fatalf("enqueue %s: %d %s", kind, r.code, r.stderr)
		}
	}
	for i, c := range fuzzCommands {
		for _, v := range []string{"1", "2", "0", "-1", "9223372036854775807", "9223372036854775808", "abc", "",
			"1e3", " 1", "\x00", "\xff", "nightly", "default", "available", "all", "bad name", "1s", "-1s",
			strings.Repeat("x", 300)} {
			if strings.HasPrefix(c[len(c)-1], "--") && v == "" {
				continue
			}
			f.Add(uint8(i), v)
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, v string) {
		c := fuzzCommands[int(which)%len(fuzzCommands)]
		args := make([]string, 0, len(c)+2)
		for _, a := range c {
			args = append(args, strings.ReplaceAll(a, "{}", v))
		}
		args = append(args, "--database-url", db.URL)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r := runCLI(ctx, args...)
		if r.code == cli.ExitOK {
			return
		}
		if r.code != cli.ExitUsage && r.code != cli.ExitError {
			t.Fatalf("fenceq %q: exit %d\nstderr: %s", args, r.code, r.stderr)
		}
		lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "fenceq: ") {
			t.Fatalf("fenceq %q: exit %d, stderr %q: want one line \"fenceq: …\"", args, r.code, r.stderr)
		}
		if strings.Contains(r.stderr, "SQLSTATE") {
			t.Fatalf("fenceq %q: the input reached the database unchecked: %s", args, r.stderr)
		}
	})
}
