package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// The SQLSTATEs of migration 000013's functions.
const (
	stateInvalid   = "QF001"
	stateLeaseLost = "QF002"
)

// sqlJob is one call of fenceq_enqueue; nil fields are passed as NULL (the default).
type sqlJob struct {
	Kind        string
	Args        *string
	Queue       *string
	RunAt       *time.Time
	Priority    *int
	UniqueKey   *string
	MaxAttempts *int
	Tags        []string
	Metadata    *string
}

const sqlEnqueue = `SELECT fenceq_enqueue($1::text, $2::jsonb, $3::text, $4::timestamptz, $5::int, $6::text,
    $7::int, $8::text[], $9::jsonb)`

func (j sqlJob) enqueue(ctx context.Context, db queue.DBTX) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, sqlEnqueue, j.Kind, j.Args, j.Queue, j.RunAt, j.Priority, j.UniqueKey,
		j.MaxAttempts, j.Tags, j.Metadata).Scan(&id)
	return id, err
}

// params is the same job as the engine's insert takes it.
func (j sqlJob) params(t *testing.T) store.InsertParams {
	t.Helper()
	p := store.InsertParams{Kind: j.Kind, Priority: j.Priority, Tags: j.Tags}
	if j.Args != nil {
		p.Args = []byte(*j.Args)
	}
	if j.Queue != nil {
		p.Queue = *j.Queue
	}
	if j.RunAt != nil {
		p.RunAt = *j.RunAt
	}
	if j.UniqueKey != nil {
		p.UniqueKey = *j.UniqueKey
	}
	if j.MaxAttempts != nil {
		p.MaxAttempts = *j.MaxAttempts
	}
	if j.Metadata != nil {
		p.Metadata = []byte(*j.Metadata)
	}
	return p
}

// goEnqueue enqueues the job through fenceq.Enqueue.
func (j sqlJob) goEnqueue(ctx context.Context, t *testing.T, db queue.DBTX) *queue.InsertResult {
	t.Helper()
	p := j.params(t)
	opts := &fenceq.InsertOpts{Queue: p.Queue, Priority: p.Priority, RunAt: p.RunAt, MaxAttempts: p.MaxAttempts,
		UniqueKey: p.UniqueKey, Tags: p.Tags}
	if j.Metadata != nil {
		if err := json.Unmarshal([]byte(*j.Metadata), &opts.Metadata); err != nil {
			t.Fatalf("metadata %s: %v", *j.Metadata, err)
		}
	}
	res, err := fenceq.Enqueue(ctx, db, fenceq.RawArgs{KindName: p.Kind, JSON: p.Args}, opts)
	if err != nil {
		t.Fatalf("Go enqueue of %+v: %v", j, err)
	}
	return res
}

func ptr[T any](v T) *T { return &v }

