package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// The SQL function behind the unique index reads a mask as queue.StateMask writes it,
// for every state.
func TestStateMaskMatchesSQLFunction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, s := range queue.JobStates() {
		for _, m := range []store.StateMask{store.MaskOf(s), store.MaskOf(queue.JobStates()...) &^ store.MaskOf(s)} {
			var in bool
			if err := b.db.Pool.QueryRow(b.ctx, `SELECT fenceq_state_in_mask($1, $2::smallint)`, string(s), int16(m)).Scan(&in); err != nil {
				t.Fatal(err)
			}
			if in != m.Has(s) {
				t.Fatalf("fenceq_state_in_mask(%s, %b) = %v, StateMask.Has = %v", s, m, in, m.Has(s))
			}
		}
	}
	if got, want := store.MaskOf(queue.UnfinishedStates()...).States(), queue.UnfinishedStates(); !slices.Equal(got, want) {
		t.Fatalf("mask round trip: %v, want %v", got, want)
	}
	// Pending shares available's bit: a pending job holds its key exactly when an
	// available one would.
	if store.MaskOf(queue.StatePending) != store.MaskOf(queue.StateAvailable) {
		t.Fatalf("pending's mask %b, available's %b", store.MaskOf(queue.StatePending), store.MaskOf(queue.StateAvailable))
	}
}

func mustInsert(t *testing.T, b *testBundle, p store.InsertParams) *queue.InsertResult {
	t.Helper()
	res, err := store.Insert(b.ctx, b.db.Pool, p)
	if err != nil {
		t.Fatalf("insert %+v: %v", p, err)
	}
	return res
}

// By args: the same args (in any field order) conflict and return the holder; other
// args do not; with ArgsFields, only the named fields count.
func TestUniqueByArgs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	all := queue.UniqueOpts{ByArgs: true}
	first := mustInsert(t, b, store.InsertParams{Kind: "mail", Args: []byte(`{"to":"a@x","n":1}`), Unique: all})
	again := mustInsert(t, b, store.InsertParams{Kind: "mail", Args: []byte(`{ "n": 1, "to": "a@x" }`), Unique: all})
	if first.Existing || !again.Existing || again.Job.ID != first.Job.ID {
		t.Fatalf("same args: first %+v, again %+v; want the first job back", first, again)
	}
	if first.Job.UniqueKey == nil || !strings.HasPrefix(*first.Job.UniqueKey, "mail:") ||
		!slices.Equal(first.Job.UniqueStates, queue.UnfinishedStates()) {
		t.Fatalf("stored key %v states %v", first.Job.UniqueKey, first.Job.UniqueStates)
	}
	other := mustInsert(t, b, store.InsertParams{Kind: "mail", Args: []byte(`{"to":"b@x","n":1}`), Unique: all})
	if other.Existing {
		t.Fatalf("other args conflicted with job %d", other.Job.ID)
	}
	// Another kind with the same args is another key.
	if k := mustInsert(t, b, store.InsertParams{Kind: "sms", Args: []byte(`{"to":"a@x","n":1}`), Unique: all}); k.Existing {
		t.Fatal("another kind with the same args conflicted")
	}
	// Only "to" counts: n differs, still a conflict.
	byTo := queue.UniqueOpts{ByArgs: true, ArgsFields: []string{"to"}}
	x := mustInsert(t, b, store.InsertParams{Kind: "push", Args: []byte(`{"to":"a@x","n":1}`), Unique: byTo})
	y := mustInsert(t, b, store.InsertParams{Kind: "push", Args: []byte(`{"to":"a@x","n":2}`), Unique: byTo})
	if x.Existing || !y.Existing || y.Job.ID != x.Job.ID {
		t.Fatalf("by field: %+v %+v", x, y)
	}
	// By queue: the same args may wait once per queue.
	bq := queue.UniqueOpts{ByArgs: true, ByQueue: true}
	q1 := mustInsert(t, b, store.InsertParams{Kind: "q", Queue: "one", Unique: bq})
	q2 := mustInsert(t, b, store.InsertParams{Kind: "q", Queue: "two", Unique: bq})
	q3 := mustInsert(t, b, store.InsertParams{Kind: "q", Queue: "one", Unique: bq})
	if q1.Existing || q2.Existing || !q3.Existing || q3.Job.ID != q1.Job.ID {
		t.Fatalf("by queue: %v %v %v", q1.Existing, q2.Existing, q3.Existing)
	}
}

