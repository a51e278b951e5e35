package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// sqlTrace sums, per statement, the calls, the time from send to result and the rows
// affected, over the connections of one run: what `fenceq bench --trace-sql` prints to
// find which statement a side waits on.
type sqlTrace struct {
	mu    sync.Mutex
	stmts map[string]*stmtTotals
}

type stmtTotals struct {
	calls int
	total time.Duration
	rows  int64
}

type traceKey struct{}

type traceStart struct {
	sql string
	at  time.Time
}

func newSQLTrace() *sqlTrace { return &sqlTrace{stmts: map[string]*stmtTotals{}} }

// TraceQueryStart implements pgx.QueryTracer.
func (t *sqlTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceKey{}, traceStart{sql: d.SQL, at: time.Now()})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *sqlTrace) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	s, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	key := strings.Join(strings.Fields(s.sql), " ")
	if len(key) > 90 {
		key = key[:90]
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stmts[key]
	if st == nil {
		st = &stmtTotals{}
		t.stmts[key] = st
	}
	st.calls++
	st.total += time.Since(s.at)
	st.rows += d.CommandTag.RowsAffected()
}

// write prints the statements that took the most time, most first.
func (t *sqlTrace) write(w io.Writer, label string, top int) {
	if w == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.stmts))
	for k := range t.stmts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return int(t.stmts[b].total - t.stmts[a].total) })
	fmt.Fprintf(w, "  %s: statements by total time (calls, total, mean, rows affected per call):\n", label)
	for i, k := range keys {
		if i == top {
			break
		}
		st := t.stmts[k]
		fmt.Fprintf(w, "    %7d %9.1fms %7.2fms %7.1f  %s\n", st.calls, float64(st.total)/1e6,
			float64(st.total)/1e6/float64(st.calls), float64(st.rows)/float64(st.calls), k)
	}
}
