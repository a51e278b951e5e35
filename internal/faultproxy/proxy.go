// Package faultproxy is a TCP proxy for tests that sits between clients and PostgreSQL
// and can cut the connection in ways a real network does: blackhole (bytes vanish, the
// socket stays open), reset every connection, refuse new ones, add latency, and drop
// the server's reply to COMMIT (the client cannot know whether its transaction landed).
//
// The proxy follows the PostgreSQL wire protocol on every connection it can read (not
// TLS-encrypted ones): it learns each connection's application_name from the startup
// message and recognises COMMIT sent as a simple query (how pgx's Tx.Commit commits)
// and in the extended protocol (a prepared COMMIT bound in a pipeline, as a batch that
// ends a transaction sends it; its reply is the whole pipeline's, up to ReadyForQuery).
// Every fault it injects is counted, so a test can prove the fault happened before it
// claims nothing went wrong.
package faultproxy

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from Addr() to an upstream address.
type Proxy struct {
	upstream string
	ln       net.Listener
	dial     func(ctx context.Context, addr string) (net.Conn, error)
	dialErrs atomic.Int64
	refused  atomic.Int64

	blackhole atomic.Bool
	refuse    atomic.Bool
	latency   atomic.Int64 // nanoseconds added before each forwarded chunk
	delayed   atomic.Int64 // chunks forwarded late because of latency
	// dropped counts bytes discarded while blackholed: proof the fault happened.
	dropped atomic.Int64
	resets  atomic.Int64
	// commitArms is how many upcoming COMMITs get their reply dropped.
	commitArms atomic.Int64
	// holdArms is how many upcoming COMMITs get their reply held (see HoldCommitReplies).
	holdArms atomic.Int64
	onHold   atomic.Pointer[func(CommitDrop)]
	commits  atomic.Int64
	nextID   atomic.Int64

	mu      sync.Mutex
	links   map[*link]struct{}
	drops   []CommitDrop
	wg      sync.WaitGroup
	closing bool
}

// ConnInfo describes one proxied connection.
type ConnInfo struct {
	// ID is unique within the proxy, in order of acceptance.
	ID int64
	// AppName is the application_name of the startup message ("" if unknown).
	AppName string
	// Client is the client's address.
	Client string
	// Opened is when the proxy accepted the connection.
	Opened time.Time
}

// CommitDrop records one COMMIT whose reply the proxy dropped.
type CommitDrop struct {
	ConnID  int64
	AppName string
	// Tag is the command tag the server answered with and the client never saw:
	// "COMMIT" means the transaction landed, "ROLLBACK" that it had failed already.
	Tag string
	// Bytes is the size of the reply that was dropped.
	Bytes int
	At    time.Time
}

// New listens on 127.0.0.1:0 and forwards to upstream (host:port).
func New(upstream string) (*Proxy, error) {
	return NewWithConfig(Config{Upstream: upstream})
}

