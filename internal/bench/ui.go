package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/fenceqweb"
	"github.com/fenceq/fenceq/migrations"
)

// The ui workload: the dashboard's pages' server time at several sizes of retained
// history. Each size gets a schema of its own, seeded with that many finished jobs in
// history (spread over the last day, as a worker with the default retention keeps
// them) beside the same small hot set, lease events and workers; the job counters are
// rolled up and the tables analysed. Then each page is requested through the handler in
// this process, at every size in turn, round after round. Every statement a page sends
// is EXPLAINed: a sequential scan of history fails the run.

// Defaults of the ui workload.
const (
	defaultUIRequests = 20
	// uiHot is the unfinished jobs of every size: the hot set stays the size of the
	// work in flight however much history is kept.
	uiHot = 2000
)

// UIPage is one page the ui workload measures.
type UIPage struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// uiPages are the pages measured; {job} is a finished job's id.
var uiPages = []UIPage{
	{"overview", "/"},
	{"overview (live part)", "/#live"},
	{"queues", "/queues"},
	{"workers", "/workers"},
	{"periodic", "/periodic"},
	{"jobs", "/jobs"},
	{"jobs?state=running", "/jobs?state=running"},
	{"jobs?state=available", "/jobs?state=available"},
	{"jobs?state=completed", "/jobs?state=completed"},
	{"jobs?state=discarded", "/jobs?state=discarded"},
	{"jobs?kind=rare.kind", "/jobs?kind=rare.kind"},
	{"job", "/jobs/{job}"},
}

// UISize is the measurements at one size.
type UISize struct {
	// Rows is the finished jobs retained in history.
	Rows int `json:"rows"`
	// SeedSeconds is how long seeding, rolling up and analysing took.
	SeedSeconds float64 `json:"seed_seconds"`
	// Millis is each page's median server time, by page name.
	Millis map[string]float64 `json:"ms"`
	// HistorySeqScans names, by page, the statements whose plan scans
	// fenceq_jobs_history sequentially.
	HistorySeqScans map[string][]string `json:"history_seq_scans,omitempty"`
}

// UIReport is the outcome of RunUI.
type UIReport struct {
	Workload   string     `json:"workload"`
	Requests   int        `json:"requests"`
	Conditions Conditions `json:"conditions"`
	Pages      []UIPage   `json:"pages"`
	Sizes      []UISize   `json:"sizes"`
}

