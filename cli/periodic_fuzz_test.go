package cli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/fenceqtest"
)

// FuzzPeriodicAdd runs `fenceq periodic add` with a fuzzed name, --schedule,
// --timezone, --args, --queue, --missed and --priority against a real schema. Either
// the command is refused as a usage error (exit 2, one stderr line) and no schedule is
// written, or it exits 0 and the stored schedule is the one asked for: its spec the
// trimmed input, its zone and args as given, and a next slot after its creation. A name
// that exists already is the only other error (exit 1).
func FuzzPeriodicAdd(f *testing.F) {
	db := fenceqtest.New(f, nil)
	type seed struct {
		name, spec, zone, args, q, missed string
		priority                          int
	}
	for _, s := range []seed{
		// valid
		{"nightly", "30 2 * * *", "Europe/Berlin", `{}`, "", "", 10},
		{"pulse", "@every 30s", "UTC", `{"duration":"1s"}`, "fast", "once", 0},
		{"x.y:z-1", "  */5 * * * * *  ", "America/New_York", `{"a":[1,2,{"b":null}]}`, "", "skip", 100},
		{"leap", "0 0 29 2 *", "Asia/Tokyo", `{"a":1e131071}`, "", "", 10},
		{"nightly", "@daily", "", `{}`, "", "", 10}, // the name exists already
		// invalid
		{"", "@hourly", "UTC", `{}`, "", "", 10},
		{"bad name", "@hourly", "UTC", `{}`, "", "", 10},
		{"n1", "", "UTC", `{}`, "", "", 10},
		{"n2", "0 0 30 2 *", "UTC", `{}`, "", "", 10},
		{"n3", "@every 1500ms", "UTC", `{}`, "", "", 10},
		{"n4", "@hourly", "Local", `{}`, "", "", 10},
		{"n5", "@hourly", "Nowhere/City", `{}`, "", "", 10},
		{"n6", "@hourly", "\xff", `{}`, "", "", 10},
		{"n7", "@hourly", "UTC", `[]`, "", "", 10},
		{"n8", "@hourly", "UTC", `{"a":"\u0000"}`, "", "", 10},
		{"n9", "@hourly", "UTC", `{"a":"\ud800"}`, "", "", 10},
		{"n10", "@hourly", "UTC", `{}`, "bad queue", "", 10},
		{"n11", "@hourly", "UTC", `{}`, "", "twice", 10},
		{"n12", "@hourly", "UTC", `{}`, "", "", 101},
		{"n13", "TZ=UTC @hourly", "UTC", `{}`, "", "", 10},
		{"n14", "\x00", "UTC", `{}`, "", "", 10},
	} {
		f.Add(s.name, s.spec, s.zone, s.args, s.q, s.missed, s.priority)
	}
	f.Fuzz(func(t *testing.T, name, spec, zone, args, q, missed string, priority int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := []string{"periodic", "add", "--kind=fuzz.kind", "--allow-unknown-kind", "--json",
			"--schedule=" + spec, "--args=" + args, "--priority=" + strconv.Itoa(priority), "--database-url=" + db.URL}
		for flag, v := range map[string]string{"timezone": zone, "queue": q, "missed": missed} {
			if v != "" {
				cmd = append(cmd, "--"+flag+"="+v)
			}
		}
		cmd = append(cmd, "--", name)
		before := periodicRows(ctx, t, db)
		r := runCLI(ctx, cmd...)
		after := periodicRows(ctx, t, db)
		if r.code != 0 {
			lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "fenceq: ") {
				t.Fatalf("%q: exit %d, stderr %q: want one line \"fenceq: …\"", cmd, r.code, r.stderr)
			}
			exists := r.code == cli.ExitError && strings.Contains(r.stderr, "already exists")
			if r.code != cli.ExitUsage && !exists {
				t.Fatalf("%q: exit %d, want %d (a usage error)\nstderr: %s", cmd, r.code, cli.ExitUsage, r.stderr)
			}
			if after != before {
				t.Fatalf("%q failed (%s) but fenceq_periodic went from %d to %d rows", cmd, r.stderr, before, after)
			}
			return
		}
		if after != before+1 {
			t.Fatalf("%q: added a schedule but fenceq_periodic went from %d to %d rows", cmd, before, after)
		}
		var info struct {
			Name     string     `json:"name"`
			Spec     string     `json:"spec"`
			Timezone string     `json:"timezone"`
			Queue    string     `json:"queue"`
			Priority int        `json:"priority"`
			Missed   string     `json:"missed"`
			Next     *time.Time `json:"next_slot"`
			Created  time.Time  `json:"created_at"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
			t.Fatalf("%q: decode %q: %v", cmd, r.stdout, err)
		}
		wantZone := zone
		if wantZone == "" {
			wantZone = "UTC"
		}
		if info.Name != name || info.Spec != strings.TrimSpace(spec) || info.Timezone != wantZone || info.Priority != priority ||
			(q != "" && info.Queue != q) || (missed != "" && info.Missed != missed) {
			t.Fatalf("%q: stored %+v", cmd, info)
		}
		if info.Next == nil || !info.Next.After(info.Created) {
			t.Fatalf("%q: next slot %v is not after the schedule's creation at %s", cmd, info.Next, info.Created)
		}
		var same bool
		if err := db.Pool.QueryRow(ctx, `SELECT args = $2::text::jsonb FROM fenceq_periodic WHERE name = $1`,
			name, args).Scan(&same); err != nil || !same {
			t.Fatalf("%q: stored args differ from the input (%v)", cmd, err)
		}
		// What the CLI stored, the library reads back as a usable schedule.
		got, err := fenceq.GetPeriodic(ctx, db.Pool, name)
		if err != nil || got.Error != "" {
			t.Fatalf("%q: GetPeriodic: %+v, %v", cmd, got, err)
		}
		if _, err := fenceq.ParseSchedule(got.Spec, got.Timezone); err != nil {
			t.Fatalf("%q: the stored spec %q in %q does not parse: %v", cmd, got.Spec, got.Timezone, err)
		}
	})
}

func periodicRows(ctx context.Context, t *testing.T, db *fenceqtest.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_periodic`).Scan(&n); err != nil {
		t.Fatalf("count schedules: %v", err)
	}
	return n
}
