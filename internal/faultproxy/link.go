package faultproxy

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// link is one proxied connection: the client's socket and the proxy's socket to the
// server, with the protocol state of each direction.
type link struct {
	p              *Proxy
	id             int64
	client, server net.Conn
	opened         time.Time

	// Each framer is used only by the goroutine piping its direction.
	fromClient, fromServer *framer

	// parseOff: the stream is encrypted or out of step; stop reading the protocol.
	parseOff atomic.Bool
	// sslPending: the client asked for TLS/GSS; the server answers with one raw byte.
	sslPending atomic.Bool
	// dropReply: a COMMIT was forwarded whose reply must be dropped; holdReply: and
	// the connection then held silent instead of reset.
	dropReply atomic.Bool
	holdReply atomic.Bool
	// silent: every byte in both directions is swallowed from now on (a held reply).
	silent atomic.Bool

	mu      sync.Mutex
	appName string
	closed  bool

	// commitStmts names the statements the client prepared (Parse) whose query is
	// COMMIT; bindCommit: a Bind of one was seen since the last Sync, so the pipeline
	// that Sync ends commits. Owned by the client→server goroutine.
	commitStmts map[string]bool
	bindCommit  bool

	// Owned by the server→client goroutine while dropping a reply.
	dropBytes int
	dropTag   string
}

func (l *link) info() ConnInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ConnInfo{ID: l.id, AppName: l.appName, Client: l.client.RemoteAddr().String(), Opened: l.opened}
}

// reset closes both sockets with SO_LINGER 0, so the peers see a reset rather than an
// orderly close. It reports whether the link was still open.
func (l *link) reset() bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.closed = true
	l.mu.Unlock()
	// Counted before the sockets close: a client that sees the reset may ask at once.
	l.p.resets.Add(1)
	for _, c := range []net.Conn{l.client, l.server} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	return true
}

// close ends the link when one side went away on its own.
func (l *link) close() {
	l.mu.Lock()
	already := l.closed
	l.closed = true
	l.mu.Unlock()
	if !already {
		_ = l.client.Close()
		_ = l.server.Close()
	}
	l.p.forget(l)
}

func (l *link) pipe(dst, src net.Conn, fromClient bool) {
	defer l.p.wg.Done()
	defer l.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.forward(dst, buf[:n], fromClient) {
			return
		}
		if err != nil {
			return // EOF or a closed connection: tear down both sides
		}
	}
}

// forward handles one chunk read from one side and reports whether to keep piping.
func (l *link) forward(dst net.Conn, chunk []byte, fromClient bool) bool {
	p := l.p
	if l.silent.Load() {
		return true
	}
	if p.blackhole.Load() {
		p.dropped.Add(int64(len(chunk)))
		l.parseOff.Store(true) // the stream lost bytes: its framing is unknown from here
		return true
	}
	if fromClient {
		l.scanClient(chunk)
	} else if l.dropReply.Load() {
		return l.dropServerReply(chunk)
	} else {
		l.scanServer(chunk)
	}
	p.sleepLatency()
	_, err := dst.Write(chunk)
	return err == nil
}

// scanClient reads the client's messages in chunk before they are forwarded: the
// startup message's application_name, TLS requests, and COMMITs.
func (l *link) scanClient(chunk []byte) {
	if l.parseOff.Load() {
		return
	}
	ok := l.fromClient.feed(chunk, func(m message) {
		switch {
		case m.startup && (m.code == codeSSLRequest || m.code == codeGSSENCRequest):
			l.sslPending.Store(true)
		case m.startup && m.code == protocolV3:
			if app := startupParam(m.body, "application_name"); app != "" {
				l.mu.Lock()
				l.appName = app
				l.mu.Unlock()
			}
		case !m.startup && m.typ == 'Q' && !m.truncated && isCommit(m.body):
			l.sawCommit()
		case !m.startup && m.typ == 'P':
			// A COMMIT in the extended protocol, as in a pipeline that ends a
			// transaction: remember the statement, and see its Bind.
			name, query, ok := twoStrings(m.body)
			switch {
			case ok && isCommit([]byte(query)):
				if l.commitStmts == nil {
					l.commitStmts = map[string]bool{}
				}
				l.commitStmts[name] = true
			case ok || !m.truncated:
				delete(l.commitStmts, name)
			}
		case !m.startup && m.typ == 'B':
			if _, stmt, ok := twoStrings(m.body); ok && l.commitStmts[stmt] {
				l.bindCommit = true
			}
		case !m.startup && m.typ == 'S':
			if l.bindCommit {
				l.bindCommit = false
				l.sawCommit()
			}
		}
	})
	if !ok {
		l.parseOff.Store(true)
	}
}