// RunUI runs the ui workload: cfg.UIRows sizes, cfg.UIRequests requests per page and
// size. Every size is seeded first; then each page is requested at every size in turn,
// round after round, so that a change of the machine's load over the run weighs on all
// sizes alike. It returns the report so far with an error when a page failed or scanned
// history sequentially.
func RunUI(ctx context.Context, cfg Config) (*UIReport, error) {
	cfg.Workload = WorkloadUI
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	base, err := newBaseReport(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rep := &UIReport{Workload: WorkloadUI, Requests: cfg.UIRequests, Conditions: base.Conditions, Pages: uiPages}
	var sites []*uiSite
	defer func() {
		for _, s := range sites {
			s.close()
		}
	}()
	for _, rows := range cfg.UIRows {
		s, err := newUISite(ctx, cfg, rows)
		if err != nil {
			return nil, fmt.Errorf("%d rows: %w", rows, err)
		}
		sites = append(sites, s)
	}
	var bad []string
	for _, p := range uiPages {
		times := make([][]float64, len(sites))
		// One request per size recorded for the plan check, one more to warm the caches.
		for i, s := range sites {
			s.rec.start()
			if err := s.get(ctx, p); err != nil {
				return nil, err
			}
			stmts := s.rec.stop()
			if err := s.get(ctx, p); err != nil {
				return nil, err
			}
			for _, st := range stmts {
				seq, err := scansHistory(ctx, s.env.admin, st)
				if err != nil {
					return nil, fmt.Errorf("%s: explain %s: %w", p.Name, oneLine(st.sql, 120), err)
				}
				if seq {
					s.size.HistorySeqScans[p.Name] = append(s.size.HistorySeqScans[p.Name], st.sql)
					bad = append(bad, fmt.Sprintf("%s at %d rows: %s", p.Name, s.size.Rows, oneLine(st.sql, 160)))
				}
			}
			if cfg.TraceSQL {
				progressf(cfg.Progress, "ui: %d rows: %s: %d statements\n", s.size.Rows, p.Name, len(stmts))
				for _, st := range stmts {
					progressf(cfg.Progress, "    %7.2f ms  %s\n", float64(st.took.Microseconds())/1000, oneLine(st.sql, 110))
				}
			}
			times[i] = make([]float64, 0, cfg.UIRequests)
		}
		for range cfg.UIRequests {
			for i, s := range sites {
				t0 := time.Now()
				if err := s.get(ctx, p); err != nil {
					return nil, err
				}
				times[i] = append(times[i], float64(time.Since(t0).Microseconds())/1000)
			}
		}
		line := fmt.Sprintf("ui: %-22s", p.Name)
		for i, s := range sites {
			slices.Sort(times[i])
			s.size.Millis[p.Name] = times[i][len(times[i])/2]
			line += fmt.Sprintf("  %s %7.2f ms", humanRows(s.size.Rows), s.size.Millis[p.Name])
		}
		progressf(cfg.Progress, "%s\n", line)
	}
	for _, s := range sites {
		rep.Sizes = append(rep.Sizes, s.size)
	}
	if len(bad) > 0 {
		return rep, fmt.Errorf("%w: statements scan fenceq_jobs_history sequentially:\n  %s", errVerify, strings.Join(bad, "\n  "))
	}
	return rep, nil
}

// uiSite is one size of the ui workload: its schema, seeded, and the dashboard over it.
type uiSite struct {
	env  *env
	pool *pgxpool.Pool
	rec  *stmtRecorder
	h    http.Handler
	job  string
	size UISize
}

// newUISite creates a schema, seeds it with rows finished jobs and the rest, rolls the
// job counters up, analyses the tables and opens a dashboard over it.
func newUISite(ctx context.Context, cfg Config, rows int) (_ *uiSite, err error) {
	e, err := newEnv(ctx, cfg, "ui")
	if err != nil {
		return nil, err
	}
	s := &uiSite{env: e, job: strconv.Itoa(rows / 2),
		size: UISize{Rows: rows, Millis: map[string]float64{}, HistorySeqScans: map[string][]string{}}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if err := migrations.Up(ctx, e.pool); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	start := time.Now()
	progressf(cfg.Progress, "ui: seeding %d finished jobs…\n", rows)
	for _, sql := range sqlUISeed {
		args := []any{rows}
		if strings.Contains(sql, "$2") {
			args = append(args, uiHot)
		}
		if _, err := e.admin.Exec(ctx, sql, args...); err != nil {
			return nil, fmt.Errorf("seed: %w\n%s", err, oneLine(sql, 120))
		}
	}
	progressf(cfg.Progress, "ui: rolling up the job counters…\n")
	if err := rollUpCounters(ctx, e.pool); err != nil {
		return nil, err
	}
	for _, t := range []string{"fenceq_jobs_hot", "fenceq_jobs_history", "fenceq_job_counts", "fenceq_lease_events", "fenceq_workers", "fenceq_periodic"} {
		if _, err := e.admin.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
			return nil, fmt.Errorf("vacuum analyze %s: %w", t, err)
		}
	}
	s.size.SeedSeconds = time.Since(start).Seconds()
	s.rec = &stmtRecorder{}
	pcfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	pcfg.MaxConns = int32(max(cfg.Conns, 4))
	pcfg.ConnConfig.Tracer = s.rec
	if s.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if s.h, err = fenceqweb.New(fenceqweb.Config{DB: s.pool, Logger: cfg.Logger}); err != nil {
		return nil, err
	}
	return s, nil
}

// get requests page p through the handler and checks that it answered 200.
func (s *uiSite) get(ctx context.Context, p UIPage) error {
	path, live := strings.ReplaceAll(p.Path, "{job}", s.job), false
	if strings.HasSuffix(path, "#live") {
		path, live = strings.TrimSuffix(path, "#live"), true
	}
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	req.Host = "127.0.0.1" // a loopback name: the dashboard answers no other without auth
	if live {
		req.Header.Set("X-Fenceq-Fragment", "live")
	}
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		return fmt.Errorf("%d rows: GET %s: %d %s", s.size.Rows, path, w.Code, oneLine(w.Body.String(), 300))
	}
	return nil
}

func (s *uiSite) close() {
	if s.pool != nil {
		s.pool.Close()
	}
	s.env.close()
}

// recordedStmt is a statement a page sent, with its arguments and how long it took.
type recordedStmt struct {
	sql  string
	args []any
	took time.Duration
}

// stmtKey carries a recorded statement's index from the start of its trace to its end.
type stmtKey struct{}

// stmtRecorder is a pgx tracer that records the statements sent while it is on.
type stmtRecorder struct {
	mu    sync.Mutex
	on    bool
	stmts []recordedStmt
}

func (r *stmtRecorder) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on, r.stmts = true, nil
}

func (r *stmtRecorder) stop() []recordedStmt {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	return r.stmts
}