// Config describes a proxy whose sockets are made by the caller, e.g. inside a network
// namespace.
type Config struct {
	// Upstream is the server's host:port.
	Upstream string
	// Listener accepts the clients. Defaults to a new listener on 127.0.0.1:0.
	Listener net.Listener
	// Dial connects to Upstream for each client. Defaults to a TCP dial with a 5s
	// timeout.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

// NewWithConfig starts a proxy as cfg describes; it owns cfg.Listener from then on.
func NewWithConfig(cfg Config) (*Proxy, error) {
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
	}
	dial := cfg.Dial
	if dial == nil {
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: 5 * time.Second}
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	p := &Proxy{upstream: cfg.Upstream, ln: ln, dial: dial, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Refused returns how many connections were closed at once because of SetRefuse.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// DialErrors returns how many client connections were closed because the upstream
// could not be reached: proof that a partition kept connections from being made.
func (p *Proxy) DialErrors() int64 { return p.dialErrs.Load() }

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetBlackhole makes bytes in both directions vanish (on) or flow again (off). Open
// connections stay open, so clients see silence, as with a paused peer or a partition.
// A connection that lost bytes is out of step with the server once they flow again;
// call ResetAll after switching the blackhole off to model the partition killing it.
func (p *Proxy) SetBlackhole(on bool) { p.blackhole.Store(on) }

// SetRefuse makes new connections close at once (on) or be accepted (off).
func (p *Proxy) SetRefuse(on bool) { p.refuse.Store(on) }

// SetLatency delays every chunk forwarded in either direction by d (0 turns it off),
// so a round trip takes at least 2d longer.
func (p *Proxy) SetLatency(d time.Duration) {
	if d < 0 {
		d = 0
	}
	p.latency.Store(int64(d))
}

// Latency returns the latency set by SetLatency.
func (p *Proxy) Latency() time.Duration { return time.Duration(p.latency.Load()) }

// Delayed returns how many chunks were forwarded late because of SetLatency.
func (p *Proxy) Delayed() int64 { return p.delayed.Load() }

// Dropped returns how many bytes were discarded while blackholed.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Resets returns how many connections the proxy has reset (ResetAll, ResetConn and
// dropped COMMIT replies).
func (p *Proxy) Resets() int64 { return p.resets.Load() }

// DropCommitReplies arms the proxy to drop the reply to each of the next n COMMITs
// (simple-protocol queries "commit", or a pipeline that binds a prepared COMMIT, on
// any connection): the COMMIT reaches the server
// and is executed, the server's answer is read and discarded, and the connection is
// then reset. The client cannot know whether its transaction committed. n <= 0 disarms.
func (p *Proxy) DropCommitReplies(n int) {
	if n < 0 {
		n = 0
	}
	p.commitArms.Store(int64(n))
}

// HoldCommitReplies arms the proxy to swallow the reply to each of the next n
// COMMITs, like DropCommitReplies, but to leave the connection open and silent instead
// of resetting it: the client waits for an answer that never comes, as across a cut
// link or from a server that died after committing. onDrop, if not nil, runs as soon
// as a reply has been swallowed (before anything else crosses that connection), e.g.
// to cut the link or kill the server; it must not block long. The held connection ends
// when its server side closes, or with ResetConn. n <= 0 disarms.
func (p *Proxy) HoldCommitReplies(n int, onDrop func(CommitDrop)) {
	if n < 0 {
		n = 0
	}
	p.onHold.Store(&onDrop)
	p.holdArms.Store(int64(n))
}

// PendingCommitDrops returns how many armed drops have not fired yet.
func (p *Proxy) PendingCommitDrops() int64 { return p.commitArms.Load() }

// CommitsSeen returns how many COMMITs clients sent through the proxy.
func (p *Proxy) CommitsSeen() int64 { return p.commits.Load() }

// CommitDrops returns every COMMIT whose reply was dropped, oldest first.
func (p *Proxy) CommitDrops() []CommitDrop {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.drops)
}

// Conns returns the open connections, oldest first.
func (p *Proxy) Conns() []ConnInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ConnInfo, 0, len(p.links))
	for l := range p.links {
		out = append(out, l.info())
	}
	slices.SortFunc(out, func(a, b ConnInfo) int { return int(a.ID - b.ID) })
	return out
}

// ResetConn resets one connection by its ID and reports whether it was open.
func (p *Proxy) ResetConn(id int64) bool {
	p.mu.Lock()
	var target *link
	for l := range p.links {
		if l.id == id {
			target = l
			break
		}
	}
	p.mu.Unlock()
	if target == nil {
		return false
	}
	return target.reset()
}

// ResetAll closes every open connection abruptly (TCP RST) and returns how many
// connections it reset.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	n := 0
	for _, l := range links {
		if l.reset() {
			n++
		}
	}
	return n
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		up, err := p.dial(context.Background(), p.upstream)
		if err != nil {
			p.dialErrs.Add(1)
			_ = c.Close()
			continue
		}
		l := &link{p: p, id: p.nextID.Add(1), client: c, server: up, opened: time.Now()}
		l.fromClient = newFramer(true)
		l.fromServer = newFramer(false)
		p.mu.Lock()
		if p.closing {
			p.mu.Unlock()
			_ = c.Close()
			_ = up.Close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go l.pipe(up, c, true)
		go l.pipe(c, up, false)
	}
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.links, l)
}

func (p *Proxy) recordDrop(d CommitDrop) {
	p.mu.Lock()
	p.drops = append(p.drops, d)
	p.mu.Unlock()
}

func (p *Proxy) sleepLatency() {
	if d := time.Duration(p.latency.Load()); d > 0 {
		time.Sleep(d)
		p.delayed.Add(1)
	}
}