// By period: jobs whose run_at falls in one period (by the database's clock) conflict;
// the key names the period's start.
func TestUniqueByPeriod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hourly := queue.UniqueOpts{ByPeriod: time.Hour}
	var now time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	start := now.UTC().Truncate(time.Hour)
	at := func(d time.Duration) store.InsertParams {
		return store.InsertParams{Kind: "report", RunAt: start.Add(d), Unique: hourly}
	}
	a := mustInsert(t, b, at(time.Minute))
	c := mustInsert(t, b, at(59*time.Minute))
	d := mustInsert(t, b, at(61*time.Minute))
	if a.Existing || !c.Existing || c.Job.ID != a.Job.ID || d.Existing {
		t.Fatalf("hourly: %v %v %v", a.Existing, c.Existing, d.Existing)
	}
	if want := ":" + start.Format("2006-01-02T15:04:05Z"); !strings.HasSuffix(*a.Job.UniqueKey, want) {
		t.Fatalf("key %q does not end with the period start %q", *a.Job.UniqueKey, want)
	}
	// Without RunAt the database's now() decides: RunIn moves the job into the next hour.
	n1 := mustInsert(t, b, store.InsertParams{Kind: "tick", Unique: hourly})
	n2 := mustInsert(t, b, store.InsertParams{Kind: "tick", Unique: hourly})
	if n1.Existing || !n2.Existing || n2.Job.ID != n1.Job.ID {
		// The hour may have turned between the two inserts; then the keys differ.
		if *n1.Job.UniqueKey == *n2.Job.UniqueKey {
			t.Fatalf("now: %+v %+v", n1, n2)
		}
	}
	n3 := mustInsert(t, b, store.InsertParams{Kind: "tick", RunIn: 2 * time.Hour, Unique: hourly})
	if n3.Existing {
		t.Fatal("a job two hours later conflicted with this hour's")
	}
	// A batch, with duplicates inside it, follows the same rule.
	n, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{at(5 * time.Minute), at(62 * time.Minute), at(125 * time.Minute), at(126 * time.Minute)})
	if err != nil || n != 1 {
		t.Fatalf("batch inserted %d (%v), want 1 (only the third hour is free)", n, err)
	}
}

// By state: a key held in completed too keeps holding after the job completes; a plain
// key is free again. A conflict returns the completed holder.
func TestUniqueIncludingCompletedHoldsAfterCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	withDone := queue.UniqueOpts{ByState: append(queue.UnfinishedStates(), queue.StateCompleted)}
	p := store.InsertParams{Kind: "once", UniqueKey: "import:2026-10", Unique: withDone}
	first := mustInsert(t, b, p)
	if *first.Job.UniqueKey != "import:2026-10" || !slices.Contains(first.Job.UniqueStates, queue.StateCompleted) {
		t.Fatalf("a key with states only is stored as given: %q %v", *first.Job.UniqueKey, first.Job.UniqueStates)
	}
	plain := mustInsert(t, b, store.InsertParams{Kind: "plain", UniqueKey: "plain"})
	for _, j := range b.claim(t, "w", 10, time.Minute) {
		if err := store.Complete(b.ctx, b.db.Pool, store.LeaseOf(j)); err != nil {
			t.Fatal(err)
		}
	}
	again := mustInsert(t, b, p)
	if !again.Existing || again.Job.ID != first.Job.ID || again.Job.State != queue.StateCompleted {
		t.Fatalf("after completion: %+v; want the completed job %d", again, first.Job.ID)
	}
	n, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{p, p})
	if err != nil || n != 0 {
		t.Fatalf("batch after completion inserted %d (%v), want 0", n, err)
	}
	if p2 := mustInsert(t, b, store.InsertParams{Kind: "plain", UniqueKey: "plain"}); p2.Existing || p2.Job.ID == plain.Job.ID {
		t.Fatalf("a plain key is free once its job completed: %+v", p2)
	}
	// An operator retry of a job whose key another job holds now is refused clearly.
	other := mustInsert(t, b, store.InsertParams{Kind: "plain", UniqueKey: "plain"})
	if !other.Existing {
		t.Fatal("want the new holder")
	}
	_, err = store.RetryJob(b.ctx, b.db.Pool, plain.Job.ID)
	if !errors.Is(err, queue.ErrWrongState) || !strings.Contains(err.Error(), "another job now holds its unique key") {
		t.Fatalf("retry of a job whose key is held: %v", err)
	}
	if j := b.job(t, plain.Job.ID); j.State != queue.StateCompleted {
		t.Fatalf("refused retry changed the job: %s", j.State)
	}
}

