package cli_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// flowDetail is `fenceq flow show --json`.
type flowDetail struct {
	Limit      queue.FlowLimit       `json:"limit"`
	Partitions []queue.FlowPartition `json:"partitions"`
}

// jobFlowDetail is the flow part of `fenceq jobs show --json`.
type jobFlowDetail struct {
	queue.JobRow
	Flow      *queue.FlowPartition `json:"flow"`
	FlowLimit *queue.FlowLimit     `json:"flow_limit"`
}

// claimFlow claims up to n jobs under flow limits from the default queue as worker w.
func (b *testBundle) claimFlow(t *testing.T, w string, n int) []*queue.JobRow {
	t.Helper()
	got, _, err := store.ClaimFlow(b.ctx, b.db.Pool, store.ClaimFlowParams{WorkerID: w, Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: queue.DefaultQueue, Limit: n}}})
	if err != nil {
		t.Fatalf("claim under flow limits: %v", err)
	}
	return got
}

func TestFlowSetListShowDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)

	var set queue.FlowLimit
	b.okJSON(t, &set, "flow", "set", "cust", "--max-running", "2")
	if set != (queue.FlowLimit{Name: "cust", MaxRunning: 2}) {
		t.Fatalf("flow set: %+v", set)
	}
	if out := b.ok(t, "flow", "set", "smtp", "--rate", "100", "--per", "1m"); out != "flow limit smtp set: at most 100 starts per 1m0s per partition\n" {
		t.Errorf("flow set output %q", out)
	}
	b.ok(t, "flow", "set", "ledger", "--sequence", "--hold-on-discard")
	// Setting a limit again replaces its numbers.
	b.ok(t, "flow", "set", "cust", "--max-running", "1")

	var ls []queue.FlowLimit
	b.okJSON(t, &ls, "flow", "list")
	want := []queue.FlowLimit{{Name: "cust", MaxRunning: 1}, {Name: "ledger", Sequence: true, HoldOnDiscard: true},
		{Name: "smtp", Rate: 100, Per: time.Minute}}
	if len(ls) != len(want) {
		t.Fatalf("flow list: %+v, want %+v", ls, want)
	}
	for i := range want {
		if ls[i] != want[i] {
			t.Fatalf("flow list[%d]: %+v, want %+v", i, ls[i], want[i])
		}
	}
	out := b.ok(t, "flow", "list")
	if !strings.HasPrefix(out, "NAME") || !strings.Contains(out, "100/1m0s") || !strings.Contains(out, "ledger") {
		t.Errorf("flow list table:\n%s", out)
	}

	// Two customers' jobs under the limit: one of acme's runs, the other waits.
	a1 := b.enqueue(t, "noop", "--flow-limit", "cust", "--flow-partition", "acme")
	b.enqueue(t, "noop", "--flow-limit", "cust", "--flow-partition", "acme")
	b.enqueue(t, "noop", "--flow-limit", "cust", "--flow-partition", "globex")
	if a1.FlowKey == nil || *a1.FlowKey != "cust:acme" || a1.State != queue.StateAvailable {
		t.Fatalf("enqueued under a limit: %+v", a1)
	}
	if got := b.claimFlow(t, "w1", 10); len(got) != 2 {
		t.Fatalf("claimed %d jobs, want one per customer", len(got))
	}
	var d flowDetail
	b.okJSON(t, &d, "flow", "show", "cust")
	if d.Limit.MaxRunning != 1 || len(d.Partitions) != 2 {
		t.Fatalf("flow show: %+v", d)
	}
	acme := d.Partitions[0]
	if acme.Key != "cust:acme" || acme.Running != 1 || acme.Waiting != 1 || acme.NextStart != nil {
		t.Fatalf("acme's partition: %+v", acme)
	}
	out = b.ok(t, "flow", "show", "cust")
	for _, s := range []string{"flow limit cust: at most 1 running per partition", "KEY", "cust:acme", "1/1", "cust:globex"} {
		if !strings.Contains(out, s) {
			t.Errorf("flow show lacks %q:\n%s", s, out)
		}
	}
	b.okJSON(t, &d, "flow", "show", "cust", "--limit", "1")
	if len(d.Partitions) != 1 || d.Partitions[0].Key != "cust:acme" {
		t.Fatalf("flow show --limit 1: %+v", d.Partitions)
	}
	if out := b.ok(t, "flow", "show", "smtp"); !strings.Contains(out, "no partitions") {
		t.Errorf("flow show of an unused limit:\n%s", out)
	}

	// A limit with unfinished jobs cannot go; an unused one can, once.
	r := b.run(t, "flow", "delete", "cust")
	oneErrorLine(t, r, `cannot delete flow limit "cust": unfinished jobs are under it`)
	if r.code != 1 {
		t.Errorf("flow delete of a busy limit: exit %d, want 1", r.code)
	}
	if out := b.ok(t, "flow", "delete", "smtp"); out != "flow limit smtp deleted\n" {
		t.Errorf("flow delete output %q", out)
	}
	for _, args := range [][]string{{"flow", "delete", "smtp"}, {"flow", "show", "smtp"}} {
		r = b.run(t, args...)
		oneErrorLine(t, r, `flow limit "smtp" not found`)
		if r.code != 1 {
			t.Errorf("%v: exit %d, want 1", args, r.code)
		}
	}
	b.okJSON(t, &ls, "flow", "list")
	if len(ls) != 2 {
		t.Fatalf("after delete: %+v", ls)
	}
}

func TestFlowRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ok(t, "flow", "set", "cust", "--max-running", "1")
	// Every bad command line is a usage error (exit 2) naming the flag that is wrong, and
	// writes nothing.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"flow", "set", "none"}, `flow limit "none" limits nothing: give --max-running, --rate with --per, or --sequence`},
		{[]string{"flow", "set", "x", "--max-running", "-1"}, "invalid --max-running: -1 is negative"},
		{[]string{"flow", "set", "x", "--rate", "5"}, "invalid --per: a rate needs its period"},
		{[]string{"flow", "set", "x", "--per", "1s"}, "invalid --per: a rate needs its period"},
		{[]string{"flow", "set", "x", "--rate", "5", "--per", "1us"}, "invalid --per: 1µs is shorter than a millisecond"},
		{[]string{"flow", "set", "x", "--rate", "10001", "--per", "1s"}, "invalid --rate: 10001 must be 0 (none) to 10000"},
		{[]string{"flow", "set", "x", "--max-running", "1", "--hold-on-discard"}, "invalid --hold-on-discard: applies to sequences only"},
		{[]string{"flow", "set", "a:b", "--max-running", "1"}, `must not contain ':'`},
		{[]string{"flow", "set"}, "usage: fenceq flow set NAME"},
		{[]string{"flow", "show", "cust", "--limit", "0"}, "invalid --limit 0"},
		{[]string{"flow", "delete"}, "usage: fenceq flow delete NAME"},
		{[]string{"enqueue", "noop", "--flow-partition", "acme"}, "--flow-partition needs --flow-limit"},
		{[]string{"enqueue", "noop", "--flow-limit", "a:b"}, `must not contain ':'`},
		{[]string{"enqueue", "noop", "--flow-limit", "cust", "--flow-partition", strings.Repeat("p", 300)},
			"must be valid UTF-8 of at most 256 bytes"},
	} {
		r := b.run(t, c.args...)
		oneErrorLine(t, r, c.want)
		if r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)", c.args, r.code)
		}
	}
	// A limit that is not set is found at the database: an error, and no job.
	oneErrorLine(t, b.run(t, "enqueue", "noop", "--flow-limit", "nope"), `flow limit "nope" is not set`)
	var ls []queue.FlowLimit
	b.okJSON(t, &ls, "flow", "list")
	if len(ls) != 1 || ls[0] != (queue.FlowLimit{Name: "cust", MaxRunning: 1}) {
		t.Fatalf("flow limits after refused commands: %+v", ls)
	}
	if n := countJobs(t, b); n != 0 {
		t.Fatalf("%d jobs written by refused enqueues", n)
	}
}

// A job under a rate limit whose partition used up its period shows, in `fenceq jobs
// show`, its flow key, the partition's state and the next start, an hour from the
// start that filled it.
func TestJobsShowFlowPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ok(t, "flow", "set", "smtp", "--rate", "1", "--per", "1h")
	first := b.enqueue(t, "noop", "--flow-limit", "smtp", "--flow-partition", "example.com")
	second := b.enqueue(t, "noop", "--flow-limit", "smtp", "--flow-partition", "example.com")
	got := b.claimFlow(t, "w1", 10)
	if len(got) != 1 || got[0].ID != first.ID {
		t.Fatalf("claimed %+v, want only job %d (the rate allows one start an hour)", got, first.ID)
	}
	var started time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT starts[1] FROM fenceq_flow_keys WHERE key = 'smtp:example.com'`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	// A second claim takes nothing: the partition is full for the hour.
	if got := b.claimFlow(t, "w2", 10); len(got) != 0 {
		t.Fatalf("second claim took %+v within the rate's period", got)
	}

	var d jobFlowDetail
	b.okJSON(t, &d, "jobs", "show", strconv.FormatInt(second.ID, 10))
	if d.FlowKey == nil || *d.FlowKey != "smtp:example.com" || d.Flow == nil || d.FlowLimit == nil {
		t.Fatalf("jobs show --json: flow %+v, limit %+v, key %v", d.Flow, d.FlowLimit, d.FlowKey)
	}
	if d.Flow.NextStart == nil || !d.Flow.NextStart.After(time.Now()) || !d.Flow.NextStart.Equal(started.Add(time.Hour)) || d.Flow.StartsInPeriod != 1 ||
		d.Flow.Running != 1 || d.Flow.Waiting != 1 {
		t.Fatalf("partition %+v, want next start %s (the first start plus the hour)", d.Flow, started.Add(time.Hour))
	}
	out := b.ok(t, "jobs", "show", strconv.FormatInt(second.ID, 10))
	next := started.Add(time.Hour).Local().Format("2006-01-02 15:04:05.000")
	for _, s := range []string{"flow_key:", "smtp:example.com", "flow partition:", "at most 1 starts per 1h0m0s",
		"starts_in_period: 1", "next_start:", next} {
		if !strings.Contains(out, s) {
			t.Errorf("jobs show lacks %q:\n%s", s, out)
		}
	}
	// A job under no limit shows no partition.
	plain := b.enqueue(t, "noop")
	var pd jobFlowDetail
	b.okJSON(t, &pd, "jobs", "show", strconv.FormatInt(plain.ID, 10))
	if pd.Flow != nil || pd.FlowKey != nil || pd.ID != plain.ID {
		t.Fatalf("a job under no limit: flow %+v key %v", pd.Flow, pd.FlowKey)
	}
	if out := b.ok(t, "jobs", "show", strconv.FormatInt(plain.ID, 10)); strings.Contains(out, "flow partition:") {
		t.Errorf("a job under no limit shows a partition:\n%s", out)
	}
}
