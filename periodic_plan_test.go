package fenceq

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// TestPlanPass checks, on an "@every 1s" schedule, which slots a pass enqueues given
// the clock's heartbeat and the worker's start: the decisions the database tests
// observe from outside, here with exact instants, the catch-up bound included.
func TestPlanPass(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	hbAt := func(s float64) *time.Time { v := at(s); return &v }
	const grace = 10 * time.Second
	type slot struct {
		sec    float64
		missed bool
	}
	cases := []struct {
		name     string
		missed   queue.MissedPolicy
		onStart  bool
		last     float64
		now      float64
		hb       *time.Time
		started  float64 // 0: started long ago
		want     []slot
		wantTo   float64
		startJob bool
	}{
		{name: "steady", last: 0, now: 1.2, hb: hbAt(0.5), want: []slot{{1, false}}, wantTo: 1},
		{name: "hiccup within the grace is caught up", last: 0, now: 5.5, hb: hbAt(0.2),
			want: []slot{{1, false}, {2, false}, {3, false}, {4, false}, {5, false}}, wantTo: 5},
		{name: "outage, skip", missed: queue.MissedSkip, last: 0, now: 30.5, hb: hbAt(0.2), started: 30.1,
			want: []slot{{1, false}, {2, false}, {3, false}, {4, false}, {5, false}, {6, false}, {7, false},
				{8, false}, {9, false}, {10, false}}, wantTo: 30},
		{name: "outage, once", missed: queue.MissedOnce, last: 0, now: 30.5, hb: hbAt(0.2), started: 29.5,
			want: []slot{{1, false}, {2, false}, {3, false}, {4, false}, {5, false}, {6, false}, {7, false},
				{8, false}, {9, false}, {10, false}, {29, true}, {30, false}}, wantTo: 30},
		{name: "first start ever, run on start", onStart: true, last: -3.5, now: 0.3, hb: nil, started: 0.1,
			want: nil, wantTo: 0, startJob: true},
		{name: "slot right after the start", last: -3.5, now: 1.3, hb: nil, started: 0.1,
			want: []slot{{1, false}}, wantTo: 1},
		{name: "nothing due", last: 3, now: 3.9, hb: hbAt(3.5), want: nil, wantTo: 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			started := time.Time{}
			if c.started != 0 {
				started = at(c.started)
			}
			due := []store.DuePeriodic{{Name: "s", Spec: "@every 1s", Timezone: "UTC", Missed: c.missed,
				RunOnStart: c.onStart, LastSlot: at(c.last)}}
			plan := planPass(at(c.now), c.hb, started, grace, due, ParseSchedule)
			var got []slot
			to := at(c.last)
			for _, e := range plan.enqueues {
				to = e.To
				for _, m := range e.Metadata {
					var meta periodicMeta
					if err := json.Unmarshal([]byte(m), &meta); err != nil {
						t.Fatal(err)
					}
					s, _ := time.Parse(time.RFC3339, meta.Periodic.Slot)
					got = append(got, slot{s.Sub(t0).Seconds(), meta.Periodic.Missed})
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("enqueued %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("enqueued %v, want %v", got, c.want)
				}
			}
			if !to.Equal(at(c.wantTo)) {
				t.Fatalf("last_slot moves to %s, want %s", to, at(c.wantTo))
			}
			if (len(plan.onStart) == 1) != c.startJob {
				t.Fatalf("run-on-start jobs %v, want %v", plan.onStart, c.startJob)
			}
		})
	}

	// A hiccup longer than the bound (a huge grace): PeriodicMaxCatchUp slots, then the
	// rest is passed over by the policy.
	due := []store.DuePeriodic{{Name: "s", Spec: "@every 1s", Timezone: "UTC", Missed: queue.MissedOnce, LastSlot: t0}}
	plan := planPass(at(500.5), &t0, time.Time{}, time.Hour, due, ParseSchedule)
	e := plan.enqueues[0]
	if len(e.Metadata) != PeriodicMaxCatchUp+1 || !e.To.Equal(at(500)) || !plan.passedOver["s"].capped {
		t.Fatalf("capped pass: %d jobs, to %s, passed over %+v", len(e.Metadata), e.To, plan.passedOver)
	}
}
