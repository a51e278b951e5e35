package store_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// One ClaimMany claims each queue up to its own limit, in claim order, after its own
// cursor: a queue with a cursor gets only the jobs after it, a paused queue in the
// middle of the list gets nothing, and every row carries its queue and a new lease.
func TestClaimManyPerQueueLimitsAndCursors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := map[string][]int64{}
	for _, q := range []string{"a", "b", "c", "d"} {
		for range 5 {
			ids[q] = append(ids[q], b.insert(t, store.InsertParams{Queue: q}).ID)
		}
	}
	if err := store.SetQueuePaused(b.ctx, b.db.Pool, "c", true); err != nil {
		t.Fatal(err)
	}
	// b's cursor is its third job: only its last two are after it.
	bj := b.job(t, ids["b"][2])
	cur := &store.ClaimCursor{Priority: bj.Priority, RunAt: bj.RunAt, ID: bj.ID}
	got, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: "a", Limit: 2}, {Name: "c", Limit: 5}, {Name: "b", Limit: 5, After: cur},
			{Name: "d", Limit: 0}, {Name: "none", Limit: 3}}})
	if err != nil {
		t.Fatalf("claim many: %v", err)
	}
	byQueue := map[string][]int64{}
	for _, j := range got {
		if j.State != queue.StateRunning || j.LeaseGen != 1 || j.Attempt != 1 || j.LeasedBy == nil || *j.LeasedBy != "w" {
			t.Fatalf("claimed job %d: %s gen %d attempt %d by %v", j.ID, j.State, j.LeaseGen, j.Attempt, j.LeasedBy)
		}
		byQueue[j.Queue] = append(byQueue[j.Queue], j.ID)
	}
	for q := range byQueue {
		slices.Sort(byQueue[q])
	}
	want := map[string][]int64{"a": ids["a"][:2], "b": ids["b"][3:]}
	if len(byQueue) != len(want) || !slices.Equal(byQueue["a"], want["a"]) || !slices.Equal(byQueue["b"], want["b"]) {
		t.Fatalf("claimed %v, want %v (c paused, d with no limit)", byQueue, want)
	}
	for _, id := range ids["c"] {
		if j := b.job(t, id); j.State != queue.StateAvailable || j.LeaseGen != 0 {
			t.Fatalf("job %d of the paused queue: %s gen %d", id, j.State, j.LeaseGen)
		}
	}
	// The rest of a, without a cursor, and nothing of b behind its cursor is lost: a
	// claim from the start of b takes its first three.
	rest, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w2", Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: "b", Limit: 10}, {Name: "a", Limit: 10}}})
	if err != nil || len(rest) != 6 {
		t.Fatalf("second claim: %d jobs, %v; want 6", len(rest), err)
	}
	for _, j := range rest {
		if *j.LeasedBy != "w2" || (j.Queue == "b") != slices.Contains(ids["b"][:3], j.ID) {
			t.Fatalf("second claim: job %d of %s by %s", j.ID, j.Queue, *j.LeasedBy)
		}
	}
}

// ClaimMany with Kinds claims only those kinds in every queue, and OtherKindsAhead
// finds in one statement, per queue, the last job of another kind before a position.
func TestClaimManyKindsAndOtherKindsAhead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ghostA, ghostB int64
	for i := range 3 {
		ghostA = b.insert(t, store.InsertParams{Queue: "a", Kind: "ghost"}).ID
		if i < 2 {
			ghostB = b.insert(t, store.InsertParams{Queue: "b", Kind: "ghost"}).ID
		}
	}
	known := []int64{b.insert(t, store.InsertParams{Queue: "a", Kind: "k"}).ID, b.insert(t, store.InsertParams{Queue: "b", Kind: "k"}).ID}
	b.insert(t, store.InsertParams{Queue: "c", Kind: "k"})
	got, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute, Kinds: []string{"k"},
		Queues: []store.QueueClaim{{Name: "a", Limit: 10}, {Name: "b", Limit: 10}}})
	if err != nil || !slices.Equal(jobIDs(got), known) {
		t.Fatalf("claim of kind k: %v %v, want %v", jobIDs(got), err, known)
	}
	before := func(q string) *store.ClaimCursor {
		for _, j := range got {
			if j.Queue == q {
				return store.CursorBefore([]*queue.JobRow{j})
			}
		}
		return nil
	}
	floors, err := store.OtherKindsAhead(b.ctx, b.db.Pool, []string{"k"}, []store.QueueBefore{
		{Name: "a", Before: before("a")}, {Name: "c"}, {Name: "b", Before: before("b")}, {Name: "empty"}})
	if err != nil || len(floors) != 4 {
		t.Fatalf("other kinds ahead: %v %v", floors, err)
	}
	if floors[0] == nil || floors[0].ID != ghostA || floors[1] != nil || floors[2] == nil || floors[2].ID != ghostB || floors[3] != nil {
		t.Fatalf("floors %+v %+v %+v %+v, want ghosts %d, none, %d, none", floors[0], floors[1], floors[2], floors[3], ghostA, ghostB)
	}
	// Before the first ghost of a there is nothing of another kind.
	first := b.job(t, ghostA-4)
	if first.Queue != "a" || first.Kind != "ghost" {
		t.Fatalf("job %d is %s/%s, want a's first ghost", first.ID, first.Queue, first.Kind)
	}
	none, err := store.OtherKindsAhead(b.ctx, b.db.Pool, []string{"k"}, []store.QueueBefore{
		{Name: "a", Before: &store.ClaimCursor{Priority: first.Priority, RunAt: first.RunAt, ID: first.ID}}})
	if err != nil || none[0] != nil {
		t.Fatalf("other kinds before a's first job: %+v %v", none[0], err)
	}
}

