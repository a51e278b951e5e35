package fenceqweb

import (
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/queue"
)

func ptr[T any](v T) *T { return &v }

func TestBuildTimelineDerivesGenerations(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	// A claims (1), fails; B claims (2), the reaper revokes it (3 is the fence); C claims
	// (4) and is cancelled by an operator while running (5 is the fence); a retry makes
	// it available and D claims (6) and runs now. B's late write is rejected.
	j := &queue.JobRow{ID: 9, State: queue.StateRunning, LeaseGen: 6, Attempt: 4, MaxAttempts: 25,
		LeasedBy: ptr("worker-d"), AttemptedAt: ptr(at(100)), HeartbeatAt: ptr(at(110)), LeaseExpiresAt: ptr(at(170)),
		Errors: []queue.AttemptError{
			{At: at(10), Attempt: 1, LeaseGen: 1, Worker: "worker-a", Error: "tax api: 503", Trace: "goroutine 1"},
			{At: at(40), Attempt: 2, LeaseGen: 2, Worker: "worker-b", Error: "lease expired (last heartbeat 2026-10-01 12:00:20.5+00)"},
			{At: at(60), Attempt: 3, LeaseGen: 4, Error: "cancelled by operator"},
		}}
	events := []queue.LeaseEvent{
		{LeaseGen: 2, WorkerID: ptr("worker-b"), Kind: queue.EventRevoked, Detail: ptr("lease expired; now available"), At: at(40)},
		{LeaseGen: 2, WorkerID: ptr("worker-b"), Kind: queue.EventExpiredHolderAlive, At: at(40)},
		{LeaseGen: 2, WorkerID: ptr("worker-b"), Kind: queue.EventStaleWriteRejected, Detail: ptr("complete"), At: at(45)},
		{LeaseGen: 4, WorkerID: ptr("worker-c"), Kind: queue.EventRevoked, Detail: ptr("cancelled by operator"), At: at(60)},
	}
	tl := buildTimeline(j, events)
	if len(tl.Generations) != 6 || tl.Held() != 4 || tl.Revocations != 2 || tl.StaleWrites != 1 {
		t.Fatalf("%d generations, %d held, %d revocations, %d stale writes; want 6, 4, 2, 1",
			len(tl.Generations), tl.Held(), tl.Revocations, tl.StaleWrites)
	}
	want := []struct {
		holder, class string
		fence         bool
	}{
		{"worker-a", "failed", false},
		{"worker-b", "revoked", false},
		{"", "fence", true},
		{"worker-c", "revoked", false},
		{"", "fence", true},
		{"worker-d", "held", false},
	}
	for i, w := range want {
		g := tl.Generations[i]
		if g.Gen != int64(i+1) || g.Holder != w.holder || g.Outcome.Class != w.class || g.Fence != w.fence {
			t.Errorf("gen %d: holder %q outcome %q fence %v; want %q %q %v", g.Gen, g.Holder, g.Outcome.Class, g.Fence,
				w.holder, w.class, w.fence)
		}
	}
	b := tl.Generations[1]
	// The reaper's record of the expired lease gives its last heartbeat.
	if b.Heartbeat == nil || !b.Heartbeat.Equal(at(20).Add(500*time.Millisecond)) {
		t.Errorf("gen 2 last heartbeat %v; want %v from the reaper's record", b.Heartbeat, at(20).Add(500*time.Millisecond))
	}
	if !b.HolderAlive || b.StaleWrites != 1 || !strings.Contains(b.Outcome.Text, "lease expired") {
		t.Errorf("gen 2: alive %v, stale %d, outcome %q", b.HolderAlive, b.StaleWrites, b.Outcome.Text)
	}
	d := tl.Generations[5]
	if !d.Current || d.ClaimedAt == nil || !d.ClaimedAt.Equal(at(100)) || d.Expires == nil || d.Attempt != 4 {
		t.Errorf("gen 6: current %v claimed %v expires %v attempt %d", d.Current, d.ClaimedAt, d.Expires, d.Attempt)
	}
	// Only the latest claim has the row's times; earlier ones are not recorded.
	if tl.Generations[0].ClaimedAt != nil || tl.Generations[0].Attempt != 1 {
		t.Errorf("gen 1: claimed %v attempt %d", tl.Generations[0].ClaimedAt, tl.Generations[0].Attempt)
	}
	// Entries are in time order, with the trace of the failure.
	a := tl.Generations[0].Entries
	if len(a) != 1 || a[0].Trace != "goroutine 1" || a[0].Class != "failed" {
		t.Errorf("gen 1 entries: %+v", a)
	}
	for _, g := range tl.Generations {
		for i := 1; i < len(g.Entries); i++ {
			if g.Entries[i].At.Before(g.Entries[i-1].At) {
				t.Errorf("gen %d entries out of order", g.Gen)
			}
		}
	}
}

