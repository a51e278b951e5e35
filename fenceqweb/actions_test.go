package fenceqweb

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

func (b *testBundle) queuePaused(t *testing.T, name string) bool {
	t.Helper()
	var paused bool
	err := b.db.Pool.QueryRow(b.ctx, `SELECT COALESCE((SELECT paused FROM fenceq_queues WHERE name = $1), false)`, name).Scan(&paused)
	if err != nil {
		t.Fatal(err)
	}
	return paused
}

func wantRedirect(t *testing.T, what string, r response, location string) {
	t.Helper()
	if r.status != http.StatusSeeOther || r.header.Get("Location") != location {
		t.Fatalf("%s: %d Location %q; want 303 to %q\n%s", what, r.status, r.header.Get("Location"), location, r.body)
	}
}

func TestRetryJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Kind: "boom", MaxAttempts: 1})
	c := b.claim(t, "default", "w1", time.Minute)
	if st, err := store.Fail(b.ctx, b.db.Pool, store.LeaseOf(c), store.FailParams{Err: "boom"}); err != nil || st != queue.StateDiscarded {
		t.Fatalf("fail: %s %v", st, err)
	}
	page := fmt.Sprintf("/jobs/%d", c.ID)
	r := b.act(t, page, page+"/retry")
	// The redirect is relative to the action's URL: ../../jobs/ID is the job's page.
	wantRedirect(t, "retry", r, fmt.Sprintf("../../jobs/%d?flash=retried", c.ID))
	if j := b.job(t, c.ID); j.State != queue.StateAvailable || j.FinishedAt != nil {
		t.Fatalf("after retry the job is %s; want available", j.State)
	}
	mustContain(t, "flash", b.page(t, page+"?flash=retried"), "Job retried")

	// A running job cannot be retried: 409 with the engine's reason and a hint, unchanged.
	run := b.claim(t, "default", "w2", time.Minute)
	r = b.act(t, fmt.Sprintf("/jobs/%d", run.ID), fmt.Sprintf("/jobs/%d/retry", run.ID))
	if r.status != http.StatusConflict || !strings.Contains(r.body, "it is running") || !strings.Contains(r.body, "requeue") {
		t.Fatalf("retry of a running job: %d\n%s", r.status, r.body)
	}
	if j := b.job(t, run.ID); j.State != queue.StateRunning || j.LeaseGen != run.LeaseGen {
		t.Fatalf("refused retry changed the job: %s gen %d", j.State, j.LeaseGen)
	}
}

func TestCancelRunningJobAsksThenRevokesTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Kind: "long"})
	c := b.claim(t, "default", "worker-x", time.Minute)
	page := fmt.Sprintf("/jobs/%d", c.ID)
	// The first POST is the confirmation step: nothing changes yet.
	r := b.act(t, page, page+"/cancel")
	if r.status != http.StatusOK {
		t.Fatalf("cancel without confirmation: %d\n%s", r.status, r.body)
	}
	mustContain(t, "confirmation", r.body, "Cancel job", "worker-x", "generation 1 → 2", `name="confirm" value="yes"`,
		fmt.Sprintf(`action="../../jobs/%d/cancel"`, c.ID))
	if j := b.job(t, c.ID); j.State != queue.StateRunning {
		t.Fatalf("the confirmation step changed the job: %s", j.State)
	}
	r = b.act(t, page, page+"/cancel", "confirm", "yes")
	wantRedirect(t, "cancel", r, fmt.Sprintf("../../jobs/%d?flash=cancelled", c.ID))
	j := b.job(t, c.ID)
	if j.State != queue.StateCancelled || j.LeaseGen != c.LeaseGen+1 {
		t.Fatalf("after cancel: %s gen %d; want cancelled gen %d", j.State, j.LeaseGen, c.LeaseGen+1)
	}
	if b.eventKinds(t, c.ID)[queue.EventRevoked] != 1 {
		t.Fatal("cancelling a running job recorded no revocation")
	}
	// The revoked holder can write nothing.
	if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(c)); err == nil {
		t.Fatal("the revoked holder completed the job")
	}
}

func TestRequeueRunningJobRevokesTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Kind: "long"})
	c := b.claim(t, "default", "worker-y", time.Minute)
	page := fmt.Sprintf("/jobs/%d", c.ID)
	r := b.act(t, page, page+"/requeue")
	mustContain(t, "confirmation", r.body, "Requeue job", "may happen twice")
	if j := b.job(t, c.ID); j.State != queue.StateRunning {
		t.Fatalf("the confirmation step changed the job: %s", j.State)
	}
	r = b.act(t, page, page+"/requeue", "confirm", "yes")
	wantRedirect(t, "requeue", r, fmt.Sprintf("../../jobs/%d?flash=requeued", c.ID))
	j := b.job(t, c.ID)
	if j.State != queue.StateAvailable || j.LeaseGen != c.LeaseGen+1 || j.LeasedBy != nil {
		t.Fatalf("after requeue: %s gen %d holder %v", j.State, j.LeaseGen, j.LeasedBy)
	}
	if b.eventKinds(t, c.ID)[queue.EventRevoked] != 1 {
		t.Fatal("requeueing a running job recorded no revocation")
	}
	body := b.page(t, page)
	mustContain(t, "timeline after requeue", body, "revoked: requeued by operator", "made by the revocation of generation 1")
}

func TestPauseAndResumeQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, store.InsertParams{Queue: "billing"})
	r := b.act(t, "/queues", "/queues/billing/pause")
	mustContain(t, "confirmation", r.body, "Pause queue billing?", `action="../../queues/billing/pause"`)
	if b.queuePaused(t, "billing") {
		t.Fatal("the confirmation step paused the queue")
	}
	r = b.act(t, "/queues", "/queues/billing/pause", "confirm", "yes")
	wantRedirect(t, "pause", r, "../../queues?flash=paused")
	if !b.queuePaused(t, "billing") {
		t.Fatal("the queue is not paused")
	}
	// Paused means no claim: the engine sees the same setting.
	if js, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "billing", WorkerID: "w", Limit: 1, Lease: time.Minute}); err != nil || len(js) != 0 {
		t.Fatalf("claimed %d jobs from the paused queue (%v)", len(js), err)
	}
	mustContain(t, "queues page", b.page(t, "/queues?flash=paused"), "Queue paused", ">Resume</button>")
	r = b.act(t, "/queues", "/queues/billing/resume")
	wantRedirect(t, "resume", r, "../../queues?flash=resumed")
	if b.queuePaused(t, "billing") {
		t.Fatal("the queue is still paused")
	}
	r = b.act(t, "/queues", "/queues/bad%20name/pause", "confirm", "yes")
	if r.status != http.StatusBadRequest {
		t.Fatalf("pause of an invalid queue name: %d", r.status)
	}
}

func TestRetryOutboxRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := outbox.Insert(b.ctx, tx, outbox.Message{Topic: "email", DedupeKey: "k:1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	// A pending row with a live delivery job cannot be retried.
	r := b.act(t, "/outbox", fmt.Sprintf("/outbox/%d/retry", res.ID))
	if r.status != http.StatusConflict {
		t.Fatalf("retry of a pending row: %d\n%s", r.status, r.body)
	}
	// Its delivery ended and it failed: retry makes it pending with a new delivery job.
	if _, err := store.CancelJob(b.ctx, b.db.Pool, res.DeliveryJobID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_outbox SET state = 'failed' WHERE id = $1`, res.ID); err != nil {
		t.Fatal(err)
	}
	r = b.act(t, "/outbox?state=failed", fmt.Sprintf("/outbox/%d/retry", res.ID))
	wantRedirect(t, "outbox retry", r, "../../outbox?state=pending&flash=outbox-retried")
	o, err := outbox.Get(b.ctx, b.db.Pool, res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if o.State != outbox.StatePending || o.DeliveryJobID == nil || *o.DeliveryJobID == res.DeliveryJobID {
		t.Fatalf("after retry: %s, delivery job %v (was %d)", o.State, o.DeliveryJobID, res.DeliveryJobID)
	}
}

// addSchedule defines a schedule as the CLI would.
func (b *testBundle) addSchedule(t *testing.T, name string) {
	t.Helper()
	if _, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: name, Spec: "@every 1h", Kind: "report",
		Source: queue.SourceCLI}); err != nil {
		t.Fatalf("add schedule %s: %v", name, err)
	}
}

func (b *testBundle) schedulePaused(t *testing.T, name string) bool {
	t.Helper()
	s, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, name)
	if err != nil {
		t.Fatal(err)
	}
	return s.Paused
}

// The periodic page lists a schedule with its slots; pause asks first, then pauses it
// for every worker; resume resumes; trigger asks, then enqueues one job outside the slots.
func TestPeriodicPauseResumeTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.addSchedule(t, "nightly-report")
	mustContain(t, "periodic page", b.page(t, "/periodic"), "nightly-report", "@every 1h", "report", "Pause…", "Run now…")

	r := b.act(t, "/periodic", "/periodic/nightly-report/pause")
	mustContain(t, "confirmation", r.body, "Pause schedule nightly-report?")
	if b.schedulePaused(t, "nightly-report") {
		t.Fatal("the confirmation step paused the schedule")
	}
	r = b.act(t, "/periodic", "/periodic/nightly-report/pause", "confirm", "yes")
	wantRedirect(t, "pause", r, "../../periodic?flash=periodic-paused")
	if !b.schedulePaused(t, "nightly-report") {
		t.Fatal("the schedule is not paused")
	}
	mustContain(t, "periodic page", b.page(t, "/periodic?flash=periodic-paused"), "Schedule paused", ">Resume</button>")
	r = b.act(t, "/periodic", "/periodic/nightly-report/resume")
	wantRedirect(t, "resume", r, "../../periodic?flash=periodic-resumed")
	if b.schedulePaused(t, "nightly-report") {
		t.Fatal("the schedule is still paused")
	}

	r = b.act(t, "/periodic", "/periodic/nightly-report/trigger")
	mustContain(t, "trigger confirmation", r.body, "Run schedule nightly-report now?")
	var jobs int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'report'`).Scan(&jobs); err != nil || jobs != 0 {
		t.Fatalf("jobs after the confirmation step: %d %v", jobs, err)
	}
	r = b.act(t, "/periodic", "/periodic/nightly-report/trigger", "confirm", "yes")
	var id int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT id FROM fenceq_jobs WHERE kind = 'report'
		AND metadata->'periodic'->>'triggered' = 'true'`).Scan(&id); err != nil {
		t.Fatalf("the triggered job: %v", err)
	}
	wantRedirect(t, "trigger", r, fmt.Sprintf("../../jobs/%d?flash=periodic-triggered", id))

	if r := b.act(t, "/periodic", "/periodic/no-such/pause", "confirm", "yes"); r.status != http.StatusNotFound {
		t.Fatalf("pause of an unknown schedule: %d, want 404", r.status)
	}
	if r := b.act(t, "/periodic", "/periodic/bad%20name/trigger", "confirm", "yes"); r.status != http.StatusBadRequest {
		t.Fatalf("trigger of an invalid name: %d, want 400", r.status)
	}
}
