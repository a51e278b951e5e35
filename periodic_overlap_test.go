package fenceq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// slotMeta is the metadata a scheduling pass gives the job of a slot.
func slotMeta(name string, slot time.Time) string {
	return fmt.Sprintf(`{"periodic": {"name": %q, "slot": %q}}`, name, slot.UTC().Format(time.RFC3339))
}

// pass runs what a scheduling pass does for one schedule, with the slots given: it takes
// the clock row, reads the schedule, and decides the slots from its last slot to the
// newest of them. It returns the outcome, with the row read before it.
func pass(t *testing.T, ctx context.Context, db *fenceqtest.DB, name string, slots ...time.Time) store.PeriodicOutcome {
	t.Helper()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := store.LockPeriodicClock(ctx, tx, time.Minute); err != nil {
		t.Fatal(err)
	}
	r, err := store.GetPeriodic(ctx, tx, name)
	if err != nil {
		t.Fatal(err)
	}
	e := store.PeriodicEnqueue{Name: name, Spec: r.Spec, Timezone: r.Timezone, From: r.LastSlot,
		To: slots[len(slots)-1], Slots: slots, NoOverlap: r.NoOverlap}
	for _, s := range slots {
		e.Metadata = append(e.Metadata, slotMeta(name, s))
	}
	o, err := store.EnqueuePeriodic(ctx, tx, e)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !o.Matched {
		t.Fatalf("pass of %s for %v did not match the schedule's last slot", name, slots)
	}
	return o
}

// claimTick claims the one available job of the ticks queue.
func claimTick(t *testing.T, ctx context.Context, db queue.DBTX) *queue.JobRow {
	t.Helper()
	js, err := store.Claim(ctx, db, store.ClaimParams{Queue: tickQueue, WorkerID: "w1", Limit: 1, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(js) != 1 {
		t.Fatalf("claimed %d jobs from %s; want one", len(js), tickQueue)
	}
	return js[0]
}

func completeTick(t *testing.T, ctx context.Context, db queue.DBTX, j *queue.JobRow) {
	t.Helper()
	if err := store.Complete(ctx, db, queue.Lease{JobID: j.ID, Gen: j.LeaseGen, Holder: "w1"}); err != nil {
		t.Fatalf("complete job %d: %v", j.ID, err)
	}
}

// A no-overlap schedule skips a slot due while its previous run is unfinished —
// waiting or running — and enqueues the first slot due after it finished; of several
// slots decided at once, it enqueues the first and skips the others. Skips are counted in
// the schedule's row with the newest skipped slot.
func TestPeriodicNoOverlapSkipsWhilePreviousRunUnfinished(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	added, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: "ov", Spec: "@every 1s",
		Kind: "tick", Queue: tickQueue, NoOverlap: true})
	if err != nil {
		t.Fatal(err)
	}
	if !added.NoOverlap {
		t.Fatalf("added %+v; want no_overlap", added.PeriodicRow)
	}
	s := added.LastSlot.Truncate(time.Second).Add(time.Second)
	at := func(i int) time.Time { return s.Add(time.Duration(i) * time.Second) }

	if o := pass(t, b.ctx, b.db, "ov", at(0)); o.Inserted != 1 || o.Skipped != 0 {
		t.Fatalf("first slot: %+v; want it enqueued", o)
	}
	// Waiting is unfinished too.
	o := pass(t, b.ctx, b.db, "ov", at(1))
	first := origins(t, b.ctx, b.db.Pool, "ov")
	if o.Inserted != 0 || o.Skipped != 1 || !o.SkippedSlot.Equal(at(1)) || o.Unfinished != first[0].JobID {
		t.Fatalf("slot while the first job waits: %+v; want skipped, naming job %d", o, first[0].JobID)
	}
	job := claimTick(t, b.ctx, b.db.Pool)
	if o := pass(t, b.ctx, b.db, "ov", at(2)); o.Inserted != 0 || o.Skipped != 1 || o.Unfinished != job.ID {
		t.Fatalf("slot while the first job runs: %+v; want skipped, naming job %d", o, job.ID)
	}
	completeTick(t, b.ctx, b.db.Pool, job)
	if o := pass(t, b.ctx, b.db, "ov", at(3)); o.Inserted != 1 || o.Skipped != 0 {
		t.Fatalf("slot after the first job completed: %+v; want it enqueued", o)
	}
	completeTick(t, b.ctx, b.db.Pool, claimTick(t, b.ctx, b.db.Pool))
	o = pass(t, b.ctx, b.db, "ov", at(4), at(5), at(6))
	if o.Inserted != 1 || o.Skipped != 2 || !o.SkippedSlot.Equal(at(6)) || o.Unfinished != 0 {
		t.Fatalf("three slots at once: %+v; want the first enqueued and two skipped", o)
	}

	got := slotsOf(t, origins(t, b.ctx, b.db.Pool, "ov"))
	if want := []time.Time{at(0), at(3), at(4)}; !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("slots enqueued %v; want %v", got, want)
	}
	info, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, "ov")
	if err != nil {
		t.Fatal(err)
	}
	if info.SkippedSlots != 4 || info.LastSkippedSlot == nil || !info.LastSkippedSlot.Equal(at(6)) ||
		info.LastEnqueuedSlot == nil || !info.LastEnqueuedSlot.Equal(at(4)) || !info.LastSlot.Equal(at(6)) {
		t.Fatalf("row %+v; want 4 skipped, the last at %s, last enqueued %s, last slot %s", info.PeriodicRow, at(6), at(4), at(6))
	}
}