// With Max, ClaimMany takes at most that many jobs in all, visiting the queues in their
// order: the first queues get their limits, the next what is left, the rest nothing.
func TestClaimManyMax(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, q := range []string{"a", "b", "c"} {
		for range 5 {
			b.insert(t, store.InsertParams{Queue: q})
		}
	}
	got, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute, Max: 7,
		Queues: []store.QueueClaim{{Name: "c", Limit: 4}, {Name: "a", Limit: 5}, {Name: "b", Limit: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, j := range got {
		n[j.Queue]++
	}
	if len(got) != 7 || n["c"] != 4 || n["a"] != 3 || n["b"] != 0 {
		t.Fatalf("claimed %d jobs %v with Max 7, want c:4 a:3", len(got), n)
	}
	var running int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_jobs WHERE state <> 'available'`).Scan(&running); err != nil || running != 7 {
		t.Fatalf("%d jobs not available (%v), want the 7 claimed", running, err)
	}
}

// ClaimMany refuses a queue listed twice and a lease that is not positive, and claims
// nothing from an empty list.
func TestClaimManyBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute,
		Queues: []store.QueueClaim{{Name: "a", Limit: 1}, {Name: "a", Limit: 2}}})
	if !errors.Is(err, queue.ErrInvalid) || !strings.Contains(err.Error(), `"a" listed twice`) {
		t.Fatalf("queue listed twice: %v", err)
	}
	if _, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Queues: []store.QueueClaim{{Name: "a", Limit: 1}}}); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("no lease: %v", err)
	}
	if got, err := store.ClaimMany(b.ctx, b.db.Pool, store.ClaimManyParams{WorkerID: "w", Lease: time.Minute}); err != nil || got != nil {
		t.Fatalf("no queues: %v %v", got, err)
	}
}

// The plan of ClaimMany scans the claim index per queue with the cursor's row
// comparison as an index condition, with or without a cursor, and updates the rows by
// primary key.
func TestClaimManyPlan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO fenceq_jobs (queue, kind) SELECT 'q' || (i % 100), 'k' FROM generate_series(1, 20000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `ANALYZE fenceq_jobs`); err != nil {
		t.Fatal(err)
	}
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	var plan []string
	rows, err := tx.Query(b.ctx, "EXPLAIN (COSTS OFF) "+store.SQLClaimManyKinds, "w", int64(60e6), 15,
		[]string{"q1", "q2", "q3"}, []int32{5, 5, 5}, []*int16{nil, new(int16(1)), nil},
		[]*time.Time{nil, new(time.Now()), nil}, []*int64{nil, new(int64(500)), nil}, []string{"k"})
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	claimScan := lineWith(plan, "Index Scan using fenceq_jobs_claim_idx")
	if claimScan < 0 || claimScan+1 >= len(plan) || !strings.Contains(plan[claimScan+1], "Index Cond") ||
		!strings.Contains(plan[claimScan+1], "ROW(priority, run_at, id) > ROW(") {
		t.Fatalf("the claim scan does not start at the cursor:\n%s", text)
	}
	// An index scan or a bitmap index scan of the primary key (which kept its name when
	// the table became the hot set), as the planner prefers for the batch's size.
	if !strings.Contains(text, "Index Scan using fenceq_jobs_pkey") && !strings.Contains(text, "Bitmap Index Scan on fenceq_jobs_pkey") {
		t.Fatalf("the update does not find its rows by primary key:\n%s", text)
	}
	if strings.Contains(text, "Hash Join") || strings.Contains(text, "Seq Scan on fenceq_jobs") {
		t.Fatalf("a scan of the whole table:\n%s", text)
	}
}

// lineWith returns the index of the first of lines containing s, or -1.
func lineWith(lines []string, s string) int {
	for i, l := range lines {
		if strings.Contains(l, s) {
			return i
		}
	}
	return -1
}
