package cli_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

// A workflow enqueued from a file is listed and shown with its tasks' states and
// dependencies, in text and JSON; bad files are usage errors naming the task.
func TestWorkflowsEnqueueListShow(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "workflows are refused on a Citus distributed schema")
	b := setup(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("wf.json", `{"name": "nightly", "tasks": [
		{"name": "fetch", "kind": "noop"},
		{"name": "a", "kind": "noop", "after": ["fetch"]},
		{"name": "b", "kind": "noop", "after": ["fetch"], "queue": "other"},
		{"name": "join", "kind": "noop", "after": ["a", "b"], "tolerate": ["b"]}]}`)
	var res fenceq.WorkflowResult
	b.okJSON(t, &res, "workflows", "enqueue", "--file", good)
	if res.ID == 0 || len(res.Jobs) != 4 {
		t.Fatalf("enqueue: %+v", res)
	}
	id := strconv.FormatInt(res.ID, 10)
	var wfs []queue.Workflow
	b.okJSON(t, &wfs, "workflows", "list")
	if len(wfs) != 1 || wfs[0].Name != "nightly" || wfs[0].States[queue.StatePending] != 3 || wfs[0].States[queue.StateAvailable] != 1 {
		t.Fatalf("list: %+v", wfs)
	}
	var wf queue.Workflow
	b.okJSON(t, &wf, "workflows", "show", id)
	if len(wf.Tasks) != 4 {
		t.Fatalf("show: %+v", wf)
	}
	for _, task := range wf.Tasks {
		if task.Name == "join" && (len(task.DependsOn) != 2 || task.DependsOn[1].Task != "b" || !task.DependsOn[1].Tolerate) {
			t.Fatalf("join's dependencies: %+v", task.DependsOn)
		}
	}
	out := b.ok(t, "workflows", "show", id)
	for _, want := range []string{"nightly", "join", "a, b (tolerated)", "pending"} {
		if !strings.Contains(out, want) {
			t.Errorf("show's text lacks %q:\n%s", want, out)
		}
	}
	if out := b.ok(t, "workflows", "list"); !strings.Contains(out, "3 pending") {
		t.Errorf("list's text: %s", out)
	}

	for _, c := range []struct{ body, want string }{
		{`{"name": "w", "tasks": [{"name": "a", "kind": "noop", "after": ["zz"]}]}`, `task a: invalid after: no task named "zz"`},
		{`{"name": "w", "tasks": [{"name": "a", "kind": "noop", "after": ["b"]}, {"name": "b", "kind": "noop", "after": ["a"]}]}`, "form a cycle"},
		{`{"name": "w", "tasks": [{"name": "a", "kind": "noop", "bogus": 1}]}`, `unknown field "bogus"`},
		{`{"name": "w", "tasks": [{"name": "a", "kind": "nope"}]}`, `unknown kind "nope"`},
	} {
		r := b.run(t, "workflows", "enqueue", "--file", write("bad.json", c.body))
		oneErrorLine(t, r, c.want)
		if r.code != 2 {
			t.Errorf("%s: exit %d, want 2 (usage)", c.want, r.code)
		}
	}
	oneErrorLine(t, b.run(t, "workflows", "show", "999"), "workflow 999 not found")
	var again []queue.Workflow
	b.okJSON(t, &again, "workflows", "list")
	if len(again) != 1 {
		t.Fatalf("refused files wrote workflows: %+v", again)
	}
}

// `jobs signal` sends a signal once: kept for a job that does not wait, a duplicate the
// second time; a finished or missing job is refused.
func TestJobsSignal(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "signals are refused on a Citus distributed schema")
	b := setup(t)
	j := b.enqueue(t, "noop")
	id := strconv.FormatInt(j.ID, 10)
	var r struct {
		Result queue.SignalResult `json:"result"`
	}
	b.okJSON(t, &r, "jobs", "signal", id, "go", "--payload", `{"ok": true}`)
	if r.Result != queue.SignalKept {
		t.Fatalf("first send: %s, want kept", r.Result)
	}
	if out := b.ok(t, "jobs", "signal", id, "go"); !strings.Contains(out, "already sent") {
		t.Fatalf("second send: %s", out)
	}
	oneErrorLine(t, b.run(t, "jobs", "signal", id, "bad name"), "invalid NAME")
	oneErrorLine(t, b.run(t, "jobs", "signal", id, "x", "--payload", "{"), "invalid --payload")
	oneErrorLine(t, b.run(t, "jobs", "signal", "999", "x"), "job 999 not found")
	b.ok(t, "jobs", "cancel", id)
	oneErrorLine(t, b.run(t, "jobs", "signal", id, "other"), "a finished job takes no signal")
}
