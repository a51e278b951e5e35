package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/migrations"
)

// The ui workload measures every page at every size, EXPLAINs every statement the pages
// send, and finds no sequential scan of history; its table has a row per page and the
// ratio of the sizes.
func TestUIMeasuresEveryPageWithoutScanningHistory(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := tiny(t, WorkloadUI)
	cfg.UIRows, cfg.UIRequests = []int{1000, 20_000}, 2
	rep, err := RunUI(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Sizes) != 2 {
		t.Fatalf("%d sizes measured, want 2", len(rep.Sizes))
	}
	for _, s := range rep.Sizes {
		for _, p := range uiPages {
			if s.Millis[p.Name] <= 0 {
				t.Errorf("%d rows: %s not measured", s.Rows, p.Name)
			}
			if len(s.HistorySeqScans[p.Name]) != 0 {
				t.Errorf("%d rows: %s scans history: %v", s.Rows, p.Name, s.HistorySeqScans[p.Name])
			}
		}
	}
	var text, js bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ms at 1k", "ms at 20k", "ratio", "overview", "queues", "jobs?state=running"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, text.String())
		}
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back UIReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Sizes) != 2 {
		t.Fatalf("JSON report: %v\n%s", err, js.String())
	}
}

// The plan check finds a sequential scan of history or of a partition of it that holds
// rows, and RunUI refuses bad sizes.
func TestUIPlanCheckAndSettings(t *testing.T) {
	t.Parallel()
	found := (planNode{NodeType: "Append", Plans: []planNode{{NodeType: "Index Scan", Relation: "fenceq_jobs_hot"},
		{NodeType: "Seq Scan", Relation: "fenceq_jobs_history"},
		{NodeType: "Seq Scan", Relation: "fenceq_jobs_history_0"}}}).seqScans("fenceq_jobs_history", nil)
	if !slices.Equal(found, []string{"fenceq_jobs_history", "fenceq_jobs_history_0"}) {
		t.Errorf("nested sequential scans of history and a partition: found %q", found)
	}
	if found := (planNode{NodeType: "Seq Scan", Relation: "fenceq_jobs_hot"}).seqScans("fenceq_jobs_history", nil); len(found) > 0 {
		t.Errorf("a scan of the hot set was taken for one of history: %q", found)
	}
	cfg := tiny(t, WorkloadUI)
	ctx := context.Background()
	e, err := newEnv(ctx, cfg, "ui")
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	if err := migrations.Up(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	// Empty, history's partitions are read sequentially at no cost, and not reported.
	const scan = `SELECT count(*) FROM fenceq_jobs_history WHERE args ->> 'customer' = $1`
	if got, err := scansHistory(ctx, e.admin, recordedStmt{sql: scan, args: []any{"7"}}); err != nil || got {
		t.Errorf("empty history: scans history %v, %v; want false", got, err)
	}
	if _, err := e.admin.Exec(ctx, `INSERT INTO fenceq_jobs_history (id, kind, state, finished_at) VALUES (1, 'k', 'completed', now())`); err != nil {
		t.Fatal(err)
	}
	for sql, want := range map[string]bool{
		scan: true,
		`SELECT * FROM fenceq_jobs WHERE id = $1::bigint`: false,
	} {
		got, err := scansHistory(ctx, e.admin, recordedStmt{sql: sql, args: []any{"7"}})
		if err != nil || got != want {
			t.Errorf("%s: scans history %v, %v; want %v", sql, got, err, want)
		}
	}
	for _, rows := range [][]int{{10}, {1000, -1}} {
		cfg.UIRows = rows
		if _, err := RunUI(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "--rows") {
			t.Errorf("rows %v: %v, want an error naming --rows", rows, err)
		}
	}
	cfg.UIRows = nil
	if _, err := Run(context.Background(), cfg); err == nil || errors.Is(err, errVerify) {
		t.Errorf("Run of the ui workload: %v, want the pointer to RunUI", err)
	}
}