func TestUniqueOptsValidation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		u     queue.UniqueOpts
		field string
	}{
		{queue.UniqueOpts{ByPeriod: time.Millisecond}, "unique.by_period"},
		{queue.UniqueOpts{ByPeriod: -time.Hour}, "unique.by_period"},
		{queue.UniqueOpts{ArgsFields: []string{"a"}}, "unique.args_fields"},
		{queue.UniqueOpts{ByState: []queue.State{queue.StateAvailable, queue.StateCompleted}}, "unique.by_state"},
		{queue.UniqueOpts{ByState: []queue.State{"done"}}, "unique.by_state"},
	}
	for _, c := range cases {
		err := store.ValidateInsert(store.InsertParams{Kind: "k", Unique: c.u})
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("%+v: %v, want a validation error of %s", c.u, err, c.field)
		}
	}
	if err := store.ValidateInsert(store.InsertParams{Kind: "k", Unique: queue.UniqueOpts{ByState: queue.JobStates()}}); err != nil {
		t.Errorf("every state: %v", err)
	}
}

// Fifty inserters, each on its own connection, enqueue the same unique job at once
// (single inserts and COPY batches with duplicates inside them): exactly one row is
// inserted, and every single insert gets that row back.
func TestUniqueInsertRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const inserters = 50
	u := queue.UniqueOpts{ByArgs: true, ByState: append(queue.UnfinishedStates(), queue.StateCompleted)}
	p := store.InsertParams{Kind: "race", Args: []byte(`{"customer":7}`), Unique: u}
	conns := make([]*pgx.Conn, inserters)
	for i := range conns {
		c, err := pgx.Connect(b.ctx, b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		conns[i] = c
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	ids := make([]int64, inserters)
	inserted := make([]int64, inserters)
	errs := make([]error, inserters)
	for i := range inserters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if i%2 == 0 {
				res, err := store.Insert(b.ctx, conns[i], p)
				if err != nil {
					errs[i] = err
					return
				}
				ids[i] = res.Job.ID
				if !res.Existing {
					inserted[i] = 1
				}
				return
			}
			other := store.InsertParams{Kind: "race", Args: []byte(fmt.Sprintf(`{"customer":%d}`, 1000+i)), Unique: u}
			n, err := store.InsertMany(b.ctx, conns[i], []store.InsertParams{p, other, p, other})
			if err != nil {
				errs[i] = err
				return
			}
			inserted[i] = n - 1 // other is new in every batch
		}()
	}
	close(start)
	wg.Wait()
	var total int64
	for i := range inserters {
		if errs[i] != nil {
			t.Fatalf("inserter %d: %v", i, errs[i])
		}
		total += inserted[i]
	}
	if total != 1 {
		t.Fatalf("%d inserters inserted the unique job, want exactly 1", total)
	}
	var rows int
	var id int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*), min(id) FROM fenceq_jobs WHERE args = '{"customer":7}'`).Scan(&rows, &id); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d rows of the unique job", rows)
	}
	for i := 0; i < inserters; i += 2 {
		if ids[i] != id {
			t.Fatalf("inserter %d got job %d, want the one row %d", i, ids[i], id)
		}
	}
}

// Tags are validated, stored, returned and filtered on, for single inserts and batches.
func TestTags(t *testing.T) {
	t.Parallel()
	b := setup(t)
	red := mustInsert(t, b, store.InsertParams{Kind: "t", Tags: []string{"red", "big", "red"}})
	if !slices.Equal(red.Job.Tags, []string{"red", "big"}) {
		t.Fatalf("tags %v, want [red big] (duplicates dropped)", red.Job.Tags)
	}
	plain := mustInsert(t, b, store.InsertParams{Kind: "t"})
	if plain.Job.Tags != nil {
		t.Fatalf("untagged job has tags %v", plain.Job.Tags)
	}
	if n, err := store.InsertMany(b.ctx, b.db.Pool, []store.InsertParams{{Kind: "t", Tags: []string{"red"}}, {Kind: "t", Tags: []string{"blue"}}}); err != nil || n != 2 {
		t.Fatalf("batch: %d %v", n, err)
	}
	got, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{Tag: "red"}})
	if err != nil || len(got) != 2 || got[1].ID != red.Job.ID || !slices.Contains(got[0].Tags, "red") {
		t.Fatalf("list --tag red: %v %v", got, err)
	}
	claimed := b.claim(t, "w", 10, time.Minute)
	if len(claimed) != 4 || !slices.Equal(claimed[0].Tags, []string{"red", "big"}) && !slices.Equal(claimed[len(claimed)-1].Tags, []string{"blue"}) {
		t.Fatalf("claimed rows carry their tags: %v", claimed)
	}
	for _, bad := range [][]string{{""}, {"-x"}, {strings.Repeat("a", 65)}, {"a b"}} {
		var ve *queue.ValidationError
		if err := store.ValidateInsert(store.InsertParams{Kind: "t", Tags: bad}); !errors.As(err, &ve) || ve.Field != "tags" {
			t.Errorf("tags %q: %v, want a validation error of tags", bad, err)
		}
	}
	many := make([]string, queue.MaxTags+1)
	for i := range many {
		many[i] = fmt.Sprintf("t%d", i)
	}
	if err := store.ValidateInsert(store.InsertParams{Kind: "t", Tags: many}); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("%d tags: %v", len(many), err)
	}
	if _, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{Tag: "a b"}}); !errors.Is(err, queue.ErrInvalid) {
		t.Errorf("list with a bad tag: %v", err)
	}
}

// A claim with Kinds takes only those kinds; the others stay available, attempt 0, and
// are listed as unknown until a live worker of their queue knows their kind.
func TestClaimKindsAndUnknownKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	newer := make([]*queue.JobRow, 3)
	for i := range newer {
		newer[i] = b.insert(t, store.InsertParams{Kind: "new"})
	}
	old := b.insert(t, store.InsertParams{Kind: "old"})
	got, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: "default", WorkerID: "w", Limit: 10, Lease: time.Minute, Kinds: []string{"old"}})
	if err != nil || len(got) != 1 || got[0].ID != old.ID {
		t.Fatalf("claim of kind old: %v %v", got, err)
	}
	for _, j := range newer {
		if j := b.job(t, j.ID); j.State != queue.StateAvailable || j.Attempt != 0 || j.LeaseGen != 0 {
			t.Fatalf("job of kind new after a claim of old: %s attempt %d gen %d", j.State, j.Attempt, j.LeaseGen)
		}
	}
	// The floor: the last job of another kind ahead of the first claimable one.
	floor, err := store.OtherKindAhead(b.ctx, b.db.Pool, "default", []string{"old"}, store.CursorBefore(got))
	if err != nil || floor == nil || floor.ID != newer[2].ID {
		t.Fatalf("other kind ahead: %+v %v, want job %d", floor, err, newer[2].ID)
	}
	if f, err := store.OtherKindAhead(b.ctx, b.db.Pool, "default", []string{"old", "new"}, nil); err != nil || f != nil {
		t.Fatalf("no other kind: %+v %v", f, err)
	}

	unknown := func() []*queue.JobRow {
		t.Helper()
		js, err := store.ListJobs(b.ctx, b.db.Pool, queue.ListParams{JobFilter: queue.JobFilter{UnknownKinds: true}})
		if err != nil {
			t.Fatal(err)
		}
		n, err := store.CountUnknownKinds(b.ctx, b.db.Pool, 0)
		if err != nil || n != int64(len(js)) {
			t.Fatalf("count %d (%v), list %d", n, err, len(js))
		}
		return js
	}
	if js := unknown(); len(js) != 3 {
		t.Fatalf("no worker: %d unknown, want the 3 waiting jobs", len(js))
	}
	if err := store.RegisterWorker(b.ctx, b.db.Pool, "w-old", "h", 1, []string{"default"}, []string{"old"}); err != nil {
		t.Fatal(err)
	}
	if err := store.RegisterWorker(b.ctx, b.db.Pool, "w-other", "h", 2, []string{"other"}, []string{"new"}); err != nil {
		t.Fatal(err)
	}
	if js := unknown(); len(js) != 3 {
		t.Fatalf("workers that know new serve another queue: %d unknown, want 3", len(js))
	}
	if err := store.RegisterWorker(b.ctx, b.db.Pool, "w-new", "h", 3, []string{"default"}, []string{"new", "old"}); err != nil {
		t.Fatal(err)
	}
	if js := unknown(); len(js) != 0 {
		t.Fatalf("a live worker knows new: %d unknown", len(js))
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_workers SET heartbeat_at = now() - interval '1 hour' WHERE id = 'w-new'`); err != nil {
		t.Fatal(err)
	}
	if js := unknown(); len(js) != 3 {
		t.Fatalf("the worker that knows new is stale: %d unknown, want 3", len(js))
	}
}
