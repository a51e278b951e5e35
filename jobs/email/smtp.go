package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"net/smtp"
	"time"
)

// StartTLSMode says whether the SMTP mailer upgrades the connection with STARTTLS.
type StartTLSMode string

// STARTTLS modes.
const (
	// StartTLSOff never upgrades: for a local relay or a test server.
	StartTLSOff StartTLSMode = "off"
	// StartTLSOpportunistic upgrades when the server offers STARTTLS, else sends in
	// plain text. A server that offers it but fails the handshake or certificate check
	// is an error (no silent downgrade).
	StartTLSOpportunistic StartTLSMode = "opportunistic"
	// StartTLSRequired refuses to send unless the server offers STARTTLS and the
	// upgrade succeeds.
	StartTLSRequired StartTLSMode = "required"
)

// ParseStartTLSMode parses "off", "opportunistic" or "required".
func ParseStartTLSMode(s string) (StartTLSMode, error) {
	switch m := StartTLSMode(s); m {
	case StartTLSOff, StartTLSOpportunistic, StartTLSRequired:
		return m, nil
	}
	return "", fmt.Errorf("starttls mode %q: want off, opportunistic or required", s)
}

// SMTPConfig configures an SMTPMailer.
type SMTPConfig struct {
	// Addr is the server's host:port. Required.
	Addr string
	// From is the envelope sender (MAIL FROM) and the From header of messages that set
	// none. Required.
	From string
	// Username and Password enable AUTH PLAIN when Username is set. The credentials are
	// only sent over TLS, or in plain text to localhost.
	Username string
	Password string
	// StartTLS defaults to StartTLSOpportunistic.
	StartTLS StartTLSMode
	// HelloName is the name sent with EHLO. Defaults to "localhost".
	HelloName string
	// Timeout bounds one Send: dial, conversation and DATA. Defaults to 30s.
	Timeout time.Duration
	// TLSConfig is used for STARTTLS; ServerName defaults to Addr's host. Defaults to
	// the system roots.
	TLSConfig *tls.Config
}

// SMTPMailer sends each message over its own SMTP connection (EHLO, optional STARTTLS
// and AUTH PLAIN, MAIL, RCPT, DATA, QUIT). It is safe for concurrent use.
type SMTPMailer struct {
	cfg  SMTPConfig
	host string
	from string // bare envelope address
}

var _ Mailer = (*SMTPMailer)(nil)

// NewSMTPMailer validates the config and returns a mailer; it does not connect.
func NewSMTPMailer(cfg SMTPConfig) (*SMTPMailer, error) {
	if cfg.Addr == "" {
		return nil, errors.New("smtp mailer: Addr: required (host:port)")
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("smtp mailer: Addr %q: %w", cfg.Addr, err)
	}
	if cfg.From == "" {
		return nil, errors.New("smtp mailer: From: required")
	}
	from, err := mail.ParseAddress(cfg.From)
	if err != nil {
		return nil, fmt.Errorf("smtp mailer: From %q: %w", cfg.From, err)
	}
	if cfg.StartTLS == "" {
		cfg.StartTLS = StartTLSOpportunistic
	}
	if _, err := ParseStartTLSMode(string(cfg.StartTLS)); err != nil {
		return nil, fmt.Errorf("smtp mailer: StartTLS: %w", err)
	}
	if cfg.Password != "" && cfg.Username == "" {
		return nil, errors.New("smtp mailer: Password is set but Username is empty")
	}
	if cfg.HelloName == "" {
		cfg.HelloName = "localhost"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.TLSConfig == nil {
		cfg.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	} else {
		cfg.TLSConfig = cfg.TLSConfig.Clone()
	}
	if cfg.TLSConfig.ServerName == "" {
		cfg.TLSConfig.ServerName = host
	}
	return &SMTPMailer{cfg: cfg, host: host, from: from.Address}, nil
}

// Send delivers one message. SMTP 5xx replies come back as *PermanentError; a recipient
// refused with 5xx stops the message before DATA, so nobody receives a partial send.
func (s *SMTPMailer) Send(ctx context.Context, m Message) error {
	raw, err := m.Bytes(s.cfg.From)
	if err != nil {
		return &PermanentError{Err: err}
	}
	rcpts, err := m.Envelope()
	if err != nil {
		return &PermanentError{Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()

	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("smtp %s: dial: %w", s.cfg.Addr, err)
	}
	defer func() { _ = conn.Close() }()
	// The end of ctx (cancellation or the timeout) interrupts any read or write in
	// progress; only then, so an i/o error from it always comes with ctx.Err() set.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	err = s.converse(conn, raw, rcpts)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("smtp %s: %w (%w)", s.cfg.Addr, context.Cause(ctx), err)
	}
	if err != nil {
		return fmt.Errorf("smtp %s: %w", s.cfg.Addr, err)
	}
	return nil
}

func (s *SMTPMailer) converse(conn net.Conn, raw []byte, rcpts []string) error {
	c, err := smtp.NewClient(conn, s.host)
	if err != nil {
		return classify("greeting", err)
	}
	defer func() { _ = c.Close() }()
	if err := c.Hello(s.cfg.HelloName); err != nil {
		return classify("ehlo", err)
	}
	if s.cfg.StartTLS != StartTLSOff {
		if ok, _ := c.Extension("STARTTLS"); ok {
			if err := c.StartTLS(s.cfg.TLSConfig); err != nil {
				return fmt.Errorf("starttls: %w", err)
			}
		} else if s.cfg.StartTLS == StartTLSRequired {
			return errors.New("starttls: required but the server does not offer it")
		}
	}
	if s.cfg.Username != "" {
		if ok, _ := c.Extension("AUTH"); !ok {
			return errors.New("auth: credentials configured but the server offers no AUTH")
		}
		if err := c.Auth(smtp.PlainAuth("", s.cfg.Username, s.cfg.Password, s.host)); err != nil {
			return classify("auth", err)
		}
	}
	if err := c.Mail(s.from); err != nil {
		return classify("mail from", err)
	}
	for _, r := range rcpts {
		if err := c.Rcpt(r); err != nil {
			_ = c.Reset()
			return classify(fmt.Sprintf("rcpt to <%s>", r), err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return classify("data", err)
	}
	if _, err := w.Write(raw); err != nil {
		return fmt.Errorf("data: write: %w", err)
	}
	// Close sends the final dot and reads the server's verdict on the message.
	if err := w.Close(); err != nil {
		return classify("data", err)
	}
	// The message is accepted; a failed QUIT does not change that.
	_ = c.Quit()
	return nil
}
