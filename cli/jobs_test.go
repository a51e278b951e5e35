package cli_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

type enqueued struct {
	Job       queue.JobRow `json:"job"`
	Existing  bool         `json:"existing"`
	Debounced bool         `json:"debounced"`
}

func (b *testBundle) enqueue(t *testing.T, args ...string) queue.JobRow {
	t.Helper()
	var e enqueued
	b.okJSON(t, &e, append([]string{"enqueue"}, args...)...)
	return e.Job
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)

	j := b.enqueue(t, "noop")
	if j.Kind != "noop" || j.Queue != "default" || j.State != queue.StateAvailable {
		t.Fatalf("noop job: %+v", j)
	}
	// Flags after the positional argument work too, and every option lands in the row.
	s := b.enqueue(t, "sleep", "--args", `{"duration": "2s"}`, "--queue", "slow", "--priority", "0",
		"--in", "1h", "--unique-key", "nap", "--max-attempts", "3")
	if s.Queue != "slow" || s.Priority != 0 || s.State != queue.StateScheduled || s.MaxAttempts != 3 ||
		s.UniqueKey == nil || *s.UniqueKey != "nap" || time.Until(s.RunAt) < 50*time.Minute {
		t.Fatalf("sleep job: %+v", s)
	}
	var again enqueued
	b.okJSON(t, &again, "enqueue", "sleep", "--args", `{"duration": "2s"}`, "--unique-key", "nap")
	if !again.Existing || again.Job.ID != s.ID {
		t.Fatalf("unique key: %+v, want the existing job %d", again, s.ID)
	}
	at := b.enqueue(t, "noop", "--run-at", "2099-01-02T03:04:05Z")
	if at.State != queue.StateScheduled || at.RunAt.Year() != 2099 {
		t.Fatalf("--run-at: %+v", at)
	}
	if out := b.ok(t, "enqueue", "noop"); !strings.HasPrefix(out, "enqueued job ") {
		t.Errorf("human output %q", out)
	}
	b.enqueue(t, "my.kind", "--allow-unknown-kind")

	// A debounced enqueue waits for its window; the next one with the same key replaces
	// its args while it has not started.
	d := b.enqueue(t, "noop", "--args", `{"rev": 1}`, "--debounce-key", "doc-7", "--debounce-window", "1h")
	if d.State != queue.StateScheduled || time.Until(d.RunAt) < 50*time.Minute {
		t.Fatalf("debounced job: %+v", d)
	}
	var repl enqueued
	b.okJSON(t, &repl, "enqueue", "noop", "--args", `{"rev": 2}`, "--debounce-key", "doc-7", "--debounce-window", "2h")
	var args struct{ Rev int }
	if err := json.Unmarshal(repl.Job.EncodedArgs, &args); err != nil {
		t.Fatal(err)
	}
	if !repl.Debounced || repl.Job.ID != d.ID || args.Rev != 2 ||
		time.Until(repl.Job.RunAt) < 110*time.Minute {
		t.Fatalf("second debounced enqueue: %+v (args %s); want job %d with rev 2, run in 2h", repl, repl.Job.EncodedArgs, d.ID)
	}
	if out := b.ok(t, "enqueue", "noop", "--debounce-key", "doc-7", "--debounce-window", "1h"); !strings.Contains(out, "had not started") {
		t.Errorf("human output of a debounced enqueue %q", out)
	}
	// With a maximum wait of 2h, the job created a moment ago runs 2h after its creation,
	// not 2h after this enqueue.
	var capped enqueued
	b.okJSON(t, &capped, "enqueue", "noop", "--debounce-key", "doc-7", "--debounce-window", "2h", "--debounce-max-wait", "2h")
	if !capped.Debounced || capped.Job.ID != d.ID || capped.Job.RunAt.Sub(capped.Job.CreatedAt) != 2*time.Hour {
		t.Fatalf("capped debounced enqueue: %+v; want job %d run at its created_at plus 2h", capped, d.ID)
	}
}

func TestEnqueueErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Every bad command line is a usage error (exit 2) naming what was wrong, found
	// before connecting: the same mistakes against an unreachable database say the same.
	dead := "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `unknown kind "nope": this binary knows housekeeping.idempotency, invoice, noop`},
		{[]string{"noop", "--args", `{"a":`}, "malformed JSON"},
		{[]string{"noop", "--args", `[1]`}, "must be a JSON object"},
		{[]string{"sleep", "--args", `{"duration": "forever"}`}, "invalid args for kind sleep"},
		{[]string{"noop", "--run-at", "tomorrow"}, "invalid --run-at"},
		{[]string{"noop", "--priority", "101"}, "priority: 101 is outside"},
		{[]string{"noop", "--queue", "bad queue"}, "queue"},
		{[]string{"noop", "--debounce-key", "k"}, "--debounce-window: invalid debounce.window"},
		{[]string{"noop", "--debounce-window", "1m"}, "--debounce-key: invalid debounce.key"},
		{[]string{"noop", "--debounce-key", "k", "--debounce-window", "1h", "--debounce-max-wait", "1m"}, "--debounce-max-wait: invalid debounce.max_wait"},
		{[]string{"noop", "--debounce-key", "k", "--debounce-window", "1m", "--unique-key", "u"}, "--debounce-key: invalid debounce: cannot be combined with a unique key"},
		{[]string{}, "usage: fenceq enqueue KIND"},
	} {
		for _, url := range []string{b.db.URL, dead} {
			r := runCLI(b.ctx, append(append([]string{"enqueue"}, c.args...), "--database-url", url)...)
			oneErrorLine(t, r, c.want)
			if r.code != 2 {
				t.Errorf("enqueue %v against %s: exit %d, want 2 (usage)", c.args, url, r.code)
			}
		}
	}
	if n := countJobs(t, b); n != 0 {
		t.Fatalf("%d jobs written by failed enqueues", n)
	}
}

func countJobs(t *testing.T, b *testBundle) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestJobsListShowRetryCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.enqueue(t, "noop")
	s := b.enqueue(t, "sleep", "--args", `{"duration":"1s"}`, "--queue", "slow")

	var all []queue.JobRow
	b.okJSON(t, &all, "jobs", "list")
	if len(all) != 2 || all[0].ID != s.ID || all[1].ID != a.ID {
		t.Fatalf("jobs list: %+v, want [%d %d]", all, s.ID, a.ID)
	}
	var filtered []queue.JobRow
	b.okJSON(t, &filtered, "jobs", "list", "--queue", "slow", "--state", "available", "--kind", "sleep", "--limit", "5")
	if len(filtered) != 1 || filtered[0].ID != s.ID {
		t.Fatalf("filtered list: %+v", filtered)
	}
	out := b.ok(t, "jobs", "list")
	if !strings.HasPrefix(out, "ID  KIND") || !strings.Contains(out, "sleep  slow") {
		t.Errorf("table:\n%s", out)
	}
	oneErrorLine(t, b.run(t, "jobs", "list", "--state", "done"), `invalid --state: "done" is not a job state`)
	oneErrorLine(t, b.run(t, "enqueue", "noop", "--in", "-5m"), "invalid --in -5m0s: must not be negative")
	for _, n := range []string{"0", "-1", "100001", "9223372036854775807"} {
		r := b.run(t, "jobs", "list", "--limit", n)
		oneErrorLine(t, r, "invalid --limit "+n+": want 1–100000")
		if r.code != 2 {
			t.Errorf("jobs list --limit %s: exit %d, want 2 (bad command line)", n, r.code)
		}
	}

	out = b.ok(t, "jobs", "show", strconv.FormatInt(a.ID, 10))
	if !strings.Contains(out, "kind:") || !strings.Contains(out, "noop") {
		t.Errorf("show:\n%s", out)
	}

	// cancel → cancelled; retry → available again with an attempt left.
	var res struct{ Before, After queue.JobRow }
	b.okJSON(t, &res, "jobs", "cancel", strconv.FormatInt(a.ID, 10))
	if res.After.State != queue.StateCancelled {
		t.Fatalf("cancel: %+v", res.After)
	}
	oneErrorLine(t, b.run(t, "jobs", "cancel", strconv.FormatInt(a.ID, 10)), "cannot cancel job")
	b.okJSON(t, &res, "jobs", "retry", strconv.FormatInt(a.ID, 10))
	if res.After.State != queue.StateAvailable || res.After.FinishedAt != nil {
		t.Fatalf("retry: %+v", res.After)
	}
	oneErrorLine(t, b.run(t, "jobs", "retry", strconv.FormatInt(a.ID, 10)),
		"it is available (use `fenceq jobs requeue")

	for _, op := range []string{"show", "retry", "cancel", "requeue"} {
		oneErrorLine(t, b.run(t, "jobs", op, "123456"), "job 123456 not found")
	}
	oneErrorLine(t, b.run(t, "jobs", "show", "abc"), `invalid job id "abc"`)
}

