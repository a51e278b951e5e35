package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// periodicJSON is what `fenceq periodic list --json` prints per schedule.
type periodicJSON struct {
	Name             string          `json:"name"`
	Spec             string          `json:"spec"`
	Timezone         string          `json:"timezone"`
	Kind             string          `json:"kind"`
	Args             json.RawMessage `json:"args"`
	Queue            string          `json:"queue"`
	Priority         int             `json:"priority"`
	MaxAttempts      int             `json:"max_attempts"`
	Missed           string          `json:"missed"`
	RunOnStart       bool            `json:"run_on_start"`
	Paused           bool            `json:"paused"`
	Source           string          `json:"source"`
	LastSlot         time.Time       `json:"last_slot"`
	LastEnqueuedSlot *time.Time      `json:"last_enqueued_slot"`
	NextSlot         *time.Time      `json:"next_slot"`
	LagSeconds       float64         `json:"lag_seconds"`
}

func (b *testBundle) periodicList(t *testing.T) map[string]periodicJSON {
	t.Helper()
	var ps []periodicJSON
	b.okJSON(t, &ps, "periodic", "list")
	out := map[string]periodicJSON{}
	for _, p := range ps {
		out[p.Name] = p
	}
	return out
}

func TestPeriodicAddListRemove(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if out := b.ok(t, "periodic", "list"); !strings.Contains(out, "no periodic schedules") {
		t.Fatalf("list on an empty schema: %q", out)
	}
	out := b.ok(t, "periodic", "add", "nightly", "--schedule", "30 2 * * *", "--timezone", "Europe/Berlin",
		"--kind", "sleep", "--args", `{"duration": "1s"}`, "--missed", "once", "--priority", "5", "--max-attempts", "3")
	if !strings.Contains(out, "added periodic schedule nightly") || !strings.Contains(out, "next slot") {
		t.Fatalf("add: %q", out)
	}
	var added periodicJSON
	b.okJSON(t, &added, "periodic", "add", "pulse", "--schedule", "@every 30s", "--kind", "noop", "--run-on-start")
	if added.Name != "pulse" || added.Source != "cli" || added.Queue != queue.DefaultQueue || !added.RunOnStart ||
		added.NextSlot == nil || added.NextSlot.Unix()%30 != 0 {
		t.Fatalf("add --json: %+v", added)
	}
	ps := b.periodicList(t)
	n := ps["nightly"]
	if len(ps) != 2 || n.Spec != "30 2 * * *" || n.Timezone != "Europe/Berlin" || n.Kind != "sleep" ||
		compactJSON(t, n.Args) != `{"duration":"1s"}` || n.Missed != "once" || n.Priority != 5 || n.MaxAttempts != 3 ||
		n.Paused || n.LastEnqueuedSlot != nil || n.NextSlot == nil {
		t.Fatalf("list: %+v", ps)
	}
	// The next slot is 02:30 on Berlin's wall clock.
	if at := n.NextSlot.In(mustLoad(t, "Europe/Berlin")); at.Hour() != 2 || at.Minute() != 30 || !n.NextSlot.After(n.LastSlot) {
		t.Fatalf("next slot of nightly %s (Berlin %s)", n.NextSlot, at)
	}
	table := b.ok(t, "periodic", "list")
	for _, want := range []string{"NAME", "NEXT_SLOT", "LAG", "nightly", "30 2 * * *", "Europe/Berlin", "pulse", "@every 30s"} {
		if !strings.Contains(table, want) {
			t.Errorf("list table lacks %q:\n%s", want, table)
		}
	}
	oneErrorLine(t, b.run(t, "periodic", "add", "pulse", "--schedule", "@hourly", "--kind", "noop"), `"pulse" already exists`)

	if out := b.ok(t, "periodic", "remove", "nightly"); !strings.Contains(out, "removed periodic schedule nightly") {
		t.Fatalf("remove: %q", out)
	}
	if ps := b.periodicList(t); len(ps) != 1 {
		t.Fatalf("after remove: %+v", ps)
	}
	oneErrorLine(t, b.run(t, "periodic", "remove", "nightly"), `periodic schedule "nightly" not found`)
}

