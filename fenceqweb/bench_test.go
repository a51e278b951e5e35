package fenceqweb

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// benchJobs is how many jobs BenchmarkPages loads.
const benchJobs = 1_000_000

// sqlLoadBench fills fenceq_jobs with benchJobs jobs over about 41 hours: most
// completed, 0.5 % discarded, 0.1 % cancelled, 1 % retryable and 2 % scheduled among
// the older ones; of the newest 30,000 half wait available, 1 % run and the rest
// completed. Rows are written in the order of their last write (a finished job's
// finish time, now for the unfinished ones), as a live table lays them out: an
// unfinished job's current row version was written recently. Four queues, seven kinds
// and a rare one.
const sqlLoadBench = `
INSERT INTO fenceq_jobs (id, queue, kind, args, state, priority, run_at, attempt, max_attempts, lease_gen,
  leased_by, heartbeat_at, lease_expires_at, attempted_at, errors, created_at, finished_at)
OVERRIDING SYSTEM VALUE
SELECT i, q, k, a, st, 1,
  CASE WHEN st IN ('scheduled', 'retryable') THEN now() + interval '1 hour' ELSE c END,
  CASE WHEN st = 'available' THEN 0 ELSE 1 END, 25,
  CASE WHEN st = 'available' THEN 0 ELSE 1 END,
  CASE WHEN st IN ('running', 'completed', 'discarded') THEN 'worker-' || (i % 8) END,
  CASE WHEN st = 'running' THEN now() END,
  CASE WHEN st = 'running' THEN now() + interval '1 minute' END,
  CASE WHEN st <> 'available' THEN c END,
  CASE WHEN st IN ('retryable', 'discarded') OR (st = 'completed' AND i % 10 = 5)
       THEN jsonb_build_array(jsonb_build_object('at', LEAST(c + interval '1 second', now()), 'attempt', 1,
            'lease_gen', 1, 'worker', 'worker-' || (i % 8), 'error', 'tax service timeout',
            'trace', 'goroutine 1 [running]:'))
       ELSE '[]'::jsonb END,
  c,
  CASE WHEN st IN ('completed', 'discarded', 'cancelled') THEN LEAST(c + interval '2 seconds', now()) END
FROM (
  SELECT i,
    CASE WHEN i % 20 < 12 THEN 'default' WHEN i % 20 < 17 THEN 'billing' WHEN i % 20 < 19 THEN 'outbox' ELSE 'email' END AS q,
    CASE WHEN i % 10000 = 17 THEN 'rare.kind'
         ELSE (ARRAY['invoice', 'order.place', 'outbox.deliver', 'noop', 'sleep', 'housekeeping.idempotency', 'email.send'])[i % 7 + 1] END AS k,
    jsonb_build_object('customer_id', i % 5000, 'period', '2026-01', 'note', 'invoice for customer ' || (i % 5000)) AS a,
    CASE
      WHEN i > $1 - 30000 AND i % 2 = 0 THEN 'available'
      WHEN i > $1 - 30000 AND i % 100 = 1 THEN 'running'
      WHEN i > $1 - 30000 THEN 'completed'
      WHEN i % 100 = 7 THEN 'retryable'
      WHEN i % 50 = 3 THEN 'scheduled'
      WHEN i % 200 = 11 THEN 'discarded'
      WHEN i % 1000 = 13 THEN 'cancelled'
      ELSE 'completed' END AS st,
    now() - ($1 - i) * interval '150 milliseconds' AS c
  FROM generate_series(1, $1::int) AS i) s
ORDER BY CASE WHEN st IN ('completed', 'discarded', 'cancelled') THEN c ELSE now() END, i`