// The decision is the database's and race-free: two passes that decide the same slot
// enqueue it once, and a pass that runs while the previous run's completion has not
// committed skips the slot (the run was unfinished as of its statement), while one that
// runs after the completion committed enqueues it. Never are two runs unfinished at once.
func TestPeriodicNoOverlapRaces(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	added, err := fenceq.AddPeriodic(b.ctx, b.db.Pool, queue.PeriodicParams{Name: "ov", Spec: "@every 1s",
		Kind: "tick", Queue: tickQueue, NoOverlap: true})
	if err != nil {
		t.Fatal(err)
	}
	s := added.LastSlot.Truncate(time.Second).Add(time.Second)
	at := func(i int) time.Time { return s.Add(time.Duration(i) * time.Second) }

	// Two passes of the same slot, from two connections at once.
	var wg sync.WaitGroup
	var matched, inserted atomic.Int64
	start := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tx, err := b.db.Pool.Begin(b.ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if _, err := store.LockPeriodicClock(b.ctx, tx, time.Minute); err != nil {
				t.Error(err)
				return
			}
			o, err := store.EnqueuePeriodic(b.ctx, tx, store.PeriodicEnqueue{Name: "ov", Spec: "@every 1s",
				Timezone: "UTC", From: added.LastSlot, To: at(0), Metadata: []string{slotMeta("ov", at(0))},
				Slots: []time.Time{at(0)}, NoOverlap: true})
			if err != nil {
				t.Error(err)
				return
			}
			if err := tx.Commit(b.ctx); err != nil {
				t.Error(err)
				return
			}
			if o.Matched {
				matched.Add(1)
			}
			inserted.Add(o.Inserted)
		}()
	}
	close(start)
	wg.Wait()
	if matched.Load() != 1 || inserted.Load() != 1 {
		t.Fatalf("two passes of one slot: %d matched, %d inserted; want one each", matched.Load(), inserted.Load())
	}

	// The previous run completes in a transaction that has not committed when the pass
	// runs: the pass skips the slot. After that commit, the next slot is enqueued.
	job := claimTick(t, b.ctx, b.db.Pool)
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	completeTick(t, b.ctx, tx, job)
	if o := pass(t, b.ctx, b.db, "ov", at(1)); o.Inserted != 0 || o.Skipped != 1 || o.Unfinished != job.ID {
		t.Fatalf("slot while the completion is uncommitted: %+v; want skipped", o)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if o := pass(t, b.ctx, b.db, "ov", at(2)); o.Inserted != 1 {
		t.Fatalf("slot after the completion committed: %+v; want enqueued", o)
	}
	got := slotsOf(t, origins(t, b.ctx, b.db.Pool, "ov"))
	if want := []time.Time{at(0), at(2)}; !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("slots enqueued %v; want %v", got, want)
	}
}

// OverlapArgs are the args of the no-overlap schedule run by a worker: its handler
// blocks until the test lets it finish.
type OverlapArgs struct{}

func (OverlapArgs) Kind() string { return "overlap" }

type skipCounter struct{ n atomic.Int64 }

func (c *skipCounter) PeriodicSkipped(_ context.Context, name string, n int) {
	if name == "slow" {
		c.n.Add(int64(n))
	}
}

