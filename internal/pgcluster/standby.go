package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions tunes StartStandby.
type StandbyOptions struct {
	// Name is the standby's application_name on the primary (its cluster_name).
	// Defaults to "standby".
	Name string
	// Sync makes the primary commit only once the standby has flushed the commit's WAL:
	// synchronous_standby_names names the standby (synchronous_commit stays whatever the
	// primary's settings say; on by default in PostgreSQL, but Start's default is off,
	// so pass synchronous_commit=on in Options.Settings). Otherwise replication is
	// asynchronous: the primary acknowledges commits before the standby has them.
	Sync bool
	// Settings are the standby's own extra settings, on top of the primary's Settings.
	Settings map[string]string
	// Via is the host:port the standby reaches the primary at (the base backup and the
	// streaming), e.g. a fault proxy in front of it. Defaults to the primary's own.
	Via string
}

// StartStandby makes a streaming standby of c: a base backup taken with
// pg_basebackup -R (which writes primary_conninfo and standby.signal), started on a
// port of its own with the primary's Options. It returns once the primary reports the
// standby streaming, and with Sync once the primary reports it synchronous. The
// standby is a Cluster of its own: Stop it too.
func (c *Cluster) StartStandby(ctx context.Context, so StandbyOptions) (s *Cluster, err error) {
	if so.Name == "" {
		so.Name = "standby"
	}
	opts := c.opts
	opts.Settings = map[string]string{}
	for k, v := range c.opts.Settings {
		opts.Settings[k] = v
	}
	for k, v := range so.Settings {
		opts.Settings[k] = v
	}
	// The walreceiver names itself by cluster_name when primary_conninfo has no
	// application_name: that is the name synchronous_standby_names refers to.
	opts.Settings["cluster_name"] = so.Name
	opts.Settings["hot_standby"] = "on"
	// Never wait for a standby of its own once promoted.
	delete(opts.Settings, "synchronous_standby_names")
	if s, err = newCluster(opts); err != nil {
		return nil, err
	}
	made := s // s is nil once an error is returned
	defer func() {
		if err != nil {
			_ = made.Stop(context.Background())
		}
	}()
	bctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	opts.Logger.Info("taking a base backup for a standby", "primary_port", c.Port, "dir", s.Dir)
	host, port := c.Host, strconv.Itoa(c.Port)
	if so.Via != "" {
		if host, port, err = net.SplitHostPort(so.Via); err != nil {
			return nil, fmt.Errorf("standby: StandbyOptions.Via %q: %w", so.Via, err)
		}
	}
	conninfo := fmt.Sprintf("host=%s port=%s user=postgres", host, port)
	if out, err := s.run(bctx, "pg_basebackup", "-D", s.dataDir, "-R", "-X", "stream", "-c", "fast",
		"--no-sync", "-d", conninfo); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %w: %s", err, lastLines(out, 3))
	}
	if err := s.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, c.SocketURL)
	if err != nil {
		return nil, fmt.Errorf("standby: connect to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	if err := waitFor(ctx, opts.StartTimeout, "the standby to stream", func() (bool, error) {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming'`, so.Name).Scan(&n)
		return n == 1, err
	}); err != nil {
		return nil, err
	}
	if so.Sync {
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+
			quoteLiteral(pgx.Identifier{so.Name}.Sanitize())); err != nil {
			return nil, fmt.Errorf("standby: make it synchronous: %w", err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			return nil, fmt.Errorf("standby: reload the primary's configuration: %w", err)
		}
		if err := waitFor(ctx, opts.StartTimeout, "the standby to be synchronous", func() (bool, error) {
			var n int
			err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
				WHERE application_name = $1 AND sync_state = 'sync'`, so.Name).Scan(&n)
			return n == 1, err
		}); err != nil {
			return nil, err
		}
	}
	opts.Logger.Info("standby streaming", "port", s.Port, "sync", so.Sync)
	return s, nil
}

// Promote ends recovery on a standby (pg_ctl promote -w): from then on it accepts
// writes, on a new timeline.
func (c *Cluster) Promote(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if out, err := c.run(pctx, "pg_ctl", "-D", c.dataDir, "-w", "-t",
		strconv.Itoa(int(c.opts.StartTimeout.Seconds())), "promote"); err != nil {
		return fmt.Errorf("pg_ctl promote: %w: %s", err, lastLines(out, 2))
	}
	return nil
}

// WalReceiverPid returns the process id of a standby's WAL receiver, 0 when none runs.
func (c *Cluster) WalReceiverPid(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, c.SocketURL)
	if err != nil {
		return 0, fmt.Errorf("connect to the standby: %w", err)
	}
	defer conn.Close(context.Background())
	var pid int
	err = conn.QueryRow(ctx, `SELECT pid FROM pg_stat_wal_receiver`).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return pid, err
}

func waitFor(ctx context.Context, within time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: %s: not within %s (last error: %v)", what, within, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