func TestBuildTimelineOutcomesOfFinishedJobs(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name  string
		job   queue.JobRow
		class string
		text  string
	}{
		{"never claimed", queue.JobRow{State: queue.StateAvailable}, "", ""},
		{"completed", queue.JobRow{State: queue.StateCompleted, LeaseGen: 1, LeasedBy: ptr("w"), FinishedAt: &t0}, "completed", "completed"},
		{"discarded", queue.JobRow{State: queue.StateDiscarded, LeaseGen: 1, FinishedAt: &t0,
			Errors: []queue.AttemptError{{At: t0, LeaseGen: 1, Worker: "w", Error: "bad input"}}}, "failed", "no attempts left"},
		{"cancelled by its handler", queue.JobRow{State: queue.StateCancelled, LeaseGen: 1, FinishedAt: &t0,
			Errors: []queue.AttemptError{{At: t0, LeaseGen: 1, Worker: "w", Error: "customer gone"}}}, "cancelled", "by the handler"},
		{"failed, then cancelled while waiting", queue.JobRow{State: queue.StateCancelled, LeaseGen: 1, FinishedAt: &t0,
			Errors: []queue.AttemptError{{At: t0, LeaseGen: 1, Worker: "w", Error: "timeout"},
				{At: t0.Add(time.Minute), LeaseGen: 1, Error: "cancelled by operator"}}}, "failed", "failed: timeout"},
		{"snoozed", queue.JobRow{State: queue.StateScheduled, LeaseGen: 1}, "released", "snoozed"},
	} {
		tl := buildTimeline(&c.job, nil)
		if c.class == "" {
			if len(tl.Generations) != 0 {
				t.Errorf("%s: %d generations", c.name, len(tl.Generations))
			}
			continue
		}
		o := tl.Generations[len(tl.Generations)-1].Outcome
		if o.Class != c.class || !strings.Contains(o.Text, c.text) {
			t.Errorf("%s: outcome %q %q; want %q containing %q", c.name, o.Class, o.Text, c.class, c.text)
		}
	}
}

func TestChartGeometry(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	tp := &queue.Throughput{Bucket: time.Minute}
	for i := range 60 {
		b := queue.ThroughputBucket{Start: start.Add(time.Duration(i) * time.Minute)}
		if i == 59 {
			b.Completed, b.Discarded, b.Failed = 30, 10, 5
		}
		tp.Buckets = append(tp.Buckets, b)
	}
	c := buildChart(tp, time.UTC)
	if c.Completed != 30 || c.Discarded != 10 || c.Failed != 5 {
		t.Fatalf("totals %d %d %d", c.Completed, c.Discarded, c.Failed)
	}
	var completed, discarded, failed *chartShape
	for i := range c.Bars {
		switch c.Bars[i].Class {
		case "bar-completed":
			completed = &c.Bars[i]
		case "bar-discarded":
			discarded = &c.Bars[i]
		case "bar-failed":
			failed = &c.Bars[i]
		}
	}
	if completed == nil || discarded == nil || failed == nil {
		t.Fatalf("bars: %+v", c.Bars)
	}
	// 40 finished on a scale topping at 40: the stack fills the upper area exactly,
	// discarded on top of completed; the failures hang below the axis.
	if completed.H+discarded.H != chartUpper || discarded.Y+discarded.H != completed.Y {
		t.Errorf("stack: completed %+v discarded %+v", completed, discarded)
	}
	if failed.H != chartLower*5/6 || failed.Y <= completed.Y+completed.H { // 5 on a scale of 6
		t.Errorf("failed bar %+v must hang below the axis", failed)
	}
	if !strings.Contains(completed.Title, "12:59: 30 completed, 10 discarded, 0 cancelled, 5 failed attempts") {
		t.Errorf("tooltip %q", completed.Title)
	}
	var labels []string
	for _, l := range c.Labels {
		if l.Class == "chart-x" {
			labels = append(labels, l.Text)
		}
	}
	if strings.Join(labels, " ") != "12:00 12:10 12:20 12:30 12:40 12:50" {
		t.Errorf("x labels %v", labels)
	}
	for n, want := range map[int64]int64{0: 2, 1: 2, 3: 4, 7: 8, 9: 10, 40: 40, 41: 50, 196: 200, 999: 1000} {
		if got := niceCeil(n); got != want {
			t.Errorf("niceCeil(%d) = %d; want %d", n, got, want)
		}
	}
	for _, k := range queue.LeaseEventKinds() {
		if eventLabels[k] == "" {
			t.Errorf("lease event kind %s has no label", k)
		}
	}
}
