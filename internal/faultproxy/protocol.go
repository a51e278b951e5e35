package faultproxy

import "encoding/binary"

// Codes of the untyped messages a client may send first (PostgreSQL protocol 3.0).
const (
	protocolV3        = 196608 // StartupMessage
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
	codeCancelRequest = 80877102
)

// maxMessage bounds a message length the framer believes; beyond it the stream is not
// PostgreSQL (or out of step) and the framer gives up.
const maxMessage = 1 << 30

// message is one protocol message as seen by a framer. Only a prefix of the body is
// kept (what the proxy needs to recognise COMMIT, command tags and startup parameters).
type message struct {
	// startup: an untyped message of the startup phase (code holds its code).
	startup bool
	code    uint32
	// raw: the single byte a server answers an SSLRequest with (in typ).
	raw bool
	typ byte
	// body is the captured prefix of the body; truncated when the body was longer.
	body      []byte
	truncated bool
}

// framer splits one direction of a PostgreSQL connection into messages without
// holding more than a small prefix of each.
type framer struct {
	// startup: expect untyped startup-phase messages (client side, until the
	// StartupMessage).
	startup bool
	// rawByte: expect the one-byte answer to an SSLRequest (server side).
	rawByte bool

	hdr    [8]byte
	hn     int // header bytes collected
	inBody bool
	cur    message
	remain int // body bytes still to come
	keep   int // body bytes to capture
}

func newFramer(client bool) *framer { return &framer{startup: client} }

// capture is how much of each message's body the proxy keeps.
func capture(startup bool, typ byte) int {
	switch {
	case startup:
		return 2048 // parameters: user, database, application_name, …
	case typ == 'Q':
		return 64 // enough for "commit"; longer queries are not COMMIT
	case typ == 'C':
		return 64 // command tags
	case typ == 'P', typ == 'B':
		return 256 // Parse: statement name and query; Bind: portal and statement names
	}
	return 0
}

// feed consumes a chunk, calling fn for each complete message. It returns false when the
// stream cannot be PostgreSQL's (a length out of range); the caller stops parsing.
func (f *framer) feed(b []byte, fn func(message)) bool {
	for len(b) > 0 {
		if f.rawByte {
			f.rawByte = false
			fn(message{raw: true, typ: b[0]})
			b = b[1:]
			continue
		}
		if !f.inBody {
			need := 5
			if f.startup {
				need = 8
			}
			c := copy(f.hdr[f.hn:need], b)
			f.hn += c
			b = b[c:]
			if f.hn < need {
				return true
			}
			f.hn = 0
			var length int
			if f.startup {
				length = int(binary.BigEndian.Uint32(f.hdr[0:4]))
				f.cur = message{startup: true, code: binary.BigEndian.Uint32(f.hdr[4:8])}
				f.remain = length - 8
			} else {
				length = int(binary.BigEndian.Uint32(f.hdr[1:5]))
				f.cur = message{typ: f.hdr[0]}
				f.remain = length - 4
			}
			if f.remain < 0 || length > maxMessage {
				return false
			}
			f.keep = capture(f.startup, f.cur.typ)
			f.cur.truncated = f.remain > f.keep
			f.inBody = true
		}
		c := min(f.remain, len(b))
		if k := min(c, f.keep-len(f.cur.body)); k > 0 {
			f.cur.body = append(f.cur.body, b[:k]...)
		}
		f.remain -= c
		b = b[c:]
		if f.remain > 0 {
			return true
		}
		f.inBody = false
		m := f.cur
		f.cur = message{}
		if m.startup && m.code == protocolV3 || m.startup && m.code == codeCancelRequest {
			f.startup = false
		}
		fn(m)
	}
	return true
}