// A worker runs a no-overlap schedule due every second whose job takes longer than a
// second: slots due while it runs are skipped (the hook is told, the row counts them),
// no two of its jobs ever run at once, and once it completed, a later slot runs again.
func TestPeriodicNoOverlapWithWorker(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	release := make(chan struct{})
	var running, maxRunning, runs atomic.Int64
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, _ *fenceq.Job[OverlapArgs]) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		if runs.Add(1) == 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}, nil)
	counter := &skipCounter{}
	cfg := b.config("w1", fenceq.NewPeriodicJob("slow", "@every 1s", OverlapArgs{}, &fenceq.PeriodicOpts{NoOverlap: true}))
	cfg.Handlers = hs
	cfg.Hooks = []fenceq.Hook{counter}
	b.start(t, b.db.Pool, cfg)

	fenceqtest.WaitFor(t, "two slots skipped while the first job runs", time.Minute, func() bool {
		info, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, "slow")
		return err == nil && info.SkippedSlots >= 2 && counter.n.Load() >= 2
	})
	if n := len(origins(t, b.ctx, b.db.Pool, "slow")); n != 1 {
		t.Fatalf("%d jobs of the schedule while its first runs; want one", n)
	}
	close(release)
	fenceqtest.WaitFor(t, "a later slot run after the first completed", time.Minute, func() bool {
		return runs.Load() >= 2
	})
	if m := maxRunning.Load(); m != 1 {
		t.Fatalf("%d jobs of the schedule ran at once; want at most one", m)
	}
	os := origins(t, b.ctx, b.db.Pool, "slow")
	info, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, "slow")
	if err != nil {
		t.Fatal(err)
	}
	if len(os) < 2 || info.LastSkippedSlot == nil || !os[1].slot(t).After(*info.LastSkippedSlot) {
		t.Fatalf("jobs %+v, last skipped %v; want a second job for a slot after the skipped ones", os, info.LastSkippedSlot)
	}
}

// UniqueTickArgs is a kind whose InsertOpts make it unique by its args and give it tags
// and metadata.
type UniqueTickArgs struct {
	N int `json:"n" unique:"true"`
	M int `json:"m"`
}

func (UniqueTickArgs) Kind() string { return "unique-tick" }

func (UniqueTickArgs) InsertOpts() fenceq.InsertOpts {
	return fenceq.InsertOpts{Queue: tickQueue, Unique: queue.UniqueOpts{ByArgs: true},
		Tags: []string{"nightly", "billing"}, Metadata: map[string]any{"team": "billing", "periodic": "overwritten"}}
}

