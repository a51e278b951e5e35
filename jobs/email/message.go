// Package email delivers the outbox rows of topic "email": the outbox.Deliverer that an
// outbox.Relay calls for them, and the Mailer it sends through (SMTP, or a file of JSON
// lines for local runs).
//
// # Exactly once, as far as the outside world allows
//
// An email is a row in fenceq_outbox written in the same transaction as the business
// rows that caused it (an invoice, an order), so it exists if and only if they do. The
// relay delivers it at least once: the row's delivery job is claimed, leased, fenced,
// heartbeated, reaped and retried by the queue's own machinery. A relay can crash after
// the SMTP server accepted a message but before the row was marked delivered; the next
// holder then sends it again. Every attempt for a row therefore carries the same
// Message-ID and Idempotency-Key header, both derived from the row's dedupe key, so the
// receiver can drop the copy.
//
// # Outbox payload of topic "email"
//
// The payload is a Message as JSON:
//
//	{"to": ["ada@example.com"], "subject": "Your invoice", "text": "...", "html": "..."}
//
// "to" may also be a single string. "from" is optional (the mailer's From is used).
// message_id, idempotency_key and date are set by the relay.
package email

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"net/textproto"
	"slices"
	"strings"
	"time"
)

// TopicEmail is the outbox topic the relay delivers through its Mailer.
const TopicEmail = "email"

// DefaultMessageIDDomain is the right-hand side of derived Message-IDs when
// RelayConfig.MessageIDDomain is empty.
const DefaultMessageIDDomain = "fenceq.outbox"

// Message is one email. In an outbox payload it is JSON (see the package doc).
type Message struct {
	// From is the header sender; empty means the mailer's configured From.
	From string `json:"from,omitempty"`
	// To lists the recipients (RFC 5322 addresses, "Name <a@b>" allowed).
	To AddressList `json:"to"`
	// Subject may be any UTF-8 text without line breaks.
	Subject string `json:"subject"`
	// Text is the plain-text body.
	Text string `json:"text,omitempty"`
	// HTML is an optional HTML alternative to Text.
	HTML string `json:"html,omitempty"`
	// Headers are extra headers, e.g. "X-Invoice-Id". Headers the Message sets itself
	// (From, To, Subject, Date, Message-ID, Idempotency-Key, MIME-Version, Content-*)
	// are not allowed here.
	Headers map[string]string `json:"headers,omitempty"`
	// MessageID is the Message-ID header, "<id@domain>". The relay derives it from the
	// outbox row's dedupe key: identical on every attempt.
	MessageID string `json:"message_id,omitempty"`
	// IdempotencyKey is the Idempotency-Key header, derived like MessageID.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Date is the Date header; the relay uses the outbox row's created_at (the
	// database's clock), so every attempt is byte-identical. Zero means now.
	Date time.Time `json:"date,omitzero"`
}

// AddressList is a list of addresses that also decodes from a single JSON string.
type AddressList []string

// UnmarshalJSON accepts "a@b" as well as ["a@b", "c@d"].
func (l *AddressList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = AddressList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("recipients: want a string or an array of strings: %w", err)
	}
	*l = many
	return nil
}

// reservedHeaders are set from Message fields and may not appear in Headers.
var reservedHeaders = []string{"From", "To", "Cc", "Bcc", "Subject", "Date", "Message-Id",
	"Idempotency-Key", "Mime-Version", "Content-Type", "Content-Transfer-Encoding"}

// Validate checks the message without sending it; errors name the field.
func (m *Message) Validate() error {
	if len(m.To) == 0 {
		return fmt.Errorf("message: to: at least one recipient is required")
	}
	for i, a := range m.To {
		if _, err := mail.ParseAddress(a); err != nil {
			return fmt.Errorf("message: to[%d] %q: %w", i, a, err)
		}
	}
	if m.From != "" {
		if _, err := mail.ParseAddress(m.From); err != nil {
			return fmt.Errorf("message: from %q: %w", m.From, err)
		}
	}
	if strings.ContainsAny(m.Subject, "\r\n") {
		return fmt.Errorf("message: subject: must not contain line breaks")
	}
	for _, v := range []struct{ name, value string }{{"message_id", m.MessageID}, {"idempotency_key", m.IdempotencyKey}} {
		if !printableASCII(v.value, false) {
			return fmt.Errorf("message: %s %q: must be printable ASCII without spaces", v.name, v.value)
		}
	}
	for k, v := range m.Headers {
		canon := textproto.CanonicalMIMEHeaderKey(k)
		if k == "" || !printableASCII(k, false) || strings.Contains(k, ":") {
			return fmt.Errorf("message: header name %q is not a valid field name", k)
		}
		if slices.Contains(reservedHeaders, canon) {
			return fmt.Errorf("message: header %q is set from the message's own fields", k)
		}
		if strings.ContainsAny(v, "\r\n") {
			return fmt.Errorf("message: header %q: value must not contain line breaks", k)
		}
	}
	return nil
}

