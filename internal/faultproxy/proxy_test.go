package faultproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
)

type testBundle struct {
	ctx   context.Context
	db    *fenceqtest.DB
	proxy *Proxy
	// url connects through the proxy.
	url string
}

func setup(t *testing.T, appName string) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	p, err := New(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	q := u.Query()
	q.Set("application_name", appName)
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: ctx, db: db, proxy: p, url: u.String()}
}

func (b *testBundle) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func (b *testBundle) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestProxy(t *testing.T) {
	t.Parallel()

	t.Run("ForwardsAndNamesConnections", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-forward")
		c := b.connect(t)
		var one int
		if err := c.QueryRow(b.ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
			t.Fatalf("SELECT 1 through the proxy = %d, %v", one, err)
		}
		conns := b.proxy.Conns()
		if len(conns) != 1 || conns[0].AppName != "fp-forward" {
			t.Fatalf("Conns() = %+v, want one connection named fp-forward", conns)
		}
	})

	t.Run("DropCommitReplyLandsButClientFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-commit")
		c := b.connect(t)
		b.proxy.DropCommitReplies(1)
		tx, err := c.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		err = tx.Commit(b.ctx)
		if err == nil {
			t.Fatal("commit succeeded although its reply was dropped")
		}
		drops := b.proxy.CommitDrops()
		if len(drops) != 1 || drops[0].Tag != "COMMIT" || drops[0].AppName != "fp-commit" || drops[0].Bytes == 0 {
			t.Fatalf("CommitDrops() = %+v, want one dropped COMMIT reply of fp-commit", drops)
		}
		if n := b.rows(t); n != 1 {
			t.Fatalf("rows after a commit whose reply was dropped = %d, want 1 (it landed)", n)
		}
		if b.proxy.PendingCommitDrops() != 0 || b.proxy.Resets() != 1 {
			t.Fatalf("pending drops %d, resets %d; want 0 and 1", b.proxy.PendingCommitDrops(), b.proxy.Resets())
		}
		// Disarmed after one: the next commit, on a new connection, goes through.
		c2 := b.connect(t)
		tx, err = c2.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO t VALUES (2)`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatalf("second commit: %v", err)
		}
		if b.proxy.CommitsSeen() != 2 || len(b.proxy.CommitDrops()) != 1 {
			t.Fatalf("commits seen %d, dropped %d; want 2 and 1", b.proxy.CommitsSeen(), len(b.proxy.CommitDrops()))
		}
	})

	t.Run("DropCommitReplyOfFailedTransactionSaysRollback", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-rollback")
		c := b.connect(t)
		b.proxy.DropCommitReplies(1)
		tx, err := c.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO t VALUES (1), (1)`); err == nil {
			t.Fatal("duplicate key insert succeeded")
		}
		_ = tx.Commit(b.ctx)
		drops := b.proxy.CommitDrops()
		if len(drops) != 1 || drops[0].Tag != "ROLLBACK" {
			t.Fatalf("CommitDrops() = %+v, want one dropped ROLLBACK reply", drops)
		}
		if n := b.rows(t); n != 0 {
			t.Fatalf("rows = %d, want 0", n)
		}
	})

	t.Run("DropCommitReplyOfPipeline", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-pipeline")
		c := b.connect(t)
		pipeline := func(id int) error {
			batch := &pgx.Batch{}
			batch.Queue("BEGIN")
			batch.Queue(`INSERT INTO t VALUES ($1)`, id)
			batch.Queue("COMMIT")
			return c.SendBatch(b.ctx, batch).Close()
		}
		// The first pipeline prepares COMMIT; the second binds the prepared statement
		// only. Both are seen as commits, and the reply of the armed one is dropped.
		if err := pipeline(1); err != nil {
			t.Fatal(err)
		}
		b.proxy.DropCommitReplies(1)
		if err := pipeline(2); err == nil {
			t.Fatal("pipeline succeeded although its COMMIT reply was dropped")
		}
		drops := b.proxy.CommitDrops()
		if len(drops) != 1 || drops[0].Tag != "COMMIT" || drops[0].AppName != "fp-pipeline" {
			t.Fatalf("CommitDrops() = %+v, want one dropped COMMIT reply of fp-pipeline", drops)
		}
		if n := b.rows(t); n != 2 {
			t.Fatalf("rows = %d, want 2 (both pipelines landed)", n)
		}
		if b.proxy.CommitsSeen() != 2 {
			t.Fatalf("commits seen %d, want 2", b.proxy.CommitsSeen())
		}
	})

	t.Run("HoldCommitReplyLeavesClientWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-hold")
		c := b.connect(t)
		held := make(chan CommitDrop, 1)
		b.proxy.HoldCommitReplies(1, func(d CommitDrop) { held <- d })
		tx, err := c.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		const wait = 300 * time.Millisecond
		cctx, cancel := context.WithTimeout(b.ctx, wait)
		defer cancel()
		start := time.Now()
		err = tx.Commit(cctx)
		if err == nil {
			t.Fatal("commit succeeded although its reply was held")
		}
		// No reset: the client waited for its own deadline, as across a cut link.
		if took := time.Since(start); took < wait {
			t.Fatalf("commit failed after %s (%v), before its %s deadline: the connection was not held", took, err, wait)
		}
		select {
		case d := <-held:
			if d.Tag != "COMMIT" || d.AppName != "fp-hold" {
				t.Fatalf("held %+v; want the COMMIT reply of fp-hold", d)
			}
		default:
			t.Fatal("the hold callback did not run")
		}
		if n := b.rows(t); n != 1 {
			t.Fatalf("rows after a held COMMIT reply = %d, want 1 (it landed)", n)
		}
		if b.proxy.Resets() != 0 || len(b.proxy.CommitDrops()) != 1 {
			t.Fatalf("resets %d, drops %d; want 0 and 1", b.proxy.Resets(), len(b.proxy.CommitDrops()))
		}
	})

	t.Run("CountsUnreachableUpstream", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		_ = ln.Close() // nothing listens there any more
		p, err := NewWithConfig(Config{Upstream: dead})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		// One raw TCP connection, so the count cannot depend on how many
		// attempts a client library makes before giving up.
		c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("read %d bytes through a proxy whose upstream is down", n)
		} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the proxy kept the connection open although its upstream is down")
		}
		if p.DialErrors() != 1 {
			t.Fatalf("DialErrors() = %d, want 1", p.DialErrors())
		}
	})

	t.Run("Latency", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-latency")
		c := b.connect(t)
		const d = 40 * time.Millisecond
		b.proxy.SetLatency(d)
		if b.proxy.Latency() != d {
			t.Fatalf("Latency() = %s, want %s", b.proxy.Latency(), d)
		}
		start := time.Now()
		if _, err := c.Exec(b.ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		// A round trip crosses the proxy twice: it cannot take less than 2d.
		if took := time.Since(start); took < 2*d {
			t.Fatalf("round trip with %s latency took %s, less than %s", d, took, 2*d)
		}
		if b.proxy.Delayed() < 2 {
			t.Fatalf("Delayed() = %d after a round trip, want at least 2", b.proxy.Delayed())
		}
	})

	t.Run("BlackholeThenReset", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-blackhole")
		c := b.connect(t)
		b.proxy.SetBlackhole(true)
		ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
		_, err := c.Exec(ctx, `SELECT 1`)
		cancel()
		if err == nil {
			t.Fatal("query through a blackhole succeeded")
		}
		if b.proxy.Dropped() == 0 {
			t.Fatal("blackhole dropped no bytes")
		}
		b.proxy.SetBlackhole(false)
		b.proxy.ResetAll()
		c2 := b.connect(t)
		if _, err := c2.Exec(b.ctx, `SELECT 1`); err != nil {
			t.Fatalf("query after the blackhole lifted: %v", err)
		}
	})

	t.Run("ResetConn", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-reset")
		c := b.connect(t)
		conns := b.proxy.Conns()
		if len(conns) != 1 {
			t.Fatalf("Conns() = %+v", conns)
		}
		if !b.proxy.ResetConn(conns[0].ID) {
			t.Fatal("ResetConn of an open connection returned false")
		}
		if b.proxy.ResetConn(conns[0].ID + 1000) {
			t.Fatal("ResetConn of an unknown connection returned true")
		}
		if _, err := c.Exec(b.ctx, `SELECT 1`); err == nil {
			t.Fatal("query on a reset connection succeeded")
		}
	})

	t.Run("Refuse", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "fp-refuse")
		b.proxy.SetRefuse(true)
		if c, err := pgx.Connect(b.ctx, b.url); err == nil {
			_ = c.Close(b.ctx)
			t.Fatal("connected through a refusing proxy")
		}
	})
}