// TestJobsRequeueRunning: requeue of a running job revokes its lease by bumping the
// generation and records a revoked event; the old holder's writes are rejected.
func TestJobsRequeueRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.enqueue(t, "noop")
	claimed, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "default", WorkerID: "w-old",
		Limit: 1, Lease: time.Minute})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	old := store.LeaseOf(claimed[0])

	out := b.ok(t, "jobs", "requeue", strconv.FormatInt(j.ID, 10))
	if !strings.Contains(out, "lease of w-old revoked") {
		t.Errorf("requeue output %q", out)
	}
	row, err := store.GetJob(b.ctx, b.db.Pool, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row.State != queue.StateAvailable || row.LeaseGen != old.Gen+1 {
		t.Fatalf("after requeue: state %s gen %d, want available gen %d", row.State, row.LeaseGen, old.Gen+1)
	}
	events, err := store.ListLeaseEvents(b.ctx, b.db.Pool, j.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].Kind != queue.EventRevoked || events[0].LeaseGen != old.Gen {
		t.Fatalf("lease events: %+v, want one revoked at gen %d", events, old.Gen)
	}
	if err := store.Complete(b.ctx, b.db.Pool, old); !errors.Is(err, queue.ErrLeaseLost) {
		t.Fatalf("old holder's completion: %v, want ErrLeaseLost", err)
	}
	show := b.ok(t, "jobs", "show", strconv.FormatInt(j.ID, 10))
	if !strings.Contains(show, "lease events:") || !strings.Contains(show, "revoked") {
		t.Errorf("show lacks the revoked event:\n%s", show)
	}
}

func TestUsageAndConnectionErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r := runCLI(ctx, "jobs", "list", "--database-url", "postgres://u:secret@127.0.0.1:1/x")
	oneErrorLine(t, r, "cannot connect to postgres://u:xxxxx@127.0.0.1:1/x")
	if strings.Contains(r.stderr, "secret") || !strings.Contains(r.stderr, "hint: set --database-url or DATABASE_URL") {
		t.Fatalf("stderr %q leaks the password or lacks the hint", r.stderr)
	}
	r = runCLI(ctx, "stats", "--database-url", "host=127.0.0.1 port=1 user=u password=secret")
	oneErrorLine(t, r, "password=xxxxx")
	if strings.Contains(r.stderr, "secret") {
		t.Fatalf("stderr %q leaks the password", r.stderr)
	}

	r = runCLI(ctx, "bogus")
	oneErrorLine(t, r, `unknown command "bogus"`)
	if r.code != 2 {
		t.Errorf("unknown command: exit %d, want 2", r.code)
	}
	r = runCLI(ctx, "jobs", "list", "--nope")
	oneErrorLine(t, r, "flag provided but not defined")
	if r.code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", r.code)
	}
	r = runCLI(ctx, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "DATABASE_URL") || !strings.Contains(r.stdout, "demo") {
		t.Errorf("--help: exit %d\n%s", r.code, r.stdout)
	}
	// --help after a positional argument shows the command's help (urfave/cli would take
	// the argument for a help topic: "No help topic for '5'").
	for _, args := range [][]string{{"jobs", "show", "5", "--help"}, {"bench", "drain", "-h"}} {
		r := runCLI(ctx, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "fenceq "+args[0]+" "+args[1]) {
			t.Errorf("%v: exit %d\nstdout %s\nstderr %s", args, r.code, r.stdout, r.stderr)
		}
	}
	r = runCLI(ctx, "jobs", "list", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "127.0.0.1:5432") {
		t.Errorf("jobs list --help does not name the default database:\n%s", r.stdout)
	}
}

// jobs list --tag keeps the tagged jobs; --unknown-kinds the waiting jobs no live worker
// of their queue has a handler for; stats counts the latter.
func TestJobsListTagAndUnknownKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	red := b.enqueue(t, "noop", "--tag", "red", "--tag", "big")
	b.enqueue(t, "noop", "--tag", "blue")
	ghost := b.enqueue(t, "ghost", "--allow-unknown-kind")
	var got []queue.JobRow
	b.okJSON(t, &got, "jobs", "list", "--tag", "red")
	if len(got) != 1 || got[0].ID != red.ID || strings.Join(got[0].Tags, ",") != "red,big" {
		t.Fatalf("jobs list --tag red: %+v", got)
	}
	if out := b.ok(t, "jobs", "show", strconv.FormatInt(red.ID, 10)); !strings.Contains(out, "red, big") {
		t.Errorf("show lists no tags:\n%s", out)
	}
	oneErrorLine(t, b.run(t, "jobs", "list", "--tag", "no spaces"), `invalid --tag: "no spaces"`)
	oneErrorLine(t, b.run(t, "enqueue", "noop", "--tag", "-x"), "invalid tags")

	if err := store.RegisterWorker(b.ctx, b.db.Pool, "w", "h", 1, []string{"default"}, []string{"noop"}); err != nil {
		t.Fatal(err)
	}
	b.okJSON(t, &got, "jobs", "list", "--unknown-kinds")
	if len(got) != 1 || got[0].ID != ghost.ID {
		t.Fatalf("jobs list --unknown-kinds: %+v, want the ghost job", got)
	}
	var st struct {
		UnknownKinds int64 `json:"unknown_kind_jobs"`
	}
	b.okJSON(t, &st, "stats")
	if st.UnknownKinds != 1 {
		t.Fatalf("stats: %d jobs of unknown kinds, want 1", st.UnknownKinds)
	}
	if out := b.ok(t, "stats"); !strings.Contains(out, "jobs no live worker can run") {
		t.Errorf("stats text:\n%s", out)
	}
}

