// Package faultproxy is a TCP proxy for tests that sits between clients and PostgreSQL
// and can cut the connection in ways a real network does: blackhole (bytes vanish, the
// socket stays open), reset every connection, or refuse new ones.
package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from Addr() to an upstream address.
type Proxy struct {
	upstream string
	ln       net.Listener

	blackhole atomic.Bool
	refuse    atomic.Bool
	// Dropped counts bytes discarded while blackholed: proof the fault happened.
	dropped atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// New listens on 127.0.0.1:0 and forwards to upstream (host:port).
func New(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{upstream: upstream, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetBlackhole makes bytes in both directions vanish (on) or flow again (off). Open
// connections stay open, so clients see silence, as with a paused peer or a partition.
func (p *Proxy) SetBlackhole(on bool) { p.blackhole.Store(on) }

// SetRefuse makes new connections close at once (on) or be accepted (off).
func (p *Proxy) SetRefuse(on bool) { p.refuse.Store(on) }

// Dropped returns how many bytes were discarded while blackholed.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// ResetAll closes every open connection abruptly.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		n++
	}
	return n
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refuse.Load() {
			_ = c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.track(c, true)
		p.track(up, true)
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.track(dst, false)
		p.track(src, false)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.blackhole.Load() {
				p.dropped.Add(int64(n))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: tear down both sides
		}
	}
}
