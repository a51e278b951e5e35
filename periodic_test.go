package fenceq_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// TickArgs are the args of the periodic jobs in these tests. Their queue is served by
// no worker, so every job a schedule enqueues stays available to be counted.
type TickArgs struct {
	N int `json:"n"`
}

func (TickArgs) Kind() string { return "tick" }

const tickQueue = "ticks"

type periodicBundle struct {
	db  *fenceqtest.DB
	ctx context.Context
	hs  *fenceq.Handlers
}

func setupPeriodic(t *testing.T) *periodicBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[TickArgs]) error { return nil }, nil)
	return &periodicBundle{db: fenceqtest.New(t, &fenceqtest.Options{MaxConns: 12}), ctx: ctx, hs: hs}
}

// config is a worker config that serves the default queue (not the ticks').
func (b *periodicBundle) config(id string, periodic ...*fenceq.PeriodicJob) fenceq.Config {
	return fenceq.Config{Handlers: b.hs, ID: id, Periodic: periodic, PollInterval: 50 * time.Millisecond,
		Logger: fenceqtest.QuietLogger()}
}

func (b *periodicBundle) start(t *testing.T, pool *pgxpool.Pool, cfg fenceq.Config) *fenceq.Worker {
	t.Helper()
	w, err := fenceq.NewWorker(pool, cfg)
	if err != nil {
		t.Fatalf("new worker: %v", err)
	}
	if err := w.Start(b.ctx); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := w.Stop(ctx); err != nil {
				t.Errorf("stop worker: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return w
}

func stopWorker(t *testing.T, w *fenceq.Worker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatalf("stop worker: %v", err)
	}
}

// origin is the periodic metadata of one job.
type origin struct {
	JobID      int64
	Name       string `json:"name"`
	Slot       string `json:"slot"`
	Missed     bool   `json:"missed"`
	RunOnStart bool   `json:"run_on_start"`
	Triggered  bool   `json:"triggered"`
	At         string `json:"at"`
}

func (o origin) slot(t *testing.T) time.Time {
	t.Helper()
	s, err := time.Parse(time.RFC3339, o.Slot)
	if err != nil {
		t.Fatalf("job %d: slot %q is not RFC 3339: %v", o.JobID, o.Slot, err)
	}
	return s
}

// origins returns the periodic metadata of every job of the schedule, by job id.
func origins(t *testing.T, ctx context.Context, db queue.DBTX, name string) []origin {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT id, metadata->'periodic' FROM fenceq_jobs
		WHERE metadata->'periodic'->>'name' = $1 ORDER BY id`, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []origin
	for rows.Next() {
		var id int64
		var raw []byte
		if err := rows.Scan(&id, &raw); err != nil {
			t.Fatal(err)
		}
		var o origin
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatalf("job %d: metadata %s: %v", id, raw, err)
		}
		o.JobID = id
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// slots returns the slots of the jobs enqueued for slots (not triggered or run on start).
func slotsOf(t *testing.T, os []origin) []time.Time {
	t.Helper()
	var out []time.Time
	for _, o := range os {
		if o.Slot != "" {
			out = append(out, o.slot(t))
		}
	}
	return out
}

// requireConsecutiveSeconds fails unless slots are unique, whole seconds, and each one
// second after the one before.
func requireConsecutiveSeconds(t *testing.T, slots []time.Time) {
	t.Helper()
	for i := 1; i < len(slots); i++ {
		if d := slots[i].Sub(slots[i-1]); d != time.Second {
			t.Fatalf("slot %d is %s after slot %d (%s then %s); want every second exactly once, in order",
				i+1, d, i, slots[i-1].Format(time.RFC3339), slots[i].Format(time.RFC3339))
		}
	}
}

func dbNow(t *testing.T, ctx context.Context, db queue.DBTX) time.Time {
	t.Helper()
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// waitDBTime waits until the database's clock passes at.
func waitDBTime(t *testing.T, ctx context.Context, db queue.DBTX, at time.Time, within time.Duration) {
	t.Helper()
	fenceqtest.WaitFor(t, "the database's clock to pass "+at.Format(time.RFC3339Nano), within, func() bool {
		return dbNow(t, ctx, db).After(at)
	})
}

func heartbeat(t *testing.T, ctx context.Context, db queue.DBTX) time.Time {
	t.Helper()
	c, err := store.ReadPeriodicClock(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if c.HeartbeatAt == nil {
		t.Fatal("no scheduling pass completed")
	}
	return *c.HeartbeatAt
}

// TestPeriodicWorkersShareSlots: three workers, each with its own pool, define the same
// schedule; every slot is enqueued exactly once, with no gap, and its job says which
// schedule and slot it is for.
func TestPeriodicWorkersShareSlots(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	obs := &countingObserver{}
	pj := fenceq.NewPeriodicJob("every-second", "@every 1s", TickArgs{N: 7}, &fenceq.PeriodicOpts{Queue: tickQueue})
	for _, id := range []string{"w1", "w2", "w3"} {
		cfg := b.config(id, pj)
		cfg.Hooks = []fenceq.Hook{obs}
		b.start(t, b.db.NewPool(t, 4), cfg)
	}
	fenceqtest.WaitFor(t, "five slots", 30*time.Second, func() bool {
		return len(origins(t, b.ctx, b.db.Pool, "every-second")) >= 5
	})
	os := origins(t, b.ctx, b.db.Pool, "every-second")
	slots := slotsOf(t, os)
	if len(slots) != len(os) {
		t.Fatalf("jobs %+v: some have no slot", os)
	}
	requireConsecutiveSeconds(t, slots)
	var job queue.JobRow
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT kind, queue, args::text FROM fenceq_jobs WHERE id = $1`, os[0].JobID).
		Scan(&job.Kind, &job.Queue, &job.EncodedArgs); err != nil {
		t.Fatal(err)
	}
	if job.Kind != "tick" || job.Queue != tickQueue || string(job.EncodedArgs) != `{"n": 7}` {
		t.Fatalf("job = %s in %s with %s; want tick in %s with {\"n\": 7}", job.Kind, job.Queue, job.EncodedArgs, tickQueue)
	}
	rows, err := store.ListPeriodic(b.ctx, b.db.Pool)
	if err != nil || len(rows) != 1 {
		t.Fatalf("list: %v %v", rows, err)
	}
	if rows[0].Source != queue.SourceCode || rows[0].LastEnqueuedSlot == nil ||
		rows[0].LastEnqueuedSlot.Before(slots[len(slots)-1]) {
		t.Fatalf("row = %+v; want source code and a last enqueued slot at or after %s", rows[0], slots[len(slots)-1])
	}
	n := len(origins(t, b.ctx, b.db.Pool, "every-second"))
	if got := obs.periodic(); got < len(slots) || got > n {
		t.Fatalf("observer counted %d enqueued; want between %d and %d", got, len(slots), n)
	}
}

