package fenceqtest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// InsertedJob is an unfinished job found by RequireInserted and its kin: its row and
// its decoded arguments.
type InsertedJob[T fenceq.JobArgs] struct {
	*queue.JobRow
	// Args are the job's arguments, decoded from JobRow.EncodedArgs.
	Args T
}

// RequireInsertedOpts narrows the jobs RequireInserted and its kin match, beyond their
// kind. Zero fields match every job.
type RequireInsertedOpts struct {
	// Queue, when set, is the queue the job must be in.
	Queue string
	// Priority, when set, is the priority the job must have.
	Priority *int
	// UniqueKey, when set, is the unique key the job must carry.
	UniqueKey string
}

// RequireInserted returns the one unfinished job of kind T.Kind() that db sees
// (available, scheduled, running or retryable, matching opts; nil opts match every job
// of the kind), with its arguments decoded. It fails the test, saying what it found,
// when there is none or more than one. db is a pool, a connection or a transaction:
// pass the transaction that enqueued the job to see it before it commits.
func RequireInserted[T fenceq.JobArgs](ctx context.Context, t testing.TB, db queue.DBTX, opts *RequireInsertedOpts) *InsertedJob[T] {
	t.Helper()
	return requireN[T](ctx, t, "RequireInserted", db, 1, opts)[0]
}

// RequireInsertedTx is RequireInserted in the caller's transaction: it sees the jobs tx
// enqueued, committed or not, and what was committed before tx's snapshot.
func RequireInsertedTx[T fenceq.JobArgs](ctx context.Context, t testing.TB, tx pgx.Tx, opts *RequireInsertedOpts) *InsertedJob[T] {
	t.Helper()
	return requireN[T](ctx, t, "RequireInsertedTx", tx, 1, opts)[0]
}

// RequireManyInserted returns the n unfinished jobs of kind T.Kind() that db sees,
// matching opts, in the order they were enqueued. It fails the test when their number
// is not n.
func RequireManyInserted[T fenceq.JobArgs](ctx context.Context, t testing.TB, db queue.DBTX, n int, opts *RequireInsertedOpts) []*InsertedJob[T] {
	t.Helper()
	if n < 1 {
		t.Fatalf("fenceqtest: RequireManyInserted: n is %d: want at least 1 (RequireNotInserted checks for none)", n)
	}
	return requireN[T](ctx, t, "RequireManyInserted", db, n, opts)
}

// RequireNotInserted fails the test when db sees an unfinished job of kind T.Kind()
// matching opts.
func RequireNotInserted[T fenceq.JobArgs](ctx context.Context, t testing.TB, db queue.DBTX, opts *RequireInsertedOpts) {
	t.Helper()
	requireN[T](ctx, t, "RequireNotInserted", db, 0, opts)
}

// requireN returns the unfinished jobs of T's kind that match opts, failing the test
// unless there are exactly n.
func requireN[T fenceq.JobArgs](ctx context.Context, t testing.TB, fn string, db queue.DBTX, n int, opts *RequireInsertedOpts) []*InsertedJob[T] {
	t.Helper()
	var zero T
	kind := zero.Kind()
	var o RequireInsertedOpts
	if opts != nil {
		o = *opts
	}
	all, err := unfinishedOfKind(ctx, db, kind)
	if err != nil {
		t.Fatalf("fenceqtest: %s: %v", fn, err)
	}
	var matched []*InsertedJob[T]
	var misses []string
	for _, j := range all {
		if why := o.mismatch(j); why != "" {
			misses = append(misses, fmt.Sprintf("job %d %s", j.ID, why))
			continue
		}
		ij := &InsertedJob[T]{JobRow: j}
		if err := json.Unmarshal(j.EncodedArgs, &ij.Args); err != nil {
			t.Fatalf("fenceqtest: %s: job %d: decode %s args %s into %T: %v", fn, j.ID, kind, j.EncodedArgs, ij.Args, err)
		}
		matched = append(matched, ij)
	}
	if len(matched) == n {
		return matched
	}
	what := fmt.Sprintf("%d unfinished %s job", n, kind)
	if n != 1 {
		what += "s"
	}
	if f := o.String(); f != "" {
		what += " with " + f
	}
	found := fmt.Sprintf("found %d", len(matched))
	if len(matched) > 0 {
		ids := make([]string, len(matched))
		for i, m := range matched {
			ids[i] = fmt.Sprint(m.ID)
		}
		found += " (jobs " + strings.Join(ids, ", ") + ")"
	}
	if len(misses) > 0 {
		found += "; not matching: " + strings.Join(misses, ", ")
	}
	if len(all) == 0 {
		others, err := unfinishedKinds(ctx, db)
		if err != nil {
			t.Fatalf("fenceqtest: %s: %v", fn, err)
		}
		found += "; unfinished jobs visible here by kind: " + others
	}
	t.Fatalf("fenceqtest: %s: want %s, %s", fn, what, found)
	return nil
}