func TestFramerSplitsAnywhere(t *testing.T) {
	t.Parallel()
	var stream []byte
	startup := []byte("user\x00postgres\x00application_name\x00w7\x00\x00")
	stream = binary.BigEndian.AppendUint32(stream, uint32(8+len(startup)))
	stream = binary.BigEndian.AppendUint32(stream, protocolV3)
	stream = append(stream, startup...)
	for _, q := range []string{"select 1", "commit", "  COMMIT ; ", "select 'commit'"} {
		stream = append(stream, 'Q')
		stream = binary.BigEndian.AppendUint32(stream, uint32(4+len(q)+1))
		stream = append(stream, q...)
		stream = append(stream, 0)
	}
	for chunk := 1; chunk <= len(stream); chunk++ {
		f := newFramer(true)
		var app string
		var commits int
		for off := 0; off < len(stream); off += chunk {
			end := min(off+chunk, len(stream))
			ok := f.feed(stream[off:end], func(m message) {
				if m.startup {
					app = startupParam(m.body, "application_name")
				} else if m.typ == 'Q' && !m.truncated && isCommit(m.body) {
					commits++
				}
			})
			if !ok {
				t.Fatalf("chunk %d: framer gave up", chunk)
			}
		}
		if app != "w7" || commits != 2 {
			t.Fatalf("chunk %d: application_name %q, commits %d; want w7 and 2", chunk, app, commits)
		}
	}
}

func TestFramerRejectsGarbage(t *testing.T) {
	t.Parallel()
	f := newFramer(false)
	if f.feed([]byte{'Z', 0, 0, 0, 1}, func(message) {}) {
		t.Fatal("a message length of 1 was accepted")
	}
}