type countingObserver struct {
	mu sync.Mutex
	n  int
}

func (o *countingObserver) PeriodicEnqueued(_ context.Context, _ string, n int) {
	o.mu.Lock()
	o.n += n
	o.mu.Unlock()
}

func (o *countingObserver) periodic() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// TestPeriodicMissedSlots stops every worker for 5 s, longer than PeriodicGrace, then
// starts one again. The slots of the outage (after the last pass plus the grace, up to
// the restart) follow each schedule's policy: skip enqueues none, once enqueues only the
// newest; a run-on-start schedule gets one job at each start after everyone was down.
// Every other slot is enqueued exactly once.
func TestPeriodicMissedSlots(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	const grace = 2 * time.Second
	opts := func(m queue.MissedPolicy, onStart bool) *fenceq.PeriodicOpts {
		return &fenceq.PeriodicOpts{Queue: tickQueue, Missed: m, RunOnStart: onStart}
	}
	jobs := []*fenceq.PeriodicJob{
		fenceq.NewPeriodicJob("skip", "@every 1s", TickArgs{}, opts(queue.MissedSkip, false)),
		fenceq.NewPeriodicJob("once", "* * * * * *", TickArgs{}, opts(queue.MissedOnce, false)),
		fenceq.NewPeriodicJob("on-start", "@every 1h", TickArgs{}, opts(queue.MissedSkip, true)),
	}
	cfg := func(id string) fenceq.Config {
		c := b.config(id, jobs...)
		c.PeriodicInterval, c.PeriodicGrace = 100*time.Millisecond, grace
		return c
	}
	w := b.start(t, b.db.Pool, cfg("before"))
	fenceqtest.WaitFor(t, "three slots of each schedule", 30*time.Second, func() bool {
		return len(origins(t, b.ctx, b.db.Pool, "skip")) >= 3 && len(origins(t, b.ctx, b.db.Pool, "once")) >= 3
	})
	stopWorker(t, w)
	down := heartbeat(t, b.ctx, b.db.Pool) // the last pass before the outage
	waitDBTime(t, b.ctx, b.db.Pool, down.Add(5*time.Second), 30*time.Second)
	before := map[string]int{}
	for _, n := range []string{"skip", "once"} {
		before[n] = len(origins(t, b.ctx, b.db.Pool, n))
	}
	// The hourly schedule also has its normal slots, at each whole hour: a run that
	// crosses one enqueues one of those too. Only the run-on-start jobs count here.
	onStartJobs := func() []origin {
		var out []origin
		for _, o := range origins(t, b.ctx, b.db.Pool, "on-start") {
			if o.RunOnStart {
				out = append(out, o)
			}
		}
		return out
	}
	before["on-start"] = len(onStartJobs())

	b.start(t, b.db.Pool, cfg("after"))
	fenceqtest.WaitFor(t, "three slots after the restart", 30*time.Second, func() bool {
		return len(origins(t, b.ctx, b.db.Pool, "skip")) >= before["skip"]+4
	})
	// The restart's first pass ran at the run-on-start job's time.
	onStart := onStartJobs()
	if len(onStart) != 2 || before["on-start"] != 1 {
		t.Fatalf("on-start jobs %+v (before the outage %d); want one at each start", onStart, before["on-start"])
	}
	restart, err := time.Parse(time.RFC3339Nano, onStart[1].At)
	if err != nil {
		t.Fatal(err)
	}
	if gap := restart.Sub(down); gap < 5*time.Second {
		t.Fatalf("outage lasted %s by the database's clock; want at least 5s", gap)
	}
	liveUntil := down.Add(grace) // slots up to here were due while a worker was running

	for _, name := range []string{"skip", "once"} {
		os := origins(t, b.ctx, b.db.Pool, name)
		var normal, missed []time.Time
		for _, o := range os {
			if o.Missed {
				missed = append(missed, o.slot(t))
			} else {
				normal = append(normal, o.slot(t))
			}
		}
		// Split the slots at the outage.
		i := slices.IndexFunc(normal, func(s time.Time) bool { return s.After(liveUntil) })
		if i < 0 {
			t.Fatalf("%s: no slot after the outage in %v", name, normal)
		}
		requireConsecutiveSeconds(t, normal[:i])
		requireConsecutiveSeconds(t, normal[i:])
		lastLive, firstAfter := normal[i-1], normal[i]
		// Every slot up to the grace after the last pass was caught up, none skipped.
		if want := liveUntil.Truncate(time.Second); !lastLive.Equal(want) {
			t.Fatalf("%s: last slot before the outage %s; want %s (the last pass %s plus the grace)", name, lastLive, want, down)
		}
		// The slots of the outage were passed over: the next one enqueued normally is
		// after the restarted worker's start (at least 5s after the last pass), and at the
		// latest the first after its first pass.
		if !firstAfter.After(down.Add(5*time.Second)) || firstAfter.After(restart.Truncate(time.Second).Add(time.Second)) {
			t.Fatalf("%s: first slot after the outage %s; want after %s and not after the first slot after the restart's pass at %s",
				name, firstAfter, down.Add(5*time.Second), restart)
		}
		switch name {
		case "skip":
			if len(missed) != 0 {
				t.Fatalf("skip enqueued missed slots %v", missed)
			}
		case "once":
			// One job for the newest missed slot: the one just before the first normal one.
			if want := firstAfter.Add(-time.Second); len(missed) != 1 || !missed[0].Equal(want) {
				t.Fatalf("once enqueued missed slots %v; want exactly [%s]", missed, want)
			}
		}
	}
}