// scanServer follows the server's messages so the framing is known when a reply must
// be dropped.
func (l *link) scanServer(chunk []byte) {
	if l.parseOff.Load() {
		return
	}
	if l.sslPending.CompareAndSwap(true, false) {
		l.fromServer.rawByte = true
	}
	ok := l.fromServer.feed(chunk, func(m message) {
		if m.raw && (m.typ == 'S' || m.typ == 'G') {
			l.parseOff.Store(true) // encrypted from here on
		}
	})
	if !ok {
		l.parseOff.Store(true)
	}
}

// dropServerReply discards the server's reply to a COMMIT up to ReadyForQuery, then
// resets the connection. It reports whether to keep piping.
func (l *link) dropServerReply(chunk []byte) bool {
	l.dropBytes += len(chunk)
	done := false
	if l.parseOff.Load() {
		done = true // cannot tell where the reply ends; the bytes are dropped all the same
	} else {
		ok := l.fromServer.feed(chunk, func(m message) {
			switch m.typ {
			case 'C':
				l.dropTag = strings.TrimRight(string(m.body), "\x00")
			case 'E':
				if l.dropTag == "" {
					l.dropTag = "ERROR"
				}
			case 'Z':
				done = true
			}
		})
		if !ok {
			done = true
		}
	}
	if !done {
		return true
	}
	d := CommitDrop{ConnID: l.id, AppName: l.info().AppName, Tag: l.dropTag, Bytes: l.dropBytes, At: time.Now()}
	if l.holdReply.Load() {
		l.silent.Store(true)
		l.dropReply.Store(false)
		l.p.recordDrop(d)
		if fn := l.p.onHold.Load(); fn != nil && *fn != nil {
			(*fn)(d)
		}
		return true
	}
	l.p.recordDrop(d)
	l.reset()
	return false
}

// takeArm takes one of the armed faults counted by arms, if any is left.
func takeArm(arms *atomic.Int64) bool {
	for {
		n := arms.Load()
		if n <= 0 {
			return false
		}
		if arms.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// isCommit reports whether a simple query's text (NUL-terminated) commits.
// sawCommit counts a COMMIT the client sent and arms its reply's drop or hold, if
// one is due.
func (l *link) sawCommit() {
	l.p.commits.Add(1)
	if takeArm(&l.p.holdArms) {
		l.holdReply.Store(true)
		l.dropReply.Store(true)
	} else if takeArm(&l.p.commitArms) {
		l.dropReply.Store(true)
	}
}

// twoStrings returns the first two NUL-terminated strings of a message body (Parse:
// statement name and query; Bind: portal and statement name); ok is false when the
// captured prefix does not hold both.
func twoStrings(body []byte) (first, second string, ok bool) {
	a, rest, found := strings.Cut(string(body), "\x00")
	if !found {
		return "", "", false
	}
	b, _, found := strings.Cut(rest, "\x00")
	return a, b, found
}

func isCommit(body []byte) bool {
	q := strings.ToLower(strings.Join(strings.Fields(strings.TrimRight(string(body), "\x00")), " "))
	q = strings.TrimSpace(strings.TrimRight(q, "; "))
	switch q {
	case "commit", "end", "commit work", "commit transaction":
		return true
	}
	return false
}

// startupParam returns a parameter of a startup message body (name\0value\0…\0).
func startupParam(body []byte, name string) string {
	parts := strings.Split(string(body), "\x00")
	for i := 0; i+1 < len(parts); i += 2 {
		if parts[i] == name {
			return parts[i+1]
		}
	}
	return ""
}
