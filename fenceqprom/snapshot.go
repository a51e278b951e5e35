package fenceqprom

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// Snapshot is what the database says now, read for gauges and health checks.
type Snapshot struct {
	// Depth counts unfinished jobs by queue and state. Its queues are those with
	// unfinished jobs, with settings (fenceq_queues, e.g. paused) or served by a worker
	// with a row in fenceq_workers; each has every unfinished state, zero when empty.
	Depth map[string]map[queue.State]int64 `json:"depth"`
	// OutboxPresent is false when fenceq_outbox does not exist (migrations missing).
	OutboxPresent bool `json:"outbox_present"`
	// OutboxPending counts pending outbox rows.
	OutboxPending int64 `json:"outbox_pending"`
	// OutboxOldestPendingAge is how long the oldest pending outbox row has been pending
	// (since its available_at), 0 when none.
	OutboxOldestPendingAge time.Duration `json:"outbox_oldest_pending_age"`
	// OldestTransactionAge is the age of the oldest open client transaction in the
	// database, 0 when none.
	OldestTransactionAge time.Duration `json:"oldest_transaction_age"`
	// IdleInTransaction counts client sessions idle in a transaction.
	IdleInTransaction int64 `json:"idle_in_transaction"`
	// Periodic lists the periodic schedules with their next slot and lag; empty when
	// fenceq_periodic does not exist.
	Periodic []fenceq.PeriodicInfo `json:"periodic"`
}

// TakeSnapshot reads queue depth, outbox backlog and the oldest open transaction. It
// fails when fenceq_jobs does not exist.
func TakeSnapshot(ctx context.Context, db queue.DBTX) (*Snapshot, error) {
	var jobs, queues, outbox, periodic bool
	if err := db.QueryRow(ctx, sqlTablesExist).Scan(&jobs, &queues, &outbox, &periodic); err != nil {
		return nil, fmt.Errorf("snapshot: look up tables: %w", err)
	}
	if !jobs {
		return nil, fmt.Errorf("snapshot: table fenceq_jobs does not exist (run `fenceq migrate up` or migrations.Up)")
	}
	s := &Snapshot{Depth: map[string]map[queue.State]int64{}, OutboxPresent: outbox}
	unfinished := queue.UnfinishedStates()
	ensure := func(q string) map[queue.State]int64 {
		m, ok := s.Depth[q]
		if !ok {
			m = make(map[queue.State]int64, len(unfinished))
			for _, st := range unfinished {
				m[st] = 0
			}
			s.Depth[q] = m
		}
		return m
	}
	if queues {
		rows, err := db.Query(ctx, sqlQueueNames)
		if err != nil {
			return nil, fmt.Errorf("snapshot: list queues: %w", err)
		}
		for rows.Next() {
			var q string
			if err := rows.Scan(&q); err != nil {
				rows.Close()
				return nil, fmt.Errorf("snapshot: list queues: %w", err)
			}
			ensure(q)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("snapshot: list queues: %w", err)
		}
	}
	rows, err := db.Query(ctx, sqlQueueDepth, unfinished)
	if err != nil {
		return nil, fmt.Errorf("snapshot: queue depth: %w", err)
	}
	for rows.Next() {
		var q, st string
		var n int64
		if err := rows.Scan(&q, &st, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("snapshot: queue depth: %w", err)
		}
		ensure(q)[queue.State(st)] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot: queue depth: %w", err)
	}
	if outbox {
		var age float64
		if err := db.QueryRow(ctx, sqlOutboxPending).Scan(&s.OutboxPending, &age); err != nil {
			return nil, fmt.Errorf("snapshot: outbox backlog: %w", err)
		}
		s.OutboxOldestPendingAge = seconds(age)
	}
	act, err := fenceq.ReadActivity(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	s.OldestTransactionAge, s.IdleInTransaction = act.OldestTransactionAge, act.IdleInTransaction
	s.Periodic = []fenceq.PeriodicInfo{}
	if periodic {
		if s.Periodic, err = fenceq.ListPeriodic(ctx, db); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	}
	return s, nil
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// DBCollector is a prometheus.Collector that takes a Snapshot of the database at every
// scrape: fenceq_queue_depth{queue,state}, fenceq_outbox_pending,
// fenceq_outbox_oldest_pending_age_seconds, fenceq_db_oldest_transaction_age_seconds,
// fenceq_db_idle_in_transaction_sessions, fenceq_periodic_lag_seconds{name} and
// fenceq_db_up (0 when the snapshot failed).
type DBCollector struct {
	db      queue.DBTX
	timeout time.Duration
	log     *slog.Logger

	depth, outboxPending, outboxAge, xactAge, idleInXact, periodicLag, up *prometheus.Desc
}

var _ prometheus.Collector = (*DBCollector)(nil)

// NewDBCollector returns a collector reading db with at most timeout per scrape
// (default 5s). A nil logger logs to slog.Default().
func NewDBCollector(db queue.DBTX, timeout time.Duration, log *slog.Logger) *DBCollector {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	return &DBCollector{
		db: db, timeout: timeout, log: log,
		depth: prometheus.NewDesc("fenceq_queue_depth",
			"Unfinished jobs by queue and state (available, scheduled, running, retryable); 0 for a queue "+
				"with settings or served by a worker that has none.",
			[]string{"queue", "state"}, nil),
		outboxPending: prometheus.NewDesc("fenceq_outbox_pending",
			"Outbox rows waiting for delivery.", nil, nil),
		outboxAge: prometheus.NewDesc("fenceq_outbox_oldest_pending_age_seconds",
			"Age of the oldest pending outbox row (0 when none), by the database's clock.", nil, nil),
		xactAge: prometheus.NewDesc("fenceq_db_oldest_transaction_age_seconds",
			"Age of the oldest open client transaction in the database, idle ones included (0 when none).", nil, nil),
		idleInXact: prometheus.NewDesc("fenceq_db_idle_in_transaction_sessions",
			"Client sessions idle in an open transaction.", nil, nil),
		periodicLag: prometheus.NewDesc("fenceq_periodic_lag_seconds",
			"How long the next slot of each periodic schedule has been due without its job enqueued "+
				"(0 when up to date or paused), by the database's clock. Alert when it stays above the grace.",
			[]string{"name"}, nil),
		up: prometheus.NewDesc("fenceq_db_up",
			"1 when the last scrape could read the database, 0 when it failed.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *DBCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.depth, c.outboxPending, c.outboxAge, c.xactAge, c.idleInXact, c.periodicLag, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *DBCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	s, err := TakeSnapshot(ctx, c.db)
	if err != nil {
		c.log.Warn("fenceqprom: database snapshot failed", "err", err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for q, states := range s.Depth {
		for st, n := range states {
			ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(n), q, string(st))
		}
	}
	if s.OutboxPresent {
		ch <- prometheus.MustNewConstMetric(c.outboxPending, prometheus.GaugeValue, float64(s.OutboxPending))
		ch <- prometheus.MustNewConstMetric(c.outboxAge, prometheus.GaugeValue, s.OutboxOldestPendingAge.Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.xactAge, prometheus.GaugeValue, s.OldestTransactionAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.idleInXact, prometheus.GaugeValue, float64(s.IdleInTransaction))
	for _, p := range s.Periodic {
		ch <- prometheus.MustNewConstMetric(c.periodicLag, prometheus.GaugeValue, p.LagSeconds, p.Name)
	}
}