// mismatch says how j differs from what o asks for, "" when it matches.
func (o RequireInsertedOpts) mismatch(j *queue.JobRow) string {
	var diffs []string
	if o.Queue != "" && j.Queue != o.Queue {
		diffs = append(diffs, fmt.Sprintf("is in queue %q", j.Queue))
	}
	if o.Priority != nil && int(j.Priority) != *o.Priority {
		diffs = append(diffs, fmt.Sprintf("has priority %d", j.Priority))
	}
	if o.UniqueKey != "" && (j.UniqueKey == nil || *j.UniqueKey != o.UniqueKey) {
		if j.UniqueKey == nil {
			diffs = append(diffs, "has no unique key")
		} else {
			diffs = append(diffs, fmt.Sprintf("has unique key %q", *j.UniqueKey))
		}
	}
	return strings.Join(diffs, " and ")
}

// String renders the set fields of o, "" when none is set.
func (o RequireInsertedOpts) String() string {
	var parts []string
	if o.Queue != "" {
		parts = append(parts, fmt.Sprintf("queue %q", o.Queue))
	}
	if o.Priority != nil {
		parts = append(parts, fmt.Sprintf("priority %d", *o.Priority))
	}
	if o.UniqueKey != "" {
		parts = append(parts, fmt.Sprintf("unique key %q", o.UniqueKey))
	}
	return strings.Join(parts, ", ")
}

// sqlUnfinishedOfKind lists the unfinished jobs of a kind ($1), oldest first; $2 are
// the unfinished states.
const sqlUnfinishedOfKind = `SELECT id FROM fenceq_jobs WHERE kind = $1 AND state = ANY($2) ORDER BY id`

// sqlUnfinishedKinds counts the unfinished jobs ($1 the unfinished states) by kind.
const sqlUnfinishedKinds = `SELECT kind, count(*) FROM fenceq_jobs WHERE state = ANY($1) GROUP BY kind ORDER BY kind`

func unfinishedOfKind(ctx context.Context, db queue.DBTX, kind string) ([]*queue.JobRow, error) {
	rows, err := db.Query(ctx, sqlUnfinishedOfKind, kind, queue.UnfinishedStates())
	if err != nil {
		return nil, fmt.Errorf("list unfinished %s jobs: %w", kind, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list unfinished %s jobs: %w", kind, err)
	}
	jobs := make([]*queue.JobRow, len(ids))
	for i, id := range ids {
		if jobs[i], err = fenceq.GetJob(ctx, db, id); err != nil {
			return nil, err
		}
	}
	return jobs, nil
}

func unfinishedKinds(ctx context.Context, db queue.DBTX) (string, error) {
	rows, err := db.Query(ctx, sqlUnfinishedKinds, queue.UnfinishedStates())
	if err != nil {
		return "", fmt.Errorf("count unfinished jobs by kind: %w", err)
	}
	var parts []string
	var kind string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &n}, func() error {
		parts = append(parts, fmt.Sprintf("%s %d", kind, n))
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("count unfinished jobs by kind: %w", err)
	}
	if len(parts) == 0 {
		return "none", nil
	}
	return strings.Join(parts, ", "), nil
}