// TraceQueryStart records a statement that reads or writes tables (not SET, BEGIN …).
func (r *stmtRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return ctx
	}
	head := strings.ToUpper(strings.TrimSpace(d.SQL))
	if !strings.HasPrefix(head, "SELECT") && !strings.HasPrefix(head, "WITH") {
		return ctx
	}
	var args []any
	for _, a := range d.Args {
		if _, mode := a.(pgx.QueryExecMode); !mode {
			args = append(args, a)
		}
	}
	r.stmts = append(r.stmts, recordedStmt{sql: d.SQL, args: args, took: -time.Duration(time.Now().UnixNano())})
	return context.WithValue(ctx, stmtKey{}, len(r.stmts)-1)
}

// TraceQueryEnd records how long the statement took.
func (r *stmtRecorder) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	i, ok := ctx.Value(stmtKey{}).(int)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on && i < len(r.stmts) {
		r.stmts[i].took += time.Duration(time.Now().UnixNano())
	}
}

// scansHistory EXPLAINs st and reports whether its plan scans sequentially
// fenceq_jobs_history or one of its partitions that holds rows. The planner reads an
// empty partition (those made ahead of the ids in use, the default one) sequentially
// at no cost, whatever the history retained.
func scansHistory(ctx context.Context, c *pgx.Conn, st recordedStmt) (bool, error) {
	var plan []byte
	if err := c.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+st.sql, st.args...).Scan(&plan); err != nil {
		return false, err
	}
	var doc []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &doc); err != nil {
		return false, fmt.Errorf("read plan: %w", err)
	}
	var rels []string
	for _, d := range doc {
		rels = d.Plan.seqScans("fenceq_jobs_history", rels)
	}
	for _, rel := range rels {
		var rows bool
		if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+pgx.Identifier{rel}.Sanitize()+")").Scan(&rows); err != nil {
			return false, fmt.Errorf("look for rows in %s: %w", rel, err)
		}
		if rows {
			return true, nil
		}
	}
	return false, nil
}

// planNode is a node of a JSON plan.
type planNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Plans    []planNode `json:"Plans"`
}