func compactJSON(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func mustLoad(t *testing.T, zone string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestPeriodicAddRefusesBadInput: each bad value is a usage error (exit 2) on one line
// naming the flag, found before anything is written.
func TestPeriodicAddRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	add := func(extra ...string) []string {
		return append([]string{"periodic", "add"}, extra...)
	}
	cases := []struct {
		args []string
		want string
	}{
		{add("x", "--kind", "noop"), "--schedule is required"},
		{add("x", "--schedule", "@daily"), "--kind is required"},
		{add("x", "--schedule", "every day", "--kind", "noop"), "--schedule: invalid spec"},
		{add("x", "--schedule", "@every 500ms", "--kind", "noop"), "--schedule: invalid spec"},
		{add("x", "--schedule", "0 0 31 2 *", "--kind", "noop"), "never fires"},
		{add("x", "--schedule", "@daily", "--kind", "noop", "--timezone", "Europe/Atlantis"), "--timezone: invalid timezone"},
		{add("x", "--schedule", "@daily", "--kind", "nope"), `--kind: unknown kind "nope"`},
		{add("x", "--schedule", "@daily", "--kind", "no pe", "--allow-unknown-kind"), "--kind: invalid kind"},
		{add("x", "--schedule", "@daily", "--kind", "noop", "--args", "[]"), "--args: invalid args"},
		{add("x", "--schedule", "@daily", "--kind", "sleep", "--args", `{"duration": 5}`), "--args: invalid args for kind sleep"},
		{add("x", "--schedule", "@daily", "--kind", "noop", "--queue", "bad queue"), "--queue: invalid queue"},
		{add("x", "--schedule", "@daily", "--kind", "noop", "--missed", "twice"), "--missed: invalid missed"},
		{add("x", "--schedule", "@daily", "--kind", "noop", "--priority", "500"), "--priority: invalid priority"},
		{add("x", "--schedule", "@daily", "--kind", "noop", "--max-attempts", "0"), "--max-attempts"},
		{add("bad name", "--schedule", "@daily", "--kind", "noop"), "invalid name"},
		{add("--schedule", "@daily", "--kind", "noop"), "usage: fenceq periodic add NAME"},
	}
	for _, c := range cases {
		r := b.run(t, c.args...)
		if r.code != 2 {
			t.Errorf("fenceq %s: exit %d (stderr %q), want 2", strings.Join(c.args, " "), r.code, r.stderr)
			continue
		}
		oneErrorLine(t, r, c.want)
	}
	if ps := b.periodicList(t); len(ps) != 0 {
		t.Fatalf("bad adds wrote %+v", ps)
	}
	for _, sub := range []string{"remove", "pause", "resume", "trigger"} {
		r := b.run(t, "periodic", sub)
		if r.code != 2 {
			t.Errorf("periodic %s without a name: exit %d", sub, r.code)
		}
		oneErrorLine(t, r, "usage: fenceq periodic "+sub+" NAME")
		oneErrorLine(t, b.run(t, "periodic", sub, "no such"), "invalid name")
		oneErrorLine(t, b.run(t, "periodic", sub, "missing"), `periodic schedule "missing" not found`)
	}
	oneErrorLine(t, b.run(t, "periodic", "frobnicate"), `unknown command "frobnicate"`)
}

func TestPeriodicPauseResumeTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ok(t, "periodic", "add", "hourly", "--schedule", "@hourly", "--kind", "noop", "--queue", "q1")
	if out := b.ok(t, "periodic", "pause", "hourly"); !strings.Contains(out, "paused") {
		t.Fatalf("pause: %q", out)
	}
	if p := b.periodicList(t)["hourly"]; !p.Paused || p.LagSeconds != 0 {
		t.Fatalf("after pause: %+v", p)
	}
	if out := b.ok(t, "periodic", "list"); !strings.Contains(out, "paused") {
		t.Fatalf("list of a paused schedule:\n%s", out)
	}
	before := b.periodicList(t)["hourly"].LastSlot
	var resumed periodicJSON
	b.okJSON(t, &resumed, "periodic", "resume", "hourly")
	if resumed.Paused || resumed.LastSlot.Before(before) || resumed.NextSlot == nil || resumed.NextSlot.Minute() != 0 {
		t.Fatalf("after resume: %+v", resumed)
	}

	var trig struct {
		Job *queue.JobRow `json:"job"`
	}
	b.okJSON(t, &trig, "periodic", "trigger", "hourly")
	if trig.Job == nil || trig.Job.Kind != "noop" || trig.Job.Queue != "q1" || trig.Job.State != queue.StateAvailable {
		t.Fatalf("trigger: %+v", trig.Job)
	}
	var meta struct {
		Periodic struct {
			Name      string `json:"name"`
			Triggered bool   `json:"triggered"`
			Slot      string `json:"slot"`
		} `json:"periodic"`
	}
	if err := json.Unmarshal(trig.Job.Metadata, &meta); err != nil || meta.Periodic.Name != "hourly" ||
		!meta.Periodic.Triggered || meta.Periodic.Slot != "" {
		t.Fatalf("triggered job metadata %s (%v)", trig.Job.Metadata, err)
	}
	if out := b.ok(t, "periodic", "trigger", "hourly"); !strings.Contains(out, "for periodic schedule hourly") {
		t.Fatalf("trigger: %q", out)
	}
	after := b.periodicList(t)["hourly"]
	if !after.LastSlot.Equal(resumed.LastSlot) || after.LastEnqueuedSlot != nil {
		t.Fatalf("trigger moved the slots: %+v", after)
	}
}

