// Package emailtest runs a real SMTP server in-process for tests (go-smtp on
// 127.0.0.1:0). It records every accepted message, deduplicates by Message-ID the way a
// receiver would, can refuse recipients permanently (5xx) or transiently (4xx), and
// measures how many deliveries of one Message-ID were in flight at once.
package emailtest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log"
	"math/big"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Options tunes Start.
type Options struct {
	// TLS enables STARTTLS with this config.
	TLS *tls.Config
	// Username and Password, when set, make AUTH PLAIN required before MAIL.
	Username, Password string
	// DataDelay holds each DATA this long before accepting it, widening the window in
	// which two deliveries of one message would overlap.
	DataDelay time.Duration
}

// Received is one message the server accepted.
type Received struct {
	From           string
	To             []string
	MessageID      string
	IdempotencyKey string
	Subject        string
	Header         mail.Header
	Body           []byte
	Raw            []byte
	TLS            bool
	AuthUser       string
}

// Server is a running test SMTP server.
type Server struct {
	// Addr is host:port to dial.
	Addr string

	srv  *smtp.Server
	opts Options

	mu          sync.Mutex
	received    []Received
	reject      map[string]rejection
	inflight    map[string]int
	maxInflight int
}

type rejection struct {
	err   *smtp.SMTPError
	times int // <0: always
}

// Start runs a server until the test ends.
func Start(t testing.TB, opts ...Options) *Server {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	s := &Server{opts: o, reject: map[string]rejection{}, inflight: map[string]int{}}
	srv := smtp.NewServer(backend{s})
	srv.Domain = "localhost"
	srv.ReadTimeout = 30 * time.Second
	srv.WriteTimeout = 30 * time.Second
	srv.MaxMessageBytes = 10 << 20
	srv.MaxRecipients = 50
	srv.AllowInsecureAuth = o.TLS == nil
	srv.TLSConfig = o.TLS
	srv.ErrorLog = log.New(io.Discard, "", 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("emailtest: listen: %v", err)
	}
	s.Addr = ln.Addr().String()
	s.srv = srv
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return s
}

// RejectRecipient makes RCPT TO addr fail with code (e.g. 550 permanent, 451
// transient) the next times calls, or always when times < 0.
func (s *Server) RejectRecipient(addr string, code int, message string, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reject[strings.ToLower(addr)] = rejection{
		err:   &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCodeNotSet, Message: message},
		times: times,
	}
}

// Received returns every accepted message, duplicates included, in acceptance order.
func (s *Server) Received() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Received(nil), s.received...)
}

// Deduped returns what a receiver that drops repeated Message-IDs keeps: the first
// accepted message of each Message-ID. Messages without one are all kept.
func (s *Server) Deduped() []Received {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	var out []Received
	for _, r := range s.received {
		if r.MessageID != "" && seen[r.MessageID] {
			continue
		}
		seen[r.MessageID] = true
		out = append(out, r)
	}
	return out
}

// CountByMessageID returns how many times each Message-ID was accepted.
func (s *Server) CountByMessageID() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, r := range s.received {
		out[r.MessageID]++
	}
	return out
}

// MaxConcurrentPerMessageID is the most DATA transfers of one Message-ID that were in
// progress at the same time. 1 means no message was ever delivered concurrently.
func (s *Server) MaxConcurrentPerMessageID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInflight
}

type backend struct{ s *Server }

func (b backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	_, isTLS := c.TLSConnectionState()
	return &session{s: b.s, tls: isTLS, conn: c}, nil
}

type session struct {
	s    *Server
	conn *smtp.Conn
	tls  bool
	user string
	from string
	to   []string
}

var _ smtp.AuthSession = (*session)(nil)

func (ss *session) AuthMechanisms() []string {
	if ss.s.opts.Username == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (ss *session) Auth(mech string) (sasl.Server, error) {
	if mech != sasl.Plain || ss.s.opts.Username == "" {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(identity, username, password string) error {
		if username != ss.s.opts.Username || password != ss.s.opts.Password {
			return smtp.ErrAuthFailed
		}
		ss.user = username
		return nil
	}), nil
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	if ss.s.opts.Username != "" && ss.user == "" {
		return smtp.ErrAuthRequired
	}
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.s.mu.Lock()
	defer ss.s.mu.Unlock()
	key := strings.ToLower(to)
	if r, ok := ss.s.reject[key]; ok && r.times != 0 {
		if r.times > 0 {
			r.times--
			ss.s.reject[key] = r
		}
		return r.err
	}
	ss.to = append(ss.to, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCodeNotSet, Message: "malformed message: " + err.Error()}
	}
	body, _ := io.ReadAll(msg.Body)
	id := msg.Header.Get("Message-Id")

	ss.s.mu.Lock()
	ss.s.inflight[id]++
	if n := ss.s.inflight[id]; n > ss.s.maxInflight {
		ss.s.maxInflight = n
	}
	ss.s.mu.Unlock()
	if d := ss.s.opts.DataDelay; d > 0 {
		time.Sleep(d)
	}
	_, isTLS := ss.conn.TLSConnectionState()
	ss.s.mu.Lock()
	ss.s.inflight[id]--
	ss.s.received = append(ss.s.received, Received{
		From: ss.from, To: append([]string(nil), ss.to...), MessageID: id,
		IdempotencyKey: msg.Header.Get("Idempotency-Key"), Subject: msg.Header.Get("Subject"),
		Header: msg.Header, Body: body, Raw: raw, TLS: isTLS || ss.tls, AuthUser: ss.user,
	})
	ss.s.mu.Unlock()
	return nil
}

func (ss *session) Reset() {
	ss.from = ""
	ss.to = nil
}

func (ss *session) Logout() error { return nil }

// SelfSignedTLS returns a server TLS config with a fresh self-signed certificate for
// 127.0.0.1 and localhost, and the client config that trusts it.
func SelfSignedTLS() (server, client *tls.Config, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "emailtest"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}},
		MinVersion: tls.VersionTLS12}
	client = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return server, client, nil
}