// jobs show displays the output a job's completion recorded, and "-" before it has any.
func TestJobsShowOutput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.enqueue(t, "noop")
	id := strconv.FormatInt(j.ID, 10)
	if out := b.ok(t, "jobs", "show", id); !strings.Contains(out, "output:") || !strings.Contains(out, "-") {
		t.Errorf("show before completion lacks an empty output line:\n%s", out)
	}
	claimed, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "default", WorkerID: "w", Limit: 1, Lease: time.Minute})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %d jobs, %v", len(claimed), err)
	}
	if err := store.CompleteWithOutput(b.ctx, b.db.Pool, store.LeaseOf(claimed[0]), []byte(`{"invoice_id": 42}`)); err != nil {
		t.Fatal(err)
	}
	out := b.ok(t, "jobs", "show", id)
	if !strings.Contains(out, `{"invoice_id": 42}`) {
		t.Errorf("show lacks the output:\n%s", out)
	}
	var shown struct {
		Output map[string]int `json:"output"`
	}
	b.okJSON(t, &shown, "jobs", "show", id)
	if len(shown.Output) != 1 || shown.Output["invoice_id"] != 42 {
		t.Errorf("show --json: output %v, want invoice_id 42", shown.Output)
	}
}

// Bulk actions by filter: they refuse without --yes when nobody can answer, act in
// batches with --yes, and every changed job names the action in `jobs show`.
func TestJobsBulkByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mails []queue.JobRow
	for i := range 3 {
		mails = append(mails, b.enqueue(t, "noop", "--args", fmt.Sprintf(`{"to": "m%d@example.com", "batch": 7}`, i), "--queue", "mail"))
	}
	other := b.enqueue(t, "noop")

	r := b.run(t, "jobs", "cancel", "--queue", "mail")
	oneErrorLine(t, r, "3 jobs match; refusing to cancel them without confirmation: stdin is not a terminal, pass --yes")
	if r.code != 2 {
		t.Errorf("exit %d, want 2", r.code)
	}
	oneErrorLine(t, b.run(t, "jobs", "cancel"), "needs a job ID or at least one filter flag")
	oneErrorLine(t, b.run(t, "jobs", "cancel", "1", "--queue", "mail"), "give a job ID or filter flags, not both (--queue)")
	oneErrorLine(t, b.run(t, "jobs", "cancel", "--args", "[1]", "--yes"), "invalid --args")
	oneErrorLine(t, b.run(t, "jobs", "list", "--created-after", "yesterday"), "invalid --created-after")
	var listed []queue.JobRow
	b.okJSON(t, &listed, "jobs", "list", "--args", `{"batch": 7}`)
	if len(listed) != 3 {
		t.Fatalf("jobs list --args: %d jobs, want 3", len(listed))
	}

	var res struct {
		Matched int     `json:"matched"`
		Changed []int64 `json:"changed"`
		Batches int     `json:"batches"`
	}
	b.okJSON(t, &res, "jobs", "cancel", "--args", `{"batch": 7}`, "--yes", "--batch-size", "2")
	if res.Matched != 3 || len(res.Changed) != 3 || res.Batches != 2 {
		t.Fatalf("bulk cancel: %+v", res)
	}
	var shown struct {
		State queue.State         `json:"state"`
		Audit []queue.AuditRecord `json:"audit"`
	}
	b.okJSON(t, &shown, "jobs", "show", strconv.FormatInt(mails[0].ID, 10))
	if shown.State != queue.StateCancelled || len(shown.Audit) != 1 || shown.Audit[0].Action != queue.AuditCancel ||
		!strings.HasPrefix(shown.Audit[0].Actor, "cli") || shown.Audit[0].Filter == nil {
		t.Fatalf("job %d after the bulk cancel: %+v", mails[0].ID, shown)
	}
	if out := b.ok(t, "jobs", "show", strconv.FormatInt(mails[0].ID, 10)); !strings.Contains(out, "operator actions:") {
		t.Errorf("show lists no operator actions:\n%s", out)
	}
	b.okJSON(t, &shown, "jobs", "show", strconv.FormatInt(other.ID, 10))
	if shown.State != queue.StateAvailable || len(shown.Audit) != 0 {
		t.Fatalf("a job of another queue after the bulk cancel: %+v", shown)
	}
	// Delete the cancelled ones by state; the available job stays.
	b.okJSON(t, &res, "jobs", "delete", "--state", "cancelled", "--yes")
	if len(res.Changed) != 3 || countJobs(t, b) != 1 {
		t.Fatalf("bulk delete: %+v, %d jobs left", res, countJobs(t, b))
	}
}