// TestPeriodicSlotNotEnqueuedAgainAfterPrune: a slot's job completes and is pruned
// (no unique key can stop a second job any more); a worker that read the schedule
// before the slot was decided then tries to enqueue the same slot. The compare-and-set
// on last_slot rejects it and nothing is inserted.
func TestPeriodicSlotNotEnqueuedAgainAfterPrune(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	if _, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: "late", Spec: "@every 1s",
		Kind: "noop", Queue: queue.DefaultQueue}); err != nil {
		t.Fatal(err)
	}
	// What a late worker read: the schedule as it was before any pass.
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, stale, err := store.ReadDuePeriodic(b.ctx, tx)
	_ = tx.Rollback(b.ctx)
	if err != nil || len(stale) != 1 {
		t.Fatalf("read: %v %v", stale, err)
	}

	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[noopArgs]) error { return nil }, nil)
	w := b.start(t, b.db.Pool, fenceq.Config{Handlers: hs, PollInterval: 50 * time.Millisecond,
		Logger: fenceqtest.QuietLogger()})
	fenceqtest.WaitFor(t, "a completed periodic job", 30*time.Second, func() bool {
		var n int
		_ = b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE metadata ? 'periodic' AND state = 'completed'`).Scan(&n)
		return n > 0
	})
	stopWorker(t, w)
	os := origins(t, b.ctx, b.db.Pool, "late")
	first := os[0]
	if n, err := store.PruneFinished(b.ctx, b.db.Pool, -time.Hour, 1000); err != nil || n == 0 {
		t.Fatalf("prune: %d %v", n, err)
	}
	if got := origins(t, b.ctx, b.db.Pool, "late"); slices.ContainsFunc(got, func(o origin) bool { return o.Slot == first.Slot }) {
		t.Fatalf("the job of slot %s was not pruned", first.Slot)
	}

	// The late worker computes the same first slot from what it read, and tries.
	slot := first.slot(t)
	tx, err = b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	meta := `{"periodic": {"name": "late", "slot": "` + first.Slot + `"}}`
	o, err := store.EnqueuePeriodic(b.ctx, tx, store.PeriodicEnqueue{Name: "late", Spec: stale[0].Spec,
		Timezone: stale[0].Timezone, From: stale[0].LastSlot, To: slot, Metadata: []string{meta}, Slots: []time.Time{slot}})
	matched, inserted := o.Matched, o.Inserted
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if matched || inserted != 0 {
		t.Fatalf("late enqueue matched %v and inserted %d; want the compare-and-set to reject it", matched, inserted)
	}
	if got := origins(t, b.ctx, b.db.Pool, "late"); slices.ContainsFunc(got, func(o origin) bool { return o.Slot == first.Slot }) {
		t.Fatalf("slot %s was enqueued a second time", first.Slot)
	}
	// The schedule's own state still says the slot is decided.
	r, err := store.GetPeriodic(b.ctx, b.db.Pool, "late")
	if err != nil || r.LastSlot.Before(slot) {
		t.Fatalf("last_slot = %v (%v); want at or after %s", r.LastSlot, err, slot)
	}
}

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

// TestPeriodicPauseSurvivesRestart: a pause is a row, so a restart of every worker
// (which upserts the code-defined schedule again) keeps it; nothing is enqueued while it
// lasts, and resuming passes over the paused slots instead of catching them up.
func TestPeriodicPauseSurvivesRestart(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	pj := fenceq.NewPeriodicJob("pausable", "@every 1s", TickArgs{}, &fenceq.PeriodicOpts{Queue: tickQueue})
	w1 := b.start(t, b.db.NewPool(t, 4), b.config("a1", pj))
	w2 := b.start(t, b.db.NewPool(t, 4), b.config("a2", pj))
	fenceqtest.WaitFor(t, "two slots", 30*time.Second, func() bool { return len(origins(t, b.ctx, b.db.Pool, "pausable")) >= 2 })
	if _, err := store.SetPeriodicPaused(b.ctx, b.db.Pool, "pausable", true); err != nil {
		t.Fatal(err)
	}
	pausedAt := dbNow(t, b.ctx, b.db.Pool)
	stopWorker(t, w1)
	stopWorker(t, w2)
	n := len(origins(t, b.ctx, b.db.Pool, "pausable"))

	b.start(t, b.db.NewPool(t, 4), b.config("b1", pj))
	b.start(t, b.db.NewPool(t, 4), b.config("b2", pj))
	r, err := store.GetPeriodic(b.ctx, b.db.Pool, "pausable")
	if err != nil || !r.Paused {
		t.Fatalf("after the restart: %+v %v; want still paused", r, err)
	}
	// Three slots pass while the restarted workers run their passes.
	waitDBTime(t, b.ctx, b.db.Pool, pausedAt.Add(3*time.Second), 30*time.Second)
	hb := heartbeat(t, b.ctx, b.db.Pool)
	waitDBTime(t, b.ctx, b.db.Pool, hb, 30*time.Second)
	fenceqtest.WaitFor(t, "a pass after three paused slots", 30*time.Second, func() bool {
		return heartbeat(t, b.ctx, b.db.Pool).After(pausedAt.Add(3 * time.Second))
	})
	if got := len(origins(t, b.ctx, b.db.Pool, "pausable")); got != n {
		t.Fatalf("%d jobs enqueued while paused", got-n)
	}
	resumed, err := store.SetPeriodicPaused(b.ctx, b.db.Pool, "pausable", false)
	if err != nil || resumed.Paused {
		t.Fatalf("resume: %+v %v", resumed, err)
	}
	fenceqtest.WaitFor(t, "a slot after the resume", 30*time.Second, func() bool {
		return len(origins(t, b.ctx, b.db.Pool, "pausable")) > n
	})
	after := slotsOf(t, origins(t, b.ctx, b.db.Pool, "pausable")[n:])
	if !after[0].After(resumed.ReadAt) {
		t.Fatalf("first slot after the resume %s is not after the resume %s: paused slots were caught up", after[0], resumed.ReadAt)
	}
	requireConsecutiveSeconds(t, after)
}

// TestPeriodicUpsertKeepsState: a worker starting with a changed definition replaces
// it, keeping paused and last_slot; a schedule defined in code is refused at NewWorker
// when any field is bad, and nothing is written.
func TestPeriodicUpsertKeepsState(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	cfg := b.config("u1", fenceq.NewPeriodicJob("hourly", "@hourly", TickArgs{N: 1}, &fenceq.PeriodicOpts{Queue: tickQueue}))
	cfg.DisablePeriodic = true
	stopWorker(t, b.start(t, b.db.Pool, cfg))
	if _, err := store.SetPeriodicPaused(b.ctx, b.db.Pool, "hourly", true); err != nil {
		t.Fatal(err)
	}
	before, err := store.GetPeriodic(b.ctx, b.db.Pool, "hourly")
	if err != nil {
		t.Fatal(err)
	}
	cfg = b.config("u2", fenceq.NewPeriodicJob("hourly", "0 */2 * * *", TickArgs{N: 2},
		&fenceq.PeriodicOpts{Queue: tickQueue, Timezone: "Europe/Berlin", Missed: queue.MissedOnce}))
	cfg.DisablePeriodic = true
	stopWorker(t, b.start(t, b.db.Pool, cfg))
	after, err := store.GetPeriodic(b.ctx, b.db.Pool, "hourly")
	if err != nil {
		t.Fatal(err)
	}
	if after.Spec != "0 */2 * * *" || after.Timezone != "Europe/Berlin" || after.Missed != queue.MissedOnce ||
		string(after.EncodedArgs) != `{"n": 2}` || !after.Paused || !after.LastSlot.Equal(before.LastSlot) {
		t.Fatalf("after the upsert %+v; want the new definition, still paused, last_slot %s", after, before.LastSlot)
	}
}

// TestPeriodicRefusesBadInput: each bad field of a schedule, from code or from AddPeriodic,
// is refused with one line naming it, and nothing is written.
func TestPeriodicRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	good := func() queue.PeriodicParams {
		return queue.PeriodicParams{Name: "n", Spec: "@daily", Kind: "tick", Args: []byte(`{}`)}
	}
	cases := []struct {
		field string
		edit  func(p *queue.PeriodicParams)
	}{
		{"name", func(p *queue.PeriodicParams) { p.Name = "bad name" }},
		{"name", func(p *queue.PeriodicParams) { p.Name = "" }},
		{"spec", func(p *queue.PeriodicParams) { p.Spec = "every day" }},
		{"spec", func(p *queue.PeriodicParams) { p.Spec = "" }},
		{"timezone", func(p *queue.PeriodicParams) { p.Timezone = "Europe/Nowhere" }},
		{"kind", func(p *queue.PeriodicParams) { p.Kind = "" }},
		{"kind", func(p *queue.PeriodicParams) { p.Kind = "no spaces" }},
		{"args", func(p *queue.PeriodicParams) { p.Args = []byte(`[1]`) }},
		{"args", func(p *queue.PeriodicParams) { p.Args = []byte(`{"a":`) }},
		{"queue", func(p *queue.PeriodicParams) { p.Queue = "-q" }},
		{"missed", func(p *queue.PeriodicParams) { p.Missed = "twice" }},
		{"priority", func(p *queue.PeriodicParams) { p.Priority = new(101) }},
		{"max_attempts", func(p *queue.PeriodicParams) { p.MaxAttempts = -1 }},
	}
	for _, c := range cases {
		p := good()
		c.edit(&p)
		_, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, p)
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || strings.Contains(err.Error(), "\n") {
			t.Errorf("AddPeriodic with a bad %s: %v; want one line naming %s", c.field, err, c.field)
		}
	}
	// From code: NewWorker names the schedule and the field.
	for _, c := range []struct {
		field string
		pj    *fenceq.PeriodicJob
	}{
		{"spec", fenceq.NewPeriodicJob("c1", "@fortnightly", TickArgs{}, nil)},
		{"timezone", fenceq.NewPeriodicJob("c2", "@daily", TickArgs{}, &fenceq.PeriodicOpts{Timezone: "Nowhere"})},
		{"queue", fenceq.NewPeriodicJob("c3", "@daily", TickArgs{}, &fenceq.PeriodicOpts{Queue: "bad queue"})},
		{"missed", fenceq.NewPeriodicJob("c4", "@daily", TickArgs{}, &fenceq.PeriodicOpts{Missed: "all"})},
		{"name", fenceq.NewPeriodicJob("c 5", "@daily", TickArgs{}, nil)},
		{"args", fenceq.NewPeriodicJob("c6", "@daily", nil, nil)},
		{"args", fenceq.NewPeriodicJob("c7", "@daily", badArgs{F: func() {}}, nil)},
	} {
		_, err := fenceq.NewWorker(b.db.Pool, b.config("x", fenceq.NewPeriodicJob("fine", "@daily", TickArgs{}, nil), c.pj))
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !strings.Contains(err.Error(), "Periodic[1]") {
			t.Errorf("NewWorker with a bad %s: %v; want an error naming Periodic[1] and %s", c.field, err, c.field)
		}
	}
	_, err := fenceq.NewWorker(b.db.Pool, b.config("x", fenceq.NewPeriodicJob("twice", "@daily", TickArgs{}, nil),
		fenceq.NewPeriodicJob("twice", "@hourly", TickArgs{}, nil)))
	if err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("two schedules of one name: %v", err)
	}
	cfg := b.config("x")
	cfg.PeriodicInterval, cfg.PeriodicGrace = time.Second, time.Second
	if _, err := fenceq.NewWorker(b.db.Pool, cfg); err == nil || !strings.Contains(err.Error(), "PeriodicGrace") {
		t.Errorf("grace not longer than the interval: %v", err)
	}
	rows, err := store.ListPeriodic(b.ctx, b.db.Pool)
	if err != nil || len(rows) != 0 {
		t.Fatalf("schedules written: %+v %v", rows, err)
	}
}

type badArgs struct {
	F func() `json:"f"`
}

func (badArgs) Kind() string { return "bad" }

// TestPeriodicTrigger enqueues one job now without touching the schedule's slots.
func TestPeriodicTrigger(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	added, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: "daily", Spec: "@daily",
		Kind: "tick", Args: []byte(`{"n": 3}`), Queue: tickQueue})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: "daily", Spec: "@hourly",
		Kind: "tick"}); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("adding a second schedule named daily: %v; want ErrExists", err)
	}
	j, err := store.TriggerPeriodic(b.ctx, b.db.Pool, "daily")
	if err != nil {
		t.Fatal(err)
	}
	if j.Kind != "tick" || j.Queue != tickQueue || j.State != queue.StateAvailable {
		t.Fatalf("triggered job %+v", j)
	}
	os := origins(t, b.ctx, b.db.Pool, "daily")
	if len(os) != 1 || !os[0].Triggered || os[0].Slot != "" || os[0].At == "" {
		t.Fatalf("origins %+v; want one triggered job with no slot", os)
	}
	info, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, "daily")
	if err != nil {
		t.Fatal(err)
	}
	if !info.LastSlot.Equal(added.LastSlot) || info.LastEnqueuedSlot != nil || info.Next == nil {
		t.Fatalf("after trigger %+v; want the slots untouched", info)
	}
	if _, err := store.TriggerPeriodic(b.ctx, b.db.Pool, "nope"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("trigger unknown: %v", err)
	}
}

// periodicClock reads the time of the last scheduling pass, nil before the first.
func periodicClock(t *testing.T, ctx context.Context, db queue.DBTX) *time.Time {
	t.Helper()
	var hb *time.Time
	if err := db.QueryRow(ctx, `SELECT heartbeat_at FROM fenceq_periodic_clock`).Scan(&hb); err != nil {
		t.Fatal(err)
	}
	return hb
}

// TestPeriodicResumedLoggedOnlyAfterAPreviousPass: the first scheduling pass on a fresh
// database resumes nothing and does not say so; a pass after a gap longer than the grace
// says when the previous pass ran.
func TestPeriodicResumedLoggedOnlyAfterAPreviousPass(t *testing.T) {
	t.Parallel()
	const resumed = "periodic scheduling resumed after every worker was down"
	b := setupPeriodic(t)
	if hb := periodicClock(t, b.ctx, b.db.Pool); hb != nil {
		t.Fatalf("fresh database: last pass %s, want none", hb)
	}
	first := newLogCapture()
	cfg := b.config("fresh")
	cfg.Logger = first.logger()
	w := b.start(t, b.db.Pool, cfg)
	fenceqtest.WaitFor(t, "the first scheduling pass", 30*time.Second, func() bool {
		return periodicClock(t, b.ctx, b.db.Pool) != nil
	})
	stopWorker(t, w) // its passes, and their logs, are done
	if recs := first.withMessage(resumed); len(recs) != 0 {
		t.Fatalf("first pass on a fresh database logged %q %d times (%v), want never", resumed, len(recs), recordAttrs(recs[0]))
	}

	// Every worker down for an hour: the next pass resumes, and names the last one.
	var last time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `UPDATE fenceq_periodic_clock SET heartbeat_at = now() - interval '1 hour'
		RETURNING heartbeat_at`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	again := newLogCapture()
	cfg = b.config("again")
	cfg.Logger = again.logger()
	w = b.start(t, b.db.Pool, cfg)
	fenceqtest.WaitFor(t, "a scheduling pass after the gap", 30*time.Second, func() bool {
		hb := periodicClock(t, b.ctx, b.db.Pool)
		return hb != nil && hb.After(last)
	})
	stopWorker(t, w)
	recs := again.withMessage(resumed)
	if len(recs) != 1 {
		t.Fatalf("pass after an hour's gap logged %q %d times, want once", resumed, len(recs))
	}
	got, ok := recordAttrs(recs[0])["last_pass"]
	if !ok || got.Kind() != slog.KindTime || !got.Time().Equal(last) {
		t.Fatalf("resumed log: last_pass = %v, want the previous pass %s", got, last)
	}
}

// TestPeriodicCodeRedefinitionIsLogged: a worker whose code defines a schedule
// differently from the stored definition replaces it (a rolling deploy does that), and
// says so in a warning naming the schedule, the changed fields and both definitions; the
// row's updated_at moves. Writing the same definition again, or a new one, is silent.
func TestPeriodicCodeRedefinitionIsLogged(t *testing.T) {
	t.Parallel()
	const redefined = "periodic schedule redefined: this worker's code definition replaced a different stored one"
	b := setupPeriodic(t)
	start := func(id string, pjs ...*fenceq.PeriodicJob) []slog.Record {
		t.Helper()
		logs := newLogCapture()
		cfg := b.config(id, pjs...)
		cfg.DisablePeriodic = true
		cfg.Logger = logs.logger()
		stopWorker(t, b.start(t, b.db.Pool, cfg))
		return logs.withMessage(redefined)
	}
	hourly := func(spec string, n int) *fenceq.PeriodicJob {
		return fenceq.NewPeriodicJob("hourly", spec, TickArgs{N: n}, &fenceq.PeriodicOpts{Queue: tickQueue})
	}
	if recs := start("new", hourly("@hourly", 1)); len(recs) != 0 {
		t.Fatalf("a new schedule logged %d redefinitions: %v", len(recs), recordAttrs(recs[0]))
	}
	// The stored args are jsonb ({"n": 1}), the code's encoded by Go ({"n":1}): the same.
	if recs := start("same", hourly("@hourly", 1)); len(recs) != 0 {
		t.Fatalf("the same definition again logged %d redefinitions: %v", len(recs), recordAttrs(recs[0]))
	}
	before, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, "hourly")
	if err != nil {
		t.Fatal(err)
	}

	recs := start("changed", hourly("*/30 * * * *", 2))
	if len(recs) != 1 {
		t.Fatalf("a changed definition logged %d redefinitions, want 1", len(recs))
	}
	if recs[0].Level != slog.LevelWarn {
		t.Errorf("redefinition logged at %s, want WARN", recs[0].Level)
	}
	attrs := recordAttrs(recs[0])
	for key, want := range map[string]string{
		"name":    "hourly",
		"changed": "spec,args",
		"stored":  `spec="@hourly" timezone=UTC kind=tick args={"n":1} queue=ticks priority=1 max_attempts=25 missed=skip run_on_start=false source=code`,
		"code":    `spec="*/30 * * * *" timezone=UTC kind=tick args={"n":2} queue=ticks priority=1 max_attempts=25 missed=skip run_on_start=false source=code`,
		"worker":  "changed",
	} {
		if got := attrs[key]; got.String() != want {
			t.Errorf("redefinition log: %s = %q, want %q", key, got.String(), want)
		}
	}
	after, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, "hourly")
	if err != nil {
		t.Fatal(err)
	}
	if after.Spec != "*/30 * * * *" || !after.UpdatedAt.After(before.UpdatedAt) {
		t.Fatalf("after the redefinition: spec %q, updated_at %s (was %s); want the code's spec and a later updated_at",
			after.Spec, after.UpdatedAt, before.UpdatedAt)
	}

	// A schedule an operator added, then defined in code the same but for its source.
	if _, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: "nightly", Spec: "@daily",
		Kind: "tick", Args: []byte(`{"n": 3}`), Queue: tickQueue}); err != nil {
		t.Fatal(err)
	}
	recs = start("takeover", fenceq.NewPeriodicJob("nightly", "@daily", TickArgs{N: 3}, &fenceq.PeriodicOpts{Queue: tickQueue}))
	if len(recs) != 1 || recordAttrs(recs[0])["changed"].String() != "source" || recordAttrs(recs[0])["name"].String() != "nightly" {
		var got []map[string]slog.Value
		for _, r := range recs {
			got = append(got, recordAttrs(r))
		}
		t.Fatalf("code taking over an operator's schedule logged %v, want one redefinition of nightly changing source", got)
	}
}
