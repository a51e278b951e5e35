package store_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// seedSearch fills both tables of the jobs with rows rows each, of which the filters
// below match only a handful, and analyzes them, so that the planner has the statistics
// of a long history: a condition matching a few of many rows is served by its index.
// The plans then follow from the data, not from settings (enable_seqscan stays on).
func seedSearch(t *testing.T, b *testBundle, rows int) {
	t.Helper()
	for _, table := range []string{"fenceq_jobs_hot", "fenceq_jobs_history"} {
		state, finished := "'available'", "NULL"
		rare := "'retryable'"
		if table == "fenceq_jobs_history" {
			state, finished, rare = "'completed'", "now()", "'cancelled'"
		}
		_, err := b.db.Pool.Exec(b.ctx, fmt.Sprintf(`
INSERT INTO %[1]s (id, queue, kind, args, state, finished_at, created_at, metadata, tags, errors) OVERRIDING SYSTEM VALUE
SELECT nextval(pg_get_serial_sequence('fenceq_jobs_hot', 'id')),
       CASE WHEN g %% 1000 = 7 THEN 'rareq' ELSE 'q' || (g %% 5) END,
       CASE WHEN g %% 1000 = 7 THEN 'rarekind' ELSE 'k' || (g %% 7) END,
       jsonb_build_object('customer', g, 'period', '2026-01'),
       CASE WHEN g %% 1000 = 7 THEN %[4]s ELSE %[2]s END, %[3]s,
       now() - (g || ' minutes')::interval,
       CASE WHEN g %% 100 = 0 THEN jsonb_build_object('tenant', g) ELSE '{}' END,
       CASE WHEN g %% 1000 = 7 THEN ARRAY['raretag'] ELSE '{}' END,
       CASE WHEN g %% 50 = 0 THEN jsonb_build_array(jsonb_build_object('error', 'timeout after ' || g || 'ms', 'attempt', 1))
            WHEN g %% 1000 = 7 THEN jsonb_build_array(jsonb_build_object('error', 'dial tcp: connection refused', 'attempt', 1))
            ELSE '[]' END
FROM generate_series(1, %[5]d) g`, table, state, finished, rare, rows))
		if err != nil {
			t.Fatalf("seed %s: %v", table, err)
		}
		if _, err := b.db.Pool.Exec(b.ctx, "ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSearchFiltersUseTheirIndexes proves that each filter of a job search is served by
// its index on both tables: the plan of the very statement ListJobsPage sends, with
// default planner settings, names both indexes. The data make the choice plain: each
// filter matches about 0.1% of 20,000 rows per table, where walking the whole table
// costs far more than the index.
// partitionIndex names the index, attached to history's index name, of the partition of
// history that holds the newest finished job: a plan reads each partition through its
// own indexes.
func partitionIndex(t *testing.T, b *testBundle, name string) string {
	t.Helper()
	var part string
	if err := b.db.Pool.QueryRow(b.ctx, `
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_index x ON x.indexrelid = c.oid
WHERE i.inhparent = $1::regclass
  AND x.indrelid = (SELECT tableoid FROM fenceq_jobs_history ORDER BY id DESC LIMIT 1)`, name).Scan(&part); err != nil {
		t.Fatalf("the partition's index of %s: %v", name, err)
	}
	return part
}

func TestSearchFiltersUseTheirIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedSearch(t, b, 20_000)
	var created time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT now() - interval '20 minutes 30 seconds'`).Scan(&created); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		f       queue.JobFilter
		hot     string
		history string
		want    int
	}{
		// The hot set holds the work in flight and has no search indexes of its own
		// (migration 000018): only history's indexes are asserted, besides the partial
		// indexes the hot set already has.
		{"state", queue.JobFilter{State: queue.StateCancelled}, "", "fenceq_jobs_history_failed_idx", 20},
		// Completed jobs, most of history, have no entry in it (migration 000022): the
		// search walks the primary key newest first, a match in nearly every row.
		{"state completed", queue.JobFilter{State: queue.StateCompleted}, "", "fenceq_jobs_history_pkey", 19_980},
		// The hot set's partial index of due jobs serves the retryable state.
		{"state hot", queue.JobFilter{State: queue.StateRetryable}, "fenceq_jobs_due_idx", "", 20},
		{"queue", queue.JobFilter{Queue: "rareq"}, "", "fenceq_jobs_history_queue_idx", 40},
		{"kind", queue.JobFilter{Kind: "rarekind"}, "", "fenceq_jobs_history_kind_idx", 40},
		{"tag", queue.JobFilter{Tag: "raretag"}, "fenceq_jobs_tags_idx", "fenceq_jobs_history_tags_idx", 40},
		{"args", queue.JobFilter{Args: json.RawMessage(`{"customer": 4242}`)}, "", "fenceq_jobs_history_args_idx", 2},
		{"metadata", queue.JobFilter{Metadata: json.RawMessage(`{"tenant": 4200}`)}, "", "fenceq_jobs_history_metadata_idx", 2},
		{"error", queue.JobFilter{Error: "Connection REFUSED"}, "", "fenceq_jobs_history_error_idx", 40},
		{"created", queue.JobFilter{CreatedAfter: created, CreatedBefore: created.Add(time.Minute)}, "", "fenceq_jobs_history_created_brin", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			plan, err := store.ExplainList(b.ctx, b.db.Pool, queue.ListParams{JobFilter: c.f, Limit: 50})
			if err != nil {
				t.Fatal(err)
			}
			for _, idx := range []string{c.hot, c.history} {
				if idx == "" {
					continue
				}
				// "a|b": either index serves the condition.
				found := false
				for _, name := range strings.Split(idx, "|") {
					if strings.HasPrefix(name, "fenceq_jobs_history_") {
						name = partitionIndex(t, b, name)
					}
					found = found || strings.Contains(plan, `"Index Name": "`+name+`"`)
				}
				if !found {
					t.Errorf("the plan does not use %s:\n%s", idx, plan)
				}
			}
			// And the search finds exactly the seeded matches, newest first, across
			// pages.
			var got []int64
			// Pages of 7, or of 1,000 for a common match.
			p := queue.ListParams{JobFilter: c.f, Limit: 7}
			if c.want > 1000 {
				p.Limit = 1000
			}
			for {
				pg, err := store.ListJobsPage(b.ctx, b.db.Pool, p)
				if err != nil {
					t.Fatal(err)
				}
				for _, j := range pg.Jobs {
					if len(got) > 0 && j.ID >= got[len(got)-1] {
						t.Fatalf("page order: %d after %d", j.ID, got[len(got)-1])
					}
					got = append(got, j.ID)
				}
				if pg.Next == 0 {
					break
				}
				p.BeforeID = pg.Next
			}
			if len(got) != c.want {
				t.Errorf("%d jobs match, want %d", len(got), c.want)
			}
			n, top, err := store.CountMatching(b.ctx, b.db.Pool, c.f, 0, 0)
			if err != nil || n != c.want || (n > 0 && top != got[0]) {
				t.Errorf("CountMatching = %d, top %d, %v; want %d, %d", n, top, err, c.want, got[0])
			}
		})
	}
}

func TestSearchFilterValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct {
		f     queue.JobFilter
		field string
	}{
		{queue.JobFilter{State: "lost"}, "state"},
		{queue.JobFilter{Queue: "a b"}, "queue"},
		{queue.JobFilter{Args: json.RawMessage(`[1]`)}, "args"},
		{queue.JobFilter{Args: json.RawMessage(`{}`)}, "args"},
		{queue.JobFilter{Metadata: json.RawMessage(`{"a":`)}, "metadata"},
		{queue.JobFilter{Error: "!!"}, "error"},
		{queue.JobFilter{Error: strings.Repeat("a", 201)}, "error"},
		{queue.JobFilter{IDs: []int64{0}}, "ids"},
		{queue.JobFilter{CreatedAfter: time.Unix(10, 0), CreatedBefore: time.Unix(5, 0)}, "created_before"},
	} {
		_, err := store.ListJobsPage(b.ctx, b.db.Pool, queue.ListParams{JobFilter: c.f})
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			t.Errorf("ListJobsPage(%+v): %v; want a validation error naming %s", c.f, err, c.field)
		}
	}
}