// seqScans appends to found the relations of the plan scanned sequentially that are rel
// or a partition of it (named rel_…).
func (n planNode) seqScans(rel string, found []string) []string {
	if n.NodeType == "Seq Scan" && (n.Relation == rel || strings.HasPrefix(n.Relation, rel+"_")) {
		found = append(found, n.Relation)
	}
	for _, c := range n.Plans {
		found = c.seqScans(rel, found)
	}
	return found
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// sqlUISeed seeds one size: $1 finished jobs in history, ids 1…$1, finished over the
// last 23 hours in id order (0.5 % discarded, 0.1 % cancelled, the rest completed, one
// in ten completed after a failed attempt), over four queues and seven kinds and a rare
// one (1 job in max(100, $1 / 1,000): 100 of them at 10k rows, 1,000 from 100k rows on,
// so that its list page is a full page at every size); $2 unfinished jobs in the hot set (half available, a tenth running, the rest
// scheduled or retryable an hour ahead); 2,000 lease events over the last two hours; 8
// workers; 3 periodic schedules. History's partitions are made first for every id the
// seed takes, as workers make them ahead of the jobs they run.
var sqlUISeed = []string{
	`SELECT fenceq_history_extend($1::bigint + $2::bigint)`, `
INSERT INTO fenceq_jobs_history (id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen,
  leased_by, attempted_at, errors, created_at, finished_at)
OVERRIDING SYSTEM VALUE
SELECT i, (ARRAY['default', 'billing', 'outbox', 'email'])[1 + i % 4],
  CASE WHEN i % GREATEST(100, $1::int / 1000) = 17 THEN 'rare.kind'
       ELSE (ARRAY['invoice', 'order.place', 'outbox.deliver', 'noop', 'sleep', 'report', 'email.send'])[1 + i % 7] END,
  jsonb_build_object('customer_id', i % 5000, 'note', 'invoice for customer ' || (i % 5000)),
  st, 1, f - interval '3 seconds', a, 25, a, 'worker-' || (i % 8), f - interval '1 second',
  CASE WHEN a > 1 OR st = 'discarded'
       THEN jsonb_build_array(jsonb_build_object('at', f - interval '2 seconds', 'attempt', 1, 'lease_gen', 1,
            'worker', 'worker-' || (i % 8), 'error', 'tax service timeout'))
       ELSE '[]'::jsonb END,
  f - interval '3 seconds', f
FROM (
  SELECT i, now() - interval '1 minute' - ($1::int - i) * (interval '23 hours' / $1::int) AS f,
         CASE WHEN i % 200 = 11 THEN 'discarded' WHEN i % 1000 = 13 THEN 'cancelled' ELSE 'completed' END AS st,
         CASE WHEN i % 10 = 5 THEN 2 ELSE 1 END AS a
  FROM generate_series(1, $1::int) AS i) s`, `
INSERT INTO fenceq_jobs_hot (id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen,
  leased_by, heartbeat_at, lease_expires_at, attempted_at, errors, created_at)
OVERRIDING SYSTEM VALUE
SELECT $1::int + i, (ARRAY['default', 'billing', 'outbox', 'email'])[1 + i % 4],
  (ARRAY['invoice', 'order.place', 'outbox.deliver', 'noop', 'sleep', 'report', 'email.send'])[1 + i % 7],
  jsonb_build_object('customer_id', i % 5000), st, 1,
  CASE WHEN st IN ('scheduled', 'retryable') THEN now() + interval '1 hour' ELSE now() - interval '1 second' END,
  CASE WHEN st IN ('running', 'retryable') THEN 1 ELSE 0 END, 25,
  CASE WHEN st IN ('running', 'retryable') THEN 1 ELSE 0 END,
  CASE WHEN st = 'running' THEN 'worker-' || (i % 8) END,
  CASE WHEN st = 'running' THEN now() END,
  CASE WHEN st = 'running' THEN now() + interval '1 hour' END,
  CASE WHEN st IN ('running', 'retryable') THEN now() - interval '1 minute' END,
  CASE WHEN st = 'retryable'
       THEN jsonb_build_array(jsonb_build_object('at', now() - interval '1 minute', 'attempt', 1, 'lease_gen', 1,
            'worker', 'worker-' || (i % 8), 'error', 'tax service timeout'))
       ELSE '[]'::jsonb END,
  now() - interval '2 minutes'
FROM (SELECT i, CASE WHEN i % 10 < 5 THEN 'available' WHEN i % 10 = 5 THEN 'running'
                     WHEN i % 10 < 8 THEN 'scheduled' ELSE 'retryable' END AS st
      FROM generate_series(1, $2::int) AS i) s`,
	`SELECT setval(pg_get_serial_sequence('fenceq_jobs_hot', 'id'), $1::bigint + $2::bigint)`, `
INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail, at)
SELECT 1 + (i * 7919) % ($1::int + $2::int), 1 + i % 3, 'worker-' || (i % 8),
       (ARRAY['revoked', 'stale_write_rejected', 'expired_holder_alive', 'heartbeat_lost'])[1 + i % 4], 'bench',
       now() - (2000 - i) * interval '3.6 seconds'
FROM generate_series(1, 2000) AS i`, `
INSERT INTO fenceq_workers (id, host, pid, queues)
SELECT 'worker-' || i, 'host-' || i, 1000 + i + 0 * $1::int, ARRAY['default', 'billing', 'outbox', 'email']
FROM generate_series(0, 7) AS i`, `
INSERT INTO fenceq_periodic (name, spec, kind, queue, source)
SELECT 'schedule-' || i, '@every ' || (i * 5 + 0 * $1::int) || 'm', 'report', 'default', 'cli'
FROM generate_series(1, 3) AS i`,
}

// WriteText writes the report as a table: each page's median server time at each size
// and the ratio of the largest size to the smallest.
func (r *UIReport) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"page"}
	for _, s := range r.Sizes {
		head = append(head, "ms at "+humanRows(s.Rows))
	}
	if len(r.Sizes) > 1 {
		head = append(head, "ratio")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, p := range r.Pages {
		row := []string{p.Name}
		for _, s := range r.Sizes {
			cell := strconv.FormatFloat(s.Millis[p.Name], 'f', 1, 64)
			if len(s.HistorySeqScans[p.Name]) > 0 {
				cell += " (seq scan of history)"
			}
			row = append(row, cell)
		}
		if len(r.Sizes) > 1 {
			first, last := r.Sizes[0].Millis[p.Name], r.Sizes[len(r.Sizes)-1].Millis[p.Name]
			ratio := "—"
			if first > 0 {
				ratio = strconv.FormatFloat(last/first, 'f', 2, 64)
			}
			row = append(row, ratio)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var seeds []string
	for _, s := range r.Sizes {
		seeds = append(seeds, fmt.Sprintf("%s in %.0f s", humanRows(s.Rows), s.SeedSeconds))
	}
	_, err := fmt.Fprintf(w, "median of %d requests per page through the handler in this process; %d unfinished jobs at every size; seeded %s; %s, %d CPUs\n",
		r.Requests, uiHot, strings.Join(seeds, ", "), r.Conditions.Server, r.Conditions.CPUs)
	return err
}

// WriteJSON writes the report as JSON.
func (r *UIReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// humanRows writes a row count as 10k, 1M, 10M.
func humanRows(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}
