package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ChannelPrefix starts the name of the channel on which inserts of available jobs are
// announced; the schema name follows, so schemas sharing a database stay apart.
const ChannelPrefix = "fenceq_jobs:"

// ListenConfig configures Listen.
type ListenConfig struct {
	// OnNotify receives the queue name of each wake-up.
	OnNotify func(queue string)
	// OnConnect is called each time the listener (re)connects; notifications may have
	// been missed before it, so poll once.
	OnConnect func()
	// OnError is called with each connection error before the listener retries.
	OnError func(error)
	// RetryMin and RetryMax bound the reconnect backoff. Default 100ms and 5s.
	RetryMin, RetryMax time.Duration
}

// Listen holds one connection out of the pool, LISTENs for job wake-ups and calls
// cfg.OnNotify for each, reconnecting with backoff on errors, until ctx is done.
// Wake-ups are an optimization: workers also poll, so a lost notification (or a pooler
// in transaction mode that cannot LISTEN) delays work but never loses it.
func Listen(ctx context.Context, pool *pgxpool.Pool, cfg ListenConfig) {
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 100 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 5 * time.Second
	}
	delay := cfg.RetryMin
	for ctx.Err() == nil {
		err := listenOnce(ctx, pool, cfg, func() { delay = cfg.RetryMin })
		if ctx.Err() != nil {
			return
		}
		if cfg.OnError != nil && err != nil {
			cfg.OnError(err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(delay*2, cfg.RetryMax)
	}
}

func listenOnce(ctx context.Context, pool *pgxpool.Pool, cfg ListenConfig, connected func()) error {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listen: acquire connection: %w", err)
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	var schema string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return fmt.Errorf("listen: read current schema: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ChannelPrefix + schema}.Sanitize()); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	connected()
	if cfg.OnConnect != nil {
		cfg.OnConnect()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("listen: wait for notification: %w", err)
		}
		if cfg.OnNotify != nil {
			cfg.OnNotify(n.Payload)
		}
	}
}
