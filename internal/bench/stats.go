package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgSample is a reading of the server's counters that a run's figures are the
// difference of.
type pgSample struct {
	lsn     string
	commits int64
	updates int64
	hot     int64
	dead    int64
}

// sample reads the counters afresh (pg_stat_clear_snapshot first: a transaction would
// otherwise see one snapshot of the statistics).
func sample(ctx context.Context, c *pgx.Conn, table string) (pgSample, error) {
	var s pgSample
	if _, err := c.Exec(ctx, sqlClearSnapshot); err != nil {
		return s, fmt.Errorf("clear statistics snapshot: %w", err)
	}
	if err := c.QueryRow(ctx, sqlStatsDatabase).Scan(&s.lsn, &s.commits); err != nil {
		return s, fmt.Errorf("read pg_stat_database: %w", err)
	}
	err := c.QueryRow(ctx, sqlStatsTable, table).Scan(&s.updates, &s.hot, &s.dead)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("read pg_stat_user_tables of %s: %w", table, err)
	}
	return s, nil
}

// settledSample waits for the counters to stop moving: backends flush their statistics
// when they exit (the run's pool was just closed) or at most once a second, so a
// reading taken too early misses the last transactions.
func settledSample(ctx context.Context, c *pgx.Conn, table string) (pgSample, error) {
	if _, err := c.Exec(ctx, sqlForceFlush); err != nil {
		return pgSample{}, fmt.Errorf("flush statistics: %w", err)
	}
	prev, err := sample(ctx, c, table)
	if err != nil {
		return prev, err
	}
	for i := 0; i < 20; i++ {
		time.Sleep(150 * time.Millisecond)
		cur, err := sample(ctx, c, table)
		if err != nil {
			return cur, err
		}
		if cur.updates == prev.updates && cur.hot == prev.hot && cur.dead == prev.dead && i >= 1 {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

// pgFigures are the per-run statistics, as the differences of two samples.
type pgFigures struct {
	WALBytes   int64
	Commits    int64
	Updates    int64
	HOTUpdates int64
	DeadTuples int64
}

func diff(ctx context.Context, c *pgx.Conn, before, after pgSample) (pgFigures, error) {
	var f pgFigures
	if err := c.QueryRow(ctx, sqlWALDiff, after.lsn, before.lsn).Scan(&f.WALBytes); err != nil {
		return f, fmt.Errorf("diff wal positions: %w", err)
	}
	f.Commits = after.commits - before.commits
	f.Updates = after.updates - before.updates
	f.HOTUpdates = after.hot - before.hot
	f.DeadTuples = after.dead
	return f, nil
}

func (f pgFigures) metrics(jobs int64, m map[string]float64) {
	if jobs <= 0 {
		return
	}
	n := float64(jobs)
	m[MetricWALPerJob] = float64(f.WALBytes) / n
	m[MetricCommitsPerJob] = float64(f.Commits) / n
	m[MetricUpdatesPerJob] = float64(f.Updates) / n
	if f.Updates > 0 {
		m[MetricHOTPct] = 100 * float64(f.HOTUpdates) / float64(f.Updates)
	} else {
		m[MetricHOTPct] = 0
	}
	m[MetricDeadTuples] = float64(f.DeadTuples)
}

// idleXact holds a transaction open and idle, pinning the vacuum horizon, until its
// duration passes or stop is called.
type idleXact struct {
	conn *pgx.Conn
	done chan struct{}
	stop chan struct{}
}

func startIdleXact(ctx context.Context, url string, d time.Duration) (*idleXact, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("idle transaction: connect: %w", err)
	}
	tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		_ = c.Close(ctx)
		return nil, fmt.Errorf("idle transaction: begin: %w", err)
	}
	// txid_current assigns an xid and the first query takes the snapshot: both hold
	// back the horizon below which dead rows may be removed.
	if _, err := tx.Exec(ctx, `SELECT txid_current()`); err != nil {
		_ = c.Close(ctx)
		return nil, fmt.Errorf("idle transaction: take snapshot: %w", err)
	}
	x := &idleXact{conn: c, done: make(chan struct{}), stop: make(chan struct{})}
	go func() {
		defer close(x.done)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-x.stop:
		}
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(cctx)
		_ = c.Close(cctx)
	}()
	return x, nil
}

func (x *idleXact) end() {
	if x == nil {
		return
	}
	select {
	case <-x.done:
	default:
		close(x.stop)
		<-x.done
	}
}