func printableASCII(s string, spaces bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c > '~' || c < '!' && !(spaces && c == ' ') {
			return false
		}
	}
	return true
}

// MessageIDFor derives the Message-ID of every delivery attempt of an outbox row from
// its dedupe key: "<" + 32 hex digits of SHA-256 + "@" + domain + ">".
func MessageIDFor(dedupeKey, domain string) string {
	if domain == "" {
		domain = DefaultMessageIDDomain
	}
	sum := sha256.Sum256([]byte("fenceq-outbox:" + dedupeKey))
	return "<" + hex.EncodeToString(sum[:16]) + "@" + domain + ">"
}

// Envelope returns the bare addresses of the recipients, for SMTP RCPT TO.
func (m *Message) Envelope() ([]string, error) {
	out := make([]string, len(m.To))
	for i, a := range m.To {
		p, err := mail.ParseAddress(a)
		if err != nil {
			return nil, fmt.Errorf("message: to[%d] %q: %w", i, a, err)
		}
		out[i] = p.Address
	}
	return out, nil
}

// Bytes renders the message as RFC 5322 text with CRLF line endings. from is used when
// the message has no From. The rendering is deterministic: the same message gives the
// same bytes, so every attempt of a delivery sends identical content.
func (m *Message) Bytes(from string) ([]byte, error) {
	if m.From != "" {
		from = m.From
	}
	if from == "" {
		return nil, fmt.Errorf("message: from: no sender (set the mailer's From or the message's)")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	fromAddr, err := mail.ParseAddress(from)
	if err != nil {
		return nil, fmt.Errorf("message: from %q: %w", from, err)
	}
	var b bytes.Buffer
	header := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	header("From", fromAddr.String())
	to := make([]string, len(m.To))
	for i, a := range m.To {
		p, _ := mail.ParseAddress(a) // validated above
		to[i] = p.String()
	}
	header("To", strings.Join(to, ", "))
	header("Subject", mime.QEncoding.Encode("utf-8", m.Subject))
	date := m.Date
	if date.IsZero() {
		date = time.Now()
	}
	header("Date", date.UTC().Format(time.RFC1123Z))
	if m.MessageID != "" {
		header("Message-ID", m.MessageID)
	}
	if m.IdempotencyKey != "" {
		header("Idempotency-Key", m.IdempotencyKey)
	}
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		header(textproto.CanonicalMIMEHeaderKey(k), mime.QEncoding.Encode("utf-8", m.Headers[k]))
	}
	header("MIME-Version", "1.0")
	if m.HTML == "" {
		header("Content-Type", "text/plain; charset=utf-8")
		header("Content-Transfer-Encoding", "quoted-printable")
		b.WriteString("\r\n")
		if err := writeQP(&b, m.Text); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	// multipart/alternative with a boundary derived from the content, so the rendering
	// stays deterministic.
	sum := sha256.Sum256([]byte(m.MessageID + "\x00" + m.Text + "\x00" + m.HTML))
	boundary := "fenceq-" + hex.EncodeToString(sum[:12])
	header("Content-Type", `multipart/alternative; boundary="`+boundary+`"`)
	b.WriteString("\r\n")
	mw := multipart.NewWriter(&b)
	if err := mw.SetBoundary(boundary); err != nil {
		return nil, fmt.Errorf("message: boundary: %w", err)
	}
	for _, part := range []struct{ ctype, body string }{{"text/plain", m.Text}, {"text/html", m.HTML}} {
		pw, err := mw.CreatePart(textproto.MIMEHeader{
			"Content-Type":              {part.ctype + "; charset=utf-8"},
			"Content-Transfer-Encoding": {"quoted-printable"},
		})
		if err != nil {
			return nil, fmt.Errorf("message: %s part: %w", part.ctype, err)
		}
		if err := writeQP(pw, part.body); err != nil {
			return nil, err
		}
	}
	if err := mw.Close(); err != nil {
		return nil, fmt.Errorf("message: close multipart: %w", err)
	}
	return b.Bytes(), nil
}

func writeQP(w io.Writer, body string) error {
	qp := quotedprintable.NewWriter(w)
	if _, err := qp.Write([]byte(body)); err != nil {
		return fmt.Errorf("message: encode body: %w", err)
	}
	if err := qp.Close(); err != nil {
		return fmt.Errorf("message: encode body: %w", err)
	}
	return nil
}