func pgError(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// row is a job's row as JSON, without the columns that differ between two enqueues of
// the same job (its id and times; run_at is compared apart).
func row(ctx context.Context, t *testing.T, db queue.DBTX, id int64) map[string]any {
	t.Helper()
	var b []byte
	err := db.QueryRow(ctx, `SELECT to_jsonb(j) - '{id,created_at,run_at}'::text[] FROM fenceq_jobs j WHERE id = $1`,
		id).Scan(&b)
	if err != nil {
		t.Fatalf("read job %d: %v", id, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func countJobs(ctx context.Context, t *testing.T, db queue.DBTX) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// The same jobs enqueued through Go and through SQL, each into a schema of its own,
// make the same rows.
func TestSQLEnqueueMatchesGo(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	goDB, sqlDB := fenceqtest.New(t, nil), fenceqtest.New(t, nil)
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	many := make([]string, 0, 24)
	for i := range 20 {
		many = append(many, fmt.Sprintf("t%d", i))
	}
	many = append(many, "t0", "t1", "t19") // duplicates are dropped
	jobs := []sqlJob{
		{Kind: "minimal"},
		{Kind: "email.send", Args: ptr(`{"to": "a@example.com", "n": 1.50, "nested": {"z": 1, "a": [true, null]}, "s": "é"}`),
			Queue: ptr("mail-out"), Priority: ptr(0), MaxAttempts: ptr(3), Tags: []string{"b", "a", "b"},
			Metadata: ptr(`{"trace": "x", "n": 2}`)},
		{Kind: "report:daily", RunAt: &later, Priority: ptr(100), MaxAttempts: ptr(1000)},
		{Kind: "order.sync", UniqueKey: ptr("order:42 é ✓"), Queue: ptr("")},
		{Kind: "tagged", Tags: many, Args: ptr(`{}`), MaxAttempts: ptr(0)},
	}
	for i, j := range jobs {
		res := j.goEnqueue(ctx, t, goDB.Pool)
		if res.Existing {
			t.Fatalf("job %d: Go enqueue found an existing job", i)
		}
		id, err := j.enqueue(ctx, sqlDB.Pool)
		if err != nil {
			t.Fatalf("job %d: SQL enqueue: %v", i, err)
		}
		goRow, sqlRow := row(ctx, t, goDB.Pool, res.Job.ID), row(ctx, t, sqlDB.Pool, id)
		gb, _ := json.Marshal(goRow)
		sb, _ := json.Marshal(sqlRow)
		if string(gb) != string(sb) {
			t.Errorf("job %d (%s): rows differ\n Go: %s\nSQL: %s", i, j.Kind, gb, sb)
		}
		var goAt, sqlAt time.Time
		var sqlDue bool
		if err := goDB.Pool.QueryRow(ctx, `SELECT run_at FROM fenceq_jobs WHERE id = $1`, res.Job.ID).Scan(&goAt); err != nil {
			t.Fatal(err)
		}
		if err := sqlDB.Pool.QueryRow(ctx, `SELECT run_at, run_at <= now() FROM fenceq_jobs WHERE id = $1`, id).Scan(&sqlAt, &sqlDue); err != nil {
			t.Fatal(err)
		}
		if j.RunAt != nil && (!goAt.Equal(*j.RunAt) || !sqlAt.Equal(*j.RunAt)) {
			t.Errorf("job %d: run_at Go %v, SQL %v; want %v", i, goAt, sqlAt, *j.RunAt)
		}
		if j.RunAt == nil && !sqlDue {
			t.Errorf("job %d: SQL run_at %v is in the future; want the enqueue's now()", i, sqlAt)
		}
	}
}

// Go and SQL enqueues of one unique key collide: the second returns the first's job.
func TestSQLEnqueueUniqueKeyCollidesWithGo(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)

	goFirst := sqlJob{Kind: "sync", UniqueKey: ptr("acct:1")}.goEnqueue(ctx, t, db.Pool)
	id, err := sqlJob{Kind: "sync", Args: ptr(`{"other": true}`), UniqueKey: ptr("acct:1")}.enqueue(ctx, db.Pool)
	if err != nil || id != goFirst.Job.ID {
		t.Fatalf("SQL enqueue of a key Go holds: id %d, %v; want Go's job %d", id, err, goFirst.Job.ID)
	}
	sqlFirst, err := sqlJob{Kind: "sync", UniqueKey: ptr("acct:2")}.enqueue(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	res := sqlJob{Kind: "sync", UniqueKey: ptr("acct:2")}.goEnqueue(ctx, t, db.Pool)
	if !res.Existing || res.Job.ID != sqlFirst {
		t.Fatalf("Go enqueue of a key SQL holds: %+v; want existing job %d", res, sqlFirst)
	}
	if n := countJobs(ctx, t, db.Pool); n != 2 {
		t.Fatalf("%d jobs; want 2 (one per key)", n)
	}
	// Once the holder is finished the key is free again, for SQL as for Go.
	if _, err := fenceq.CancelJob(ctx, db.Pool, goFirst.Job.ID, "test"); err != nil {
		t.Fatal(err)
	}
	again, err := sqlJob{Kind: "sync", UniqueKey: ptr("acct:1")}.enqueue(ctx, db.Pool)
	if err != nil || again == goFirst.Job.ID {
		t.Fatalf("SQL enqueue after the holder was cancelled: id %d, %v; want a new job", again, err)
	}
}

// Bad input gets the invalid-input SQLSTATE naming the same field as Go's validation,
// and writes no row. Where the limit is not a size, the message is Go's, word for word.
func TestSQLEnqueueValidationMatchesGo(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	big := `{"a": "` + strings.Repeat("x", queue.DefaultMaxArgsBytes) + `"}`
	bigMeta := `{"a": "` + strings.Repeat("x", queue.MaxMetadataBytes) + `"}`
	tags21 := make([]string, 21)
	for i := range tags21 {
		tags21[i] = fmt.Sprintf("t%d", i)
	}
	cases := []struct {
		name  string
		job   sqlJob
		field string
		exact bool // the messages must be equal
	}{
		{"empty kind", sqlJob{Kind: ""}, "kind", true},
		{"kind with a space", sqlJob{Kind: "bad kind"}, "kind", true},
		{"kind starting with -", sqlJob{Kind: "-x"}, "kind", true},
		{"kind with é", sqlJob{Kind: "aé"}, "kind", true},
		{"kind starting with é", sqlJob{Kind: "éa"}, "kind", true},
		{"kind too long", sqlJob{Kind: strings.Repeat("k", 129)}, "kind", true},
		{"kind too long, cut between characters", sqlJob{Kind: strings.Repeat("é", 70)}, "kind", true},
		{"kind with a quote", sqlJob{Kind: "it's"}, "kind", true},
		{"kind with a backslash", sqlJob{Kind: `a\b`}, "kind", true},
		{"kind with a double quote", sqlJob{Kind: `a"b`}, "kind", true},
		{"kind with a tab", sqlJob{Kind: "a\tb"}, "kind", false}, // Go's %q escapes the tab
		{"queue with a slash", sqlJob{Kind: "k", Queue: ptr("a/b")}, "queue", true},
		{"queue too long", sqlJob{Kind: "k", Queue: ptr(strings.Repeat("q", 65))}, "queue", true},
		{"args an array", sqlJob{Kind: "k", Args: ptr(`[1]`)}, "args", true},
		{"args a string", sqlJob{Kind: "k", Args: ptr(`"s"`)}, "args", true},
		{"args null", sqlJob{Kind: "k", Args: ptr(`null`)}, "args", true},
		{"args over 1 MiB", sqlJob{Kind: "k", Args: &big}, "args", false},
		{"priority -1", sqlJob{Kind: "k", Priority: ptr(-1)}, "priority", true},
		{"priority 101", sqlJob{Kind: "k", Priority: ptr(101)}, "priority", true},
		{"max_attempts -1", sqlJob{Kind: "k", MaxAttempts: ptr(-1)}, "max_attempts", true},
		{"max_attempts 1001", sqlJob{Kind: "k", MaxAttempts: ptr(1001)}, "max_attempts", true},
		{"bad tag", sqlJob{Kind: "k", Tags: []string{"ok", "not ok"}}, "tags", true},
		{"empty tag", sqlJob{Kind: "k", Tags: []string{""}}, "tags", true},
		{"tag too long", sqlJob{Kind: "k", Tags: []string{strings.Repeat("t", 65)}}, "tags", true},
		{"21 tags", sqlJob{Kind: "k", Tags: tags21}, "tags", true},
		{"unique key too long", sqlJob{Kind: "k", UniqueKey: ptr(strings.Repeat("u", 256))}, "unique_key", true},
		{"unique key with a tab", sqlJob{Kind: "k", UniqueKey: ptr("a\tb")}, "unique_key", true},
		{"unique key with U+200B", sqlJob{Kind: "k", UniqueKey: ptr("a\u200bb")}, "unique_key", true},
		{"unique key with U+E0001", sqlJob{Kind: "k", UniqueKey: ptr("a\U000E0001b")}, "unique_key", true},
		{"metadata an array", sqlJob{Kind: "k", Metadata: ptr(`[]`)}, "metadata", true},
		{"metadata over 64 KiB", sqlJob{Kind: "k", Metadata: &bigMeta}, "metadata", false},
		{"bad metadata and kind", sqlJob{Kind: "", Metadata: ptr(`1`)}, "metadata", true},
		{"bad queue and kind", sqlJob{Kind: "", Queue: ptr("?")}, "queue", true},
	}
	for _, c := range cases {
		goErr := store.ValidateInsert(c.job.params(t))
		var ve *queue.ValidationError
		if !errors.As(goErr, &ve) {
			t.Errorf("%s: Go validation: %v; want a ValidationError", c.name, goErr)
			continue
		}
		if ve.Field != c.field {
			t.Errorf("%s: Go names field %q; the case expects %q", c.name, ve.Field, c.field)
		}
		_, err := c.job.enqueue(ctx, db.Pool)
		pe := pgError(err)
		if pe == nil || pe.Code != stateInvalid {
			t.Errorf("%s: SQL error %v; want SQLSTATE %s", c.name, err, stateInvalid)
			continue
		}
		if pe.ColumnName != ve.Field || !strings.HasPrefix(pe.Message, "invalid "+ve.Field+": ") {
			t.Errorf("%s: SQL error names column %q, message %q; want field %q as Go's %q", c.name, pe.ColumnName,
				pe.Message, ve.Field, goErr)
		}
		if c.exact && pe.Message != goErr.Error() {
			t.Errorf("%s: messages differ\n Go: %s\nSQL: %s", c.name, goErr, pe.Message)
		}
	}
	if n := countJobs(ctx, t, db.Pool); n != 0 {
		t.Fatalf("%d jobs written by invalid enqueues; want none", n)
	}
	// The valid neighbours of the limits are accepted by both.
	for _, j := range []sqlJob{
		{Kind: strings.Repeat("k", 128), Queue: ptr(strings.Repeat("q", 64)), Priority: ptr(100), MaxAttempts: ptr(1)},
		{Kind: "k", UniqueKey: ptr(strings.Repeat("u", 255)), Tags: append(tags21[:20:20], "t0")},
	} {
		if err := store.ValidateInsert(j.params(t)); err != nil {
			t.Fatalf("Go rejects %+v: %v", j, err)
		}
		if _, err := j.enqueue(ctx, db.Pool); err != nil {
			t.Fatalf("SQL rejects %+v: %v", j, err)
		}
	}
}

// The unique key's printable characters are Go's unicode.IsPrint, code point by code
// point (every one text can hold: not NUL, not a surrogate).
func TestSQLUnprintableClassMatchesGo(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	rows, err := db.Pool.Query(ctx, `
SELECT c FROM generate_series(1, 1114111) c
WHERE c NOT BETWEEN 55296 AND 57343 AND chr(c) ~ fenceq_unprintable_class()`)
	if err != nil {
		t.Fatal(err)
	}
	sqlSet, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	var goSet []int32
	for r := rune(1); r <= unicode.MaxRune; r++ {
		if (r < 0xD800 || r > 0xDFFF) && !unicode.IsPrint(r) {
			goSet = append(goSet, r)
		}
	}
	if len(goSet) == 0 {
		t.Fatal("Go reports no unprintable code point")
	}
	for i := 0; i < max(len(goSet), len(sqlSet)); i++ {
		if i >= len(goSet) || i >= len(sqlSet) || goSet[i] != sqlSet[i] {
			var g, s any = "none", "none"
			if i < len(goSet) {
				g = fmt.Sprintf("%U", goSet[i])
			}
			if i < len(sqlSet) {
				s = fmt.Sprintf("%U", sqlSet[i])
			}
			t.Fatalf("unprintable code point #%d: Go %v, SQL %v (Unicode %s; regenerate fenceq_unprintable_class in a new migration)",
				i, g, s, unicode.Version)
		}
	}
}

// An enqueue in a transaction that rolls back leaves no job; one that commits wakes the
// queue's listeners.
func TestSQLEnqueueRollbackAndWake(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, err := sqlJob{Kind: "k"}.enqueue(ctx, tx)
	if err != nil || id == 0 {
		t.Fatalf("enqueue in a transaction: %d, %v", id, err)
	}
	if n := countJobs(ctx, t, tx); n != 1 {
		t.Fatalf("the transaction sees %d jobs; want its own 1", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countJobs(ctx, t, db.Pool); n != 0 {
		t.Fatalf("%d jobs after the rollback; want none", n)
	}

	listener, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, `LISTEN `+pgx.Identifier{store.ChannelPrefix + db.Schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := (sqlJob{Kind: "k", Queue: ptr("wake-me")}).enqueue(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := listener.Conn().WaitForNotification(wctx)
	if err != nil || n.Payload != "wake-me" {
		t.Fatalf("notification after a committed SQL enqueue: %+v, %v; want queue wake-me", n, err)
	}
}

// claim leases the one available job of queue q through the engine.
func claim(ctx context.Context, t *testing.T, db *pgxpool.Pool, q string, lease time.Duration) *queue.JobRow {
	t.Helper()
	jobs, err := store.Claim(ctx, db, store.ClaimParams{Queue: q, WorkerID: "w-" + q, Limit: 1, Lease: lease})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim from %s: %d jobs, %v; want 1", q, len(jobs), err)
	}
	return jobs[0]
}

// completeInTx writes a result row and completes the job under (id, gen) in one
// transaction, as a worker in another language does, and returns the completion's error
// (the transaction is rolled back then).
func completeInTx(ctx context.Context, t *testing.T, db *pgxpool.Pool, id, gen int64, output string) error {
	t.Helper()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, id, gen); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT fenceq_complete($1, $2, $3::jsonb)`, id, gen, output); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func results(ctx context.Context, t *testing.T, db queue.DBTX) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A stale holder's SQL completion is rejected with the lease-lost SQLSTATE and its
// result row rolls back; the holder of the current lease commits both.
func TestSQLCompleteIsFenced(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE results (job_id bigint, lease_gen bigint)`); err != nil {
		t.Fatal(err)
	}
	id, err := sqlJob{Kind: "invoice", Queue: ptr("billing")}.enqueue(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	stale := claim(ctx, t, db.Pool, "billing", time.Minute)
	// The operator revokes the lease: the generation moves on, the job is available.
	if _, err := fenceq.RequeueJob(ctx, db.Pool, id); err != nil {
		t.Fatal(err)
	}
	j, err := fenceq.GetJob(ctx, db.Pool, id)
	if err != nil || j.LeaseGen == stale.LeaseGen || j.State != queue.StateAvailable {
		t.Fatalf("after requeue: %+v, %v; want the lease revoked", j, err)
	}

	// Another worker claims the job: it runs again, under the next generation.
	current := claim(ctx, t, db.Pool, "billing", time.Minute)

	err = completeInTx(ctx, t, db.Pool, id, stale.LeaseGen, `{"total": 1}`)
	if pe := pgError(err); pe == nil || pe.Code != stateLeaseLost {
		t.Fatalf("stale completion: %v; want SQLSTATE %s", err, stateLeaseLost)
	}
	if n := results(ctx, t, db.Pool); n != 0 {
		t.Fatalf("%d result rows after the stale completion; want none", n)
	}
	if j, _ := fenceq.GetJob(ctx, db.Pool, id); j.State != queue.StateRunning || j.LeaseGen != current.LeaseGen || j.Output != nil {
		t.Fatalf("job after the stale completion: %+v; want it running under the current lease, without output", j)
	}
	// The rejection is recorded afterwards, on request, only for a lease not held.
	var recorded bool
	if err := db.Pool.QueryRow(ctx, `SELECT fenceq_record_stale($1, $2, 'py-worker')`, id, stale.LeaseGen).Scan(&recorded); err != nil || !recorded {
		t.Fatalf("record the stale write: %v, %v; want recorded", recorded, err)
	}

	if err := db.Pool.QueryRow(ctx, `SELECT fenceq_record_stale($1, $2)`, id, current.LeaseGen).Scan(&recorded); err != nil || recorded {
		t.Fatalf("record a held lease as stale: %v, %v; want nothing recorded", recorded, err)
	}
	var events int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_lease_events
        WHERE job_id = $1 AND lease_gen = $2 AND kind = $3 AND worker_id = 'py-worker'`,
		id, stale.LeaseGen, string(queue.EventStaleWriteRejected)).Scan(&events); err != nil || events != 1 {
		t.Fatalf("stale_write_rejected events of the stale lease: %d, %v; want 1", events, err)
	}

	if err := completeInTx(ctx, t, db.Pool, id, current.LeaseGen, `{"total": 2}`); err != nil {
		t.Fatalf("completion under the current lease: %v", err)
	}
	if n := results(ctx, t, db.Pool); n != 1 {
		t.Fatalf("%d result rows after the completion; want 1", n)
	}
	j, err = fenceq.GetJob(ctx, db.Pool, id)
	if err != nil || j.State != queue.StateCompleted || j.FinishedAt == nil || j.LeaseGen != current.LeaseGen ||
		string(j.Output) != `{"total": 2}` {
		t.Fatalf("job after the completion: %+v, %v; want completed with output {\"total\": 2}", j, err)
	}
	// A second completion of the same lease finds the job no longer running.
	if err := completeInTx(ctx, t, db.Pool, id, current.LeaseGen, `null`); pgError(err) == nil || pgError(err).Code != stateLeaseLost {
		t.Fatalf("second completion: %v; want SQLSTATE %s", err, stateLeaseLost)
	}
	// Output over the limit is invalid input.
	big := `"` + strings.Repeat("o", queue.MaxOutputBytes) + `"`
	_, err = db.Pool.Exec(ctx, `SELECT fenceq_complete($1, $2, $3::jsonb)`, id, current.LeaseGen, big)
	if pe := pgError(err); pe == nil || pe.Code != stateInvalid || pe.ColumnName != "output" {
		t.Fatalf("completion with %d bytes of output: %v; want SQLSTATE %s naming output", len(big), err, stateInvalid)
	}
}

// The completion's row lock keeps the reaper away from an expired lease until COMMIT.
func TestSQLCompleteLockHoldsOffReaper(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	id, err := sqlJob{Kind: "slow", Queue: ptr("reap")}.enqueue(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	held := claim(ctx, t, db.Pool, "reap", time.Minute)
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs_hot SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT fenceq_complete($1, $2)`, id, held.LeaseGen); err != nil {
		t.Fatalf("completion of a lease that expired but was not revoked: %v", err)
	}
	// The fault is real: outside the transaction the lease is running and expired.
	var expired bool
	if err := db.Pool.QueryRow(ctx, `SELECT state = 'running' AND lease_expires_at < now() FROM fenceq_jobs WHERE id = $1`, id).Scan(&expired); err != nil || !expired {
		t.Fatalf("committed view of the job: expired %v, %v; want a running job with an expired lease", expired, err)
	}
	revoked, err := store.Reap(ctx, db.Pool, store.ReapParams{HolderFresh: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(revoked) != 0 {
		t.Fatalf("the reaper revoked %+v while the completion held the row", revoked)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	j, err := fenceq.GetJob(ctx, db.Pool, id)
	if err != nil || j.State != queue.StateCompleted || j.LeaseGen != held.LeaseGen {
		t.Fatalf("after commit: %+v, %v; want completed under generation %d", j, err, held.LeaseGen)
	}
}

// The SQL heartbeat extends a held lease by the claim's duration and rejects a lost one.
func TestSQLHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	id, err := sqlJob{Kind: "long", Queue: ptr("hb")}.enqueue(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 40 * time.Second
	held := claim(ctx, t, db.Pool, "hb", lease)
	// Move the lease's start an hour back, so that an extension is visible whatever the
	// clock did. (Column-free expressions: Citus routes no STABLE function over columns.)
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs_hot SET heartbeat_at = now() - interval '1 hour',
        lease_expires_at = now() - interval '1 hour' + $2::bigint * interval '1 microsecond' WHERE id = $1`,
		id, lease.Microseconds()); err != nil {
		t.Fatal(err)
	}
	var before time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT lease_expires_at FROM fenceq_jobs WHERE id = $1`, id).Scan(&before); err != nil {
		t.Fatal(err)
	}
	var got time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT fenceq_heartbeat($1, $2)`, id, held.LeaseGen).Scan(&got); err != nil {
		t.Fatalf("heartbeat of a held lease: %v", err)
	}
	var stored time.Time
	var length time.Duration
	var recent bool
	if err := db.Pool.QueryRow(ctx, `SELECT lease_expires_at, lease_expires_at - heartbeat_at, heartbeat_at > now() - interval '10 minutes'
        FROM fenceq_jobs WHERE id = $1`, id).Scan(&stored, &length, &recent); err != nil {
		t.Fatal(err)
	}
	if !got.Equal(stored) || !got.After(before) || length != lease || !recent {
		t.Fatalf("after heartbeat: returned %v, stored %v (was %v), length %v, heartbeat recent %v; want a lease of %v from now",
			got, stored, before, length, recent, lease)
	}
	if _, err := fenceq.RequeueJob(ctx, db.Pool, id); err != nil {
		t.Fatal(err)
	}
	_, err = db.Pool.Exec(ctx, `SELECT fenceq_heartbeat($1, $2)`, id, held.LeaseGen)
	if pe := pgError(err); pe == nil || pe.Code != stateLeaseLost {
		t.Fatalf("heartbeat of a revoked lease: %v; want SQLSTATE %s", err, stateLeaseLost)
	}
	if j, _ := fenceq.GetJob(ctx, db.Pool, id); j.State != queue.StateAvailable || j.LeaseExpiresAt != nil {
		t.Fatalf("job after the rejected heartbeat: %+v; want it available without a lease", j)
	}
}

// Go and SQL enqueues of one key racing each other make one job, and every one of them
// returns it.
func TestSQLEnqueueUniqueKeyRace(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 8})
	const racers, rounds = 8, 5
	ids := make(chan int64, racers*rounds)
	errs := make(chan error, racers*rounds)
	var wg sync.WaitGroup
	for r := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				if r%2 == 0 {
					id, err := sqlJob{Kind: "race", UniqueKey: ptr("race:1")}.enqueue(ctx, db.Pool)
					ids <- id
					errs <- err
					continue
				}
				p := sqlJob{Kind: "race", UniqueKey: ptr("race:1")}.params(t)
				res, err := fenceq.Enqueue(ctx, db.Pool, fenceq.RawArgs{KindName: p.Kind}, &fenceq.InsertOpts{UniqueKey: p.UniqueKey})
				if err == nil {
					ids <- res.Job.ID
				} else {
					ids <- 0
				}
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(ids)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("racing enqueue: %v", err)
		}
	}
	var first int64
	for id := range ids {
		if first == 0 {
			first = id
		}
		if id != first || id == 0 {
			t.Fatalf("racing enqueues returned jobs %d and %d; want one job", first, id)
		}
	}
	if n := countJobs(ctx, t, db.Pool); n != 1 {
		t.Fatalf("%d jobs after %d racing enqueues of one key; want 1", n, racers*rounds)
	}
}

// An operator's requeue of a job whose SQL completion is not yet committed waits for the
// completion's row lock, and then finds the job completed: it revokes no lease (the
// completion spent it) and makes the job run again.
func TestSQLCompleteLockHoldsOffRequeue(t *testing.T) {
	t.Parallel()
	// The wait happens on the worker node, which pg_blocking_pids on the coordinator
	// does not see.
	fenceqtest.SkipOnCitus(t, "the requeue's lock wait is observed with pg_blocking_pids on one server")
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	id, err := sqlJob{Kind: "k", Queue: ptr("op")}.enqueue(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	held := claim(ctx, t, db.Pool, "op", time.Minute)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT fenceq_complete($1, $2)`, id, held.LeaseGen); err != nil {
		t.Fatal(err)
	}
	requeued := make(chan error, 1)
	go func() {
		_, err := fenceq.RequeueJob(ctx, db.Pool, id)
		requeued <- err
	}()
	fenceqtest.WaitFor(t, "the requeue waiting for the completion's lock", 30*time.Second, func() bool {
		var waiting bool
		err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))`,
			pid).Scan(&waiting)
		return err == nil && waiting
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-requeued; err != nil {
		t.Fatalf("requeue after the completion committed: %v", err)
	}
	// The requeue acted on the completed job: it runs again under the same generation,
	// and no lease was revoked.
	j, err := fenceq.GetJob(ctx, db.Pool, id)
	if err != nil || j.State != queue.StateAvailable || j.LeaseGen != held.LeaseGen {
		t.Fatalf("job: %+v, %v; want it available again under generation %d", j, err, held.LeaseGen)
	}
	var revoked int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND kind = $2`,
		id, string(queue.EventRevoked)).Scan(&revoked); err != nil || revoked != 0 {
		t.Fatalf("%d revoked lease events, %v; want none: the lease was spent by the completion", revoked, err)
	}
}
