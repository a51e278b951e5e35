package fenceqweb

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
)

type wfArgs struct{}

func (wfArgs) Kind() string { return "wf_task" }

// The Workflows page lists workflows and batches; a workflow's page shows its tasks,
// their states and dependencies; a task's job page links to its workflow.
func TestWorkflowPages(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "workflows are refused on a Citus distributed schema")
	b := setup(t)
	wf := fenceq.NewWorkflow("nightly-etl").Add("extract", wfArgs{}, nil).
		Add("load", wfArgs{}, &fenceq.TaskOpts{After: []string{"extract"}, Tolerate: []string{"extract"}})
	res, err := wf.Enqueue(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := fenceq.NewBatch("mailing", wfArgs{}, nil).Add(wfArgs{}, nil).Enqueue(b.ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "workflows", b.page(t, "/workflows"), "nightly-etl", "mailing", "batch",
		fmt.Sprintf(`href="./workflows/%d"`, res.ID), fmt.Sprintf(`href="./workflows/%d"`, batch.ID), ">pending<")
	mustContain(t, "workflow", b.page(t, fmt.Sprintf("/workflows/%d", res.ID)), "nightly-etl", "extract", "load",
		"(tolerated)", fmt.Sprintf(`href="../jobs/%d"`, res.Jobs["extract"]), "1 left")
	mustContain(t, "job", b.page(t, fmt.Sprintf("/jobs/%d", res.Jobs["load"])),
		fmt.Sprintf(`href="../workflows/%d"`, res.ID))
	mustContain(t, "job's workflow", b.page(t, fmt.Sprintf("/jobs/%d/workflow", batch.CallbackID)), "Batch", "mailing", "callback")
	for path, want := range map[string]int{"/workflows/999": http.StatusNotFound, "/workflows/x": http.StatusNotFound,
		fmt.Sprintf("/jobs/%d/workflow", 999): http.StatusNotFound, "/workflows?before=x": http.StatusBadRequest} {
		if r := b.get(t, path); r.status != want {
			t.Errorf("GET %s: %d, want %d", path, r.status, want)
		}
	}
}