// TestPeriodicInStats: stats and its JSON show the schedules and their lag.
func TestPeriodicInStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if out := b.ok(t, "stats"); !strings.Contains(out, "periodic schedules:") || !strings.Contains(out, "none") {
		t.Fatalf("stats without schedules:\n%s", out)
	}
	b.ok(t, "periodic", "add", "secondly", "--schedule", "* * * * * *", "--kind", "noop")
	b.ok(t, "periodic", "add", "paused", "--schedule", "@daily", "--kind", "noop")
	b.ok(t, "periodic", "pause", "paused")
	// No worker runs: the every-second schedule falls behind.
	var rep struct {
		Periodic struct {
			Schedules  int     `json:"schedules"`
			Paused     int     `json:"paused"`
			MaxLag     float64 `json:"max_lag_seconds"`
			MaxLagName string  `json:"max_lag_name"`
		} `json:"periodic"`
		Database struct {
			Periodic []fenceq.PeriodicInfo `json:"periodic"`
		} `json:"database"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		b.okJSON(t, &rep, "stats")
		if rep.Periodic.MaxLag >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rep.Periodic.Schedules != 2 || rep.Periodic.Paused != 1 || rep.Periodic.MaxLagName != "secondly" ||
		rep.Periodic.MaxLag < 1 || len(rep.Database.Periodic) != 2 {
		t.Fatalf("stats --json periodic: %+v", rep)
	}
	if out := b.ok(t, "stats"); !strings.Contains(out, "2 (1 paused); most behind: secondly by") {
		t.Fatalf("stats:\n%s", out)
	}
}

// `periodic add` takes no-overlap, a unique key, tags and metadata; `periodic show` and
// `periodic list` report them with the skipped slots.
func TestPeriodicAddNoOverlapAndJobOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var added struct {
		periodicJSON
		NoOverlap    bool            `json:"no_overlap"`
		UniqueKey    *string         `json:"unique_key"`
		Tags         []string        `json:"tags"`
		Metadata     json.RawMessage `json:"metadata"`
		SkippedSlots int64           `json:"skipped_slots"`
	}
	b.okJSON(t, &added, "periodic", "add", "sync", "--schedule", "@every 30s", "--kind", "noop", "--no-overlap",
		"--unique-key", "sync-once", "--tag", "sync", "--tag", "nightly", "--metadata", `{"team": "data"}`)
	if !added.NoOverlap || added.UniqueKey == nil || *added.UniqueKey != "sync-once" ||
		strings.Join(added.Tags, ",") != "sync,nightly" || compactJSON(t, added.Metadata) != `{"team":"data"}` {
		t.Fatalf("add --json: %+v", added)
	}
	out := b.ok(t, "periodic", "show", "sync")
	for _, want := range []string{"no overlap:", "yes", "unique key:", "sync-once", "tags:", "sync, nightly",
		"last skipped slot:", "skipped slots:", `"team": "data"`} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if table := b.ok(t, "periodic", "list"); !strings.Contains(table, "LAST_SKIPPED") {
		t.Errorf("list lacks LAST_SKIPPED:\n%s", table)
	}
	oneErrorLine(t, b.run(t, "periodic", "show", "nope"), `periodic schedule "nope" not found`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tag", "no spaces"}, "--tag: invalid tags"},
		{[]string{"--metadata", "[1]"}, "--metadata: invalid metadata"},
	} {
		r := b.run(t, append([]string{"periodic", "add", "bad", "--schedule", "@hourly", "--kind", "noop"}, c.args...)...)
		oneErrorLine(t, r, c.want)
		if r.code != 2 {
			t.Errorf("periodic add %v: exit %d, want 2", c.args, r.code)
		}
	}
}