// sqlLoadBenchRest adds what the other pages show: 100,000 delivered outbox rows, 500
// pending and 50 failed ones, 20,000 lease events (the newest on one job), 8 workers
// and 1,000 idempotency keys.
var sqlLoadBenchRest = []string{
	`SELECT setval(pg_get_serial_sequence('fenceq_jobs', 'id'), $1::bigint)`,
	`INSERT INTO fenceq_outbox (topic, dedupe_key, payload, state, attempt, delivered_at, last_error, created_at, available_at)
SELECT 'email', 'bench:' || i, '{}', CASE WHEN i <= 100000 THEN 'delivered' WHEN i <= 100500 THEN 'pending' ELSE 'failed' END,
       1, CASE WHEN i <= 100000 THEN now() END, CASE WHEN i > 100500 THEN 'smtp 554' END,
       now() - (100550 - i) * interval '1 second', now() - (100550 - i) * interval '1 second'
FROM generate_series(1, 100550) AS i`,
	`INSERT INTO fenceq_lease_events (job_id, lease_gen, worker_id, kind, detail, at)
SELECT CASE WHEN i > 19990 THEN $1::bigint - 1 ELSE i * 37 END, 1 + i % 3, 'worker-' || (i % 8),
       (ARRAY['revoked', 'stale_write_rejected', 'expired_holder_alive', 'heartbeat_lost'])[1 + i % 4], 'bench',
       now() - (20000 - i) * interval '5 seconds'
FROM generate_series(1, 20000) AS i`,
	`INSERT INTO fenceq_workers (id, host, pid, queues)
SELECT 'worker-' || i, 'host-' || i, 1000 + i, ARRAY['default', 'billing', 'outbox', 'email'] FROM generate_series(0, 7) AS i`,
	`INSERT INTO fenceq_idempotency_keys (scope, key, request_hash, state, resource_id, response_status, response, finished_at, expires_at)
SELECT 'orders', 'key-' || i, '\x01', 'finished', i::text, 201, '{"ok": true}', now(), now() + interval '1 day'
FROM generate_series(1, 1000) AS i`,
}

// BenchmarkPages renders every page of the dashboard against benchJobs jobs: run it
// with `go test -run '^$' -bench Pages ./fenceqweb` (loading takes about a minute).
func BenchmarkPages(b *testing.B) {
	db := fenceqtest.New(b, &fenceqtest.Options{MaxConns: 4})
	ctx := b.Context()
	if _, err := db.Pool.Exec(ctx, sqlLoadBench, benchJobs); err != nil {
		b.Fatal(err)
	}
	for _, sql := range sqlLoadBenchRest {
		var args []any
		if strings.Contains(sql, "$1") {
			args = append(args, benchJobs)
		}
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			b.Fatal(err)
		}
	}
	for _, t := range []string{"fenceq_jobs", "fenceq_outbox", "fenceq_lease_events", "fenceq_idempotency_keys"} {
		if _, err := db.Pool.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
			b.Fatal(err)
		}
	}
	// The job counters the overview and queues read, rolled up as a worker would.
	for {
		r, err := store.RollupCounts(ctx, db.Pool)
		if err != nil {
			b.Fatal(err)
		}
		if !r.Skipped && r.Jobs == 0 {
			break
		}
	}
	h, err := New(Config{DB: db.Pool, Logger: fenceqtest.QuietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	job := benchJobs - 1
	pages := []struct{ name, path string }{
		{"overview", "/"},
		{"jobs", "/jobs"},
		{"jobs_older", "/jobs?before=500000"},
		{"jobs_running", "/jobs?state=running"},
		{"jobs_available", "/jobs?state=available"},
		{"jobs_retryable", "/jobs?state=retryable"},
		{"jobs_cancelled", "/jobs?state=cancelled"},
		{"jobs_rare_kind", "/jobs?kind=rare.kind"},
		{"jobs_queue", "/jobs?queue=email&state=discarded"},
		{"jobs_args_contain", "/jobs?args=" + url.QueryEscape(`{"customer_id": 4999}`)},
		{"jobs_args_no_match", "/jobs?args=" + url.QueryEscape(`{"customer_id": -1}`)},
		{"job", "/jobs/" + strconv.Itoa(job)},
		{"queues", "/queues"},
		{"workers", "/workers"},
		{"outbox_pending", "/outbox"},
		{"outbox_failed", "/outbox?state=failed"},
		{"outbox_all", "/outbox?state=all"},
		{"idempotency", "/idempotency?scope=orders&key=key-7"},
		{"live_overview", "/#live"},
	}
	// The overview's reads one by one.
	parts := []struct {
		name string
		read func() error
	}{
		{"read_counts", func() error {
			_, err := store.CountQueues(ctx, db.Pool, queue.CountParams{Window: overviewWindow})
			return err
		}},
		{"read_throughput", func() error {
			_, err := store.ReadThroughput(ctx, db.Pool, queue.CountParams{Window: overviewWindow}, overviewBuckets)
			return err
		}},
		{"read_health", func() error {
			_, err := health.Check(ctx, db.Pool, health.Thresholds{})
			return err
		}},
		{"read_workers", func() error {
			_, err := store.ListWorkers(ctx, db.Pool)
			return err
		}},
	}
	for _, p := range parts {
		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				if err := p.read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, p := range pages {
		b.Run(p.name, func(b *testing.B) {
			path, live := p.path, false
			if path == "/#live" {
				path, live = "/", true
			}
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, path, nil)
				if live {
					req.Header.Set(fragmentHeader, "live")
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("GET %s: %d\n%s", path, rec.Code, rec.Body.String())
				}
			}
		})
	}
}
