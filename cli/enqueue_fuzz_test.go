package cli_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// FuzzEnqueue runs `fenceq enqueue` with fuzzed --args, --run-at, --in, --queue,
// --priority, --max-attempts, --unique-key and --tag against a real schema. Either the
// command is refused as a usage error (exit 2, one line on stderr) and the table holds
// no new row, or it succeeds and the stored row is what was asked for: args equal to
// the input as jsonb, the queue, priority, attempts and tag given (a --tag holding a
// comma is several tags, which the flag parser splits).
func FuzzEnqueue(f *testing.F) {
	db := fenceqtest.New(f, nil)
	type seed struct {
		args, runAt, in, q, key, tag string
		priority, attempts           int
	}
	for _, s := range []seed{
		// valid
		{`{}`, "", "", "", "", "", 10, 3},
		{`{"to":"ada@example.com","n":[1,2.5e3,-0],"ok":true}`, "2026-01-31T09:00:00Z", "", "mail", "", "billing", 0, 1},
		{` {"a" : {"b":null}} `, "", "1m30s", "a.b:c-d", "order-42", "t1", 100, 1000},
		{`{"a":"\ud83d\ude00","b":"é","c":"\\u0000"}`, "", "0s", "", "order-42", "", 50, 25},
		{`{"a":1,"a":2}`, "0001-01-01T00:00:00Z", "", "", "", "", 10, 3},
		{`{"a":1e131071}`, "0001-01-01T00:00:01Z", "", "", "", "", 10, 3},
		{`{}`, "9999-12-31T23:59:59Z", "", "", "", "", 10, 3},
		{`{"a":"x"}`, "", "2562047h", "", "", "", 10, 3},
		// invalid
		{``, "", "", "", "", "", 10, 3},
		{`[]`, "", "", "", "", "", 10, 3},
		{`null`, "", "", "", "", "", 10, 3},
		{`{"a":`, "", "", "", "", "", 10, 3},
		{`{"a":"\u0000"}`, "", "", "", "", "", 10, 3},
		{`{"a":"\ud800"}`, "", "", "", "", "", 10, 3},
		{"{\"a\":\"\xff\"}", "", "", "", "", "", 10, 3},
		{`{"a":1e131072}`, "", "", "", "", "", 10, 3},
		{`{"a":1e-16384}`, "", "", "", "", "", 10, 3},
		{`{}`, "yesterday", "", "", "", "", 10, 3},
		{`{}`, "2026-02-30T00:00:00Z", "", "", "", "", 10, 3},
		{`{}`, "2026-01-31T09:00:00Z", "1m", "", "", "", 10, 3},
		{`{}`, "9999-12-31T23:59:59-23:59", "", "", "", "", 10, 3}, // year 10000 in UTC
		{`{}`, "0000-01-01T00:00:00+01:00", "", "", "", "", 10, 3}, // year -1 in UTC
		{`{}`, "", "-1s", "", "", "", 10, 3},
		{`{}`, "", "soon", "", "", "", 10, 3},
		{`{}`, "", "", "bad queue", "", "", 10, 3},
		{`{}`, "", "", strings.Repeat("q", 65), "", "", 10, 3},
		{`{}`, "", "", "", "key\n", "", 10, 3},
		{`{}`, "", "", "", strings.Repeat("k", 256), "", 10, 3},
		{`{}`, "", "", "", "", "-tag", 10, 3},
		{`{}`, "", "", "", "", "", -1, 3},
		{`{}`, "", "", "", "", "", 101, 3},
		{`{}`, "", "", "", "", "", 10, 0},
		{`{}`, "", "", "", "", "", 10, 1001},
	} {
		f.Add(s.args, s.runAt, s.in, s.q, s.key, s.tag, s.priority, s.attempts)
	}
	f.Fuzz(func(t *testing.T, args, runAt, in, q, key, tag string, priority, attempts int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := []string{"fenceq", "enqueue", "fuzz.kind", "--allow-unknown-kind", "--json", "--args=" + args,
			"--priority=" + strconv.Itoa(priority), "--max-attempts=" + strconv.Itoa(attempts),
			"--database-url=" + db.URL}
		for flag, v := range map[string]string{"run-at": runAt, "in": in, "queue": q, "unique-key": key, "tag": tag} {
			if v != "" {
				cmd = append(cmd, "--"+flag+"="+v)
			}
		}
		before := fuzzJobRows(ctx, t, db)
		r := runCLIArgs(ctx, cmd)
		after := fuzzJobRows(ctx, t, db)
		if r.code != 0 {
			if r.code != cli.ExitUsage {
				t.Fatalf("%q: exit %d, want %d (a usage error)\nstderr: %s", cmd, r.code, cli.ExitUsage, r.stderr)
			}
			if lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "fenceq: ") {
				t.Fatalf("%q: stderr %q, want one line \"fenceq: …\"", cmd, r.stderr)
			}
			if after != before {
				t.Fatalf("%q failed (%s) but the table went from %d to %d rows", cmd, r.stderr, before, after)
			}
			return
		}
		var res struct {
			Job      queue.JobRow `json:"job"`
			Existing bool         `json:"existing"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("%q: decode %q: %v", cmd, r.stdout, err)
		}
		if want := before + 1; res.Existing {
			if after != before || key == "" || res.Job.UniqueKey == nil || *res.Job.UniqueKey != key {
				t.Fatalf("%q: existing job %+v for key %q, rows %d -> %d", cmd, res.Job, key, before, after)
			}
			return
		} else if after != want {
			t.Fatalf("%q: enqueued job %d but the table went from %d to %d rows", cmd, res.Job.ID, before, after)
		}
		var same bool
		var gotQueue string
		var gotPriority, gotAttempts int
		var gotTags []string
		err := db.Pool.QueryRow(ctx, `SELECT args = $2::text::jsonb, queue, priority, max_attempts, tags
			FROM fenceq_jobs WHERE id = $1`, res.Job.ID, args).Scan(&same, &gotQueue, &gotPriority, &gotAttempts, &gotTags)
		if err != nil {
			t.Fatalf("%q: read job %d: %v", cmd, res.Job.ID, err)
		}
		wantQueue := q
		if wantQueue == "" {
			wantQueue = queue.DefaultQueue
		}
		if !same || gotQueue != wantQueue || gotPriority != priority || gotAttempts != attempts ||
			(tag != "" && !strings.Contains(tag, ",") && !slices.Contains(gotTags, tag)) {
			t.Fatalf("%q: stored args equal: %v, queue %q, priority %d, max attempts %d, tags %q",
				cmd, same, gotQueue, gotPriority, gotAttempts, gotTags)
		}
	})
}

func fuzzJobRows(ctx context.Context, t *testing.T, db *fenceqtest.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil {
		t.Fatalf("count jobs: %v", err)
	}
	return n
}

// runCLIArgs runs the fenceq command with a full argument list (program name first).
func runCLIArgs(ctx context.Context, args []string) result {
	return runCLI(ctx, args[1:]...)
}