// A schedule defined in code gives its jobs the kind's unique key, tags and metadata, as
// an Enqueue of the same args would (the periodic origin merged over the kind's
// metadata): for slots, for a trigger and for a run on start. While the key is held, a
// slot enqueues nothing, and a trigger says so.
func TestPeriodicJobsCarryTheKindsOptions(t *testing.T) {
	t.Parallel()
	b := setupPeriodic(t)
	args := UniqueTickArgs{N: 3, M: 4}
	pj := fenceq.NewPeriodicJob("uniq", "@every 1s", args, &fenceq.PeriodicOpts{RunOnStart: true})
	p, err := pj.Params()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.UpsertPeriodic(b.ctx, b.db.Pool, []queue.PeriodicParams{p}); err != nil {
		t.Fatal(err)
	}
	want, err := fenceq.Enqueue(b.ctx, b.db.Pool, args, nil) // the key an Enqueue computes
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, want.Job.ID, "only its key was wanted"); err != nil {
		t.Fatal(err)
	}
	r, err := store.GetPeriodic(b.ctx, b.db.Pool, "uniq")
	if err != nil {
		t.Fatal(err)
	}
	s := r.LastSlot.Truncate(time.Second).Add(time.Second)
	if o := pass(t, b.ctx, b.db, "uniq", s); o.Inserted != 1 {
		t.Fatalf("first slot: %+v; want one job", o)
	}
	os := origins(t, b.ctx, b.db.Pool, "uniq")
	if len(os) != 1 {
		t.Fatalf("%d jobs; want one", len(os))
	}
	j, err := fenceq.GetJob(b.ctx, b.db.Pool, os[0].JobID)
	if err != nil {
		t.Fatal(err)
	}
	requireKindOptions(t, j, *want.Job.UniqueKey)
	if os[0].Slot != s.UTC().Format(time.RFC3339) {
		t.Fatalf("origin %+v; want slot %s", os[0], s)
	}

	// The job holds its key: the next slot is decided, and enqueues nothing.
	if o := pass(t, b.ctx, b.db, "uniq", s.Add(time.Second)); o.Inserted != 0 {
		t.Fatalf("slot while the key is held: %+v; want no job", o)
	}
	if _, err := store.TriggerPeriodic(b.ctx, b.db.Pool, "uniq"); !errors.Is(err, queue.ErrWrongState) {
		t.Fatalf("trigger while the key is held: %v; want ErrWrongState", err)
	}
	if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, j.ID, "free the key"); err != nil {
		t.Fatal(err)
	}
	tj, err := store.TriggerPeriodic(b.ctx, b.db.Pool, "uniq")
	if err != nil {
		t.Fatal(err)
	}
	requireKindOptions(t, tj, *want.Job.UniqueKey)
	if _, err := fenceq.CancelJob(b.ctx, b.db.Pool, tj.ID, "free the key"); err != nil {
		t.Fatal(err)
	}
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if ok, err := store.EnqueueOnStart(b.ctx, tx, "uniq", []byte(`{"periodic": {"name": "uniq", "run_on_start": true}}`)); err != nil || !ok {
		t.Fatalf("run on start: %t %v", ok, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	os = origins(t, b.ctx, b.db.Pool, "uniq")
	last, err := fenceq.GetJob(b.ctx, b.db.Pool, os[len(os)-1].JobID)
	if err != nil {
		t.Fatal(err)
	}
	if !os[len(os)-1].RunOnStart {
		t.Fatalf("newest job %+v; want the run on start", os[len(os)-1])
	}
	requireKindOptions(t, last, *want.Job.UniqueKey)

	// The stored definition shows them.
	info, err := fenceq.GetPeriodic(b.ctx, b.db.Pool, "uniq")
	if err != nil {
		t.Fatal(err)
	}
	if info.UniqueKey == nil || *info.UniqueKey != *want.Job.UniqueKey || !slices.Equal(info.Tags, []string{"nightly", "billing"}) {
		t.Fatalf("schedule %+v; want the kind's unique key and tags", info.PeriodicRow)
	}
}

// requireKindOptions fails unless j carries UniqueTickArgs' options: key, tags, and the
// kind's metadata with the periodic origin over its "periodic" key.
func requireKindOptions(t *testing.T, j *queue.JobRow, key string) {
	t.Helper()
	if j.UniqueKey == nil || *j.UniqueKey != key {
		t.Fatalf("job %d unique key %v; want %s, the key an Enqueue of the args gets", j.ID, j.UniqueKey, key)
	}
	if !slices.Equal(j.Tags, []string{"nightly", "billing"}) {
		t.Fatalf("job %d tags %v; want the kind's", j.ID, j.Tags)
	}
	var meta map[string]any
	if err := json.Unmarshal(j.Metadata, &meta); err != nil {
		t.Fatal(err)
	}
	origin, ok := meta["periodic"].(map[string]any)
	if meta["team"] != "billing" || !ok || origin["name"] != "uniq" {
		t.Fatalf("job %d metadata %s; want the kind's team and the periodic origin", j.ID, j.Metadata)
	}
	if j.Queue != tickQueue {
		t.Fatalf("job %d queue %s; want the kind's, %s", j.ID, j.Queue, tickQueue)
	}
}

// A schedule's unique options, tags and metadata are checked like an enqueue's, naming
// the field; a kind that debounces cannot be periodic.
func TestPeriodicKindOptionsRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		p     queue.PeriodicParams
		field string
	}{
		{"BadTag", queue.PeriodicParams{Tags: []string{"no spaces"}}, "tags"},
		{"MetadataArray", queue.PeriodicParams{Metadata: []byte(`[1]`)}, "metadata"},
		{"ShortPeriod", queue.PeriodicParams{Unique: queue.UniqueOpts{ByPeriod: time.Millisecond}}, "unique.by_period"},
	} {
		c.p.Name, c.p.Spec, c.p.Kind, c.p.Source = "s", "@hourly", "tick", queue.SourceCLI
		_, err := fenceq.ValidatePeriodic(&c.p)
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			t.Errorf("%s: %v; want an error naming %s", c.name, err, c.field)
		}
	}
	_, err := fenceq.NewPeriodicJob("d", "@hourly", debouncingArgs{}, nil).Params()
	var ve *queue.ValidationError
	if !errors.As(err, &ve) || ve.Field != "debounce" {
		t.Errorf("a debouncing kind: %v; want an error naming debounce", err)
	}
}

type debouncingArgs struct{}

func (debouncingArgs) Kind() string { return "debouncing" }

func (debouncingArgs) InsertOpts() fenceq.InsertOpts {
	return fenceq.InsertOpts{Debounce: queue.DebounceOpts{Key: "k", Window: time.Second}}
}
