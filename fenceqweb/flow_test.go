package fenceqweb

import (
	"fmt"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// claimFlow claims up to n jobs under flow limits from queue q as worker w.
func (b *testBundle) claimFlow(t *testing.T, q, w string, n int) []*queue.JobRow {
	t.Helper()
	got, _, err := store.ClaimFlow(b.ctx, b.db.Pool, store.ClaimFlowParams{WorkerID: w, Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: q, Limit: n}}})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// The flow page lists the limits and their busiest partitions (running against the
// maximum, a sequence's holder linked to its job, a rate's next start, the waiting
// jobs); a job's page shows its flow key and its partition's state. Names and keys are
// escaped.
func TestFlowPageAndJobFlowPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mustContain(t, "empty flow page", b.page(t, "/flow"), "Flow limits", "No flow limit is set")
	for _, l := range []queue.FlowLimit{{Name: "cust", MaxRunning: 2}, {Name: "ledger", Sequence: true, HoldOnDiscard: true},
		{Name: "smtp", Rate: 1, Per: time.Hour}} {
		if err := store.SetFlowLimit(b.ctx, b.db.Pool, l); err != nil {
			t.Fatal(err)
		}
	}
	b.insert(t, store.InsertParams{Queue: "q", FlowKey: "cust:<acme>"})
	b.insert(t, store.InsertParams{Queue: "q", FlowKey: "cust:<acme>"})
	b.insert(t, store.InsertParams{Queue: "q", FlowKey: "cust:<acme>"})
	head := b.insert(t, store.InsertParams{Queue: "q", FlowKey: "ledger:acct-1"})
	next := b.insert(t, store.InsertParams{Queue: "q", FlowKey: "ledger:acct-1"})
	b.insert(t, store.InsertParams{Queue: "q", FlowKey: "smtp:example.com"})
	mail := b.insert(t, store.InsertParams{Queue: "q", FlowKey: "smtp:example.com"})
	plain := b.insert(t, store.InsertParams{Queue: "q"})
	// cust takes two, ledger its head, smtp one (its rate's hour is then full).
	if got := b.claimFlow(t, "q", "w1", 10); len(got) != 4 {
		t.Fatalf("claimed %d jobs under limits, want 4", len(got))
	}

	body := b.page(t, "/flow")
	mustContain(t, "flow page", body,
		"cust", "ledger", "smtp", "1 per 1h0m0s", "a discarded job holds it",
		// The busiest first, its name escaped.
		"cust:&lt;acme&gt;", "2 / 2",
		// The sequence's holder, linked.
		fmt.Sprintf(`href="./jobs/%d">job %d</a>`, head.ID, head.ID), "ledger:acct-1",
		"smtp:example.com")
	mustNotContain(t, "flow page", body, "cust:<acme>")

	// A job under the rate limit: its partition's next start is ahead, an hour after the
	// start that filled it.
	var started time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT starts[1] FROM fenceq_flow_keys WHERE key = 'smtp:example.com'`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	jp := b.page(t, fmt.Sprintf("/jobs/%d", mail.ID))
	mustContain(t, "rate-limited job", jp, "flow key", `href="../flow">smtp:example.com</a>`,
		"1 running, 1 waiting; next start "+b.h.clockAt(time.Now()).At(started.Add(time.Hour)))
	// A job waiting behind a sequence's head names the head.
	jp = b.page(t, fmt.Sprintf("/jobs/%d", next.ID))
	mustContain(t, "sequenced job", jp, "1 / 1 running", fmt.Sprintf(`held by <a href="../jobs/%d">job %d</a>`, head.ID, head.ID))
	// A job under no limit shows none.
	mustNotContain(t, "plain job", b.page(t, fmt.Sprintf("/jobs/%d", plain.ID)), "flow key", "flow partition")
}
