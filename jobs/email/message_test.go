package email_test

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/outbox"
)

func TestMessageBytesAreDeterministicWithDerivedHeaders(t *testing.T) {
	t.Parallel()
	date := time.Date(2025, 1, 31, 23, 59, 0, 0, time.UTC)
	m := email.Message{
		To:             []string{"Ada Lovelace <ada@example.com>", "bob@example.com"},
		Subject:        "Rechnung für 2025-01",
		Text:           "Total: 12.34 USD\nDanke schön.",
		Headers:        map[string]string{"X-Invoice-Id": "42"},
		MessageID:      email.MessageIDFor("invoice-email:42", ""),
		IdempotencyKey: outbox.DeliveryKey("invoice-email:42"),
		Date:           date,
	}
	a, err := m.Bytes("Billing <billing@example.com>")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Bytes("Billing <billing@example.com>")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two renderings of one message differ")
	}
	if !bytes.Contains(a, []byte("\r\n\r\n")) || bytes.Contains(bytes.ReplaceAll(a, []byte("\r\n"), nil), []byte("\n")) {
		t.Fatal("message lines must end in CRLF")
	}
	parsed, err := mail.ReadMessage(bytes.NewReader(a))
	if err != nil {
		t.Fatalf("parse rendered message: %v", err)
	}
	h := parsed.Header
	subject, err := new(mime.WordDecoder).DecodeHeader(h.Get("Subject"))
	if err != nil || subject != "Rechnung für 2025-01" {
		t.Errorf("subject = %q (%v)", subject, err)
	}
	for k, want := range map[string]string{
		"Message-Id":      m.MessageID,
		"Idempotency-Key": "invoice-email:42",
		"X-Invoice-Id":    "42",
		"Date":            "Fri, 31 Jan 2025 23:59:00 +0000",
		"From":            `"Billing" <billing@example.com>`,
		"To":              `"Ada Lovelace" <ada@example.com>, <bob@example.com>`,
	} {
		if got := h.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}

	m.HTML = "<p>Total: 12.34 USD</p>"
	c, err := m.Bytes("billing@example.com")
	if err != nil {
		t.Fatal(err)
	}
	d, _ := m.Bytes("billing@example.com")
	if !bytes.Equal(c, d) || !bytes.Contains(c, []byte("multipart/alternative")) || !bytes.Contains(c, []byte("text/html")) {
		t.Fatalf("multipart rendering not deterministic or incomplete:\n%s", c)
	}
}

func TestDerivedKeysAreStablePerDedupeKey(t *testing.T) {
	t.Parallel()
	a1 := email.MessageIDFor("invoice-email:1", "example.com")
	a2 := email.MessageIDFor("invoice-email:1", "example.com")
	b := email.MessageIDFor("invoice-email:2", "example.com")
	if a1 != a2 || a1 == b {
		t.Fatalf("Message-IDs: %q %q %q", a1, a2, b)
	}
	if !strings.HasPrefix(a1, "<") || !strings.HasSuffix(a1, "@example.com>") || len(a1) != len("<@example.com>")+32 {
		t.Fatalf("Message-ID shape: %q", a1)
	}
	if got := outbox.DeliveryKey("order-email:9"); got != "order-email:9" {
		t.Errorf("plain key = %q", got)
	}
	spaced := outbox.DeliveryKey("key with spaces é")
	if !strings.HasPrefix(spaced, "sha256:") || spaced != outbox.DeliveryKey("key with spaces é") {
		t.Errorf("hashed key = %q", spaced)
	}
}

func TestMessageValidation(t *testing.T) {
	t.Parallel()
	ok := email.Message{To: []string{"a@example.com"}, Subject: "hi", Text: "x"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid message: %v", err)
	}
	for name, tc := range map[string]struct {
		m    email.Message
		want string
	}{
		"NoRecipient":      {email.Message{Subject: "x"}, "at least one recipient"},
		"BadRecipient":     {email.Message{To: []string{"not an address"}}, "to[0]"},
		"BadFrom":          {email.Message{From: "@@", To: []string{"a@example.com"}}, "from"},
		"SubjectInjection": {email.Message{To: []string{"a@example.com"}, Subject: "x\r\nBcc: evil@example.com"}, "line breaks"},
		"ReservedHeader":   {email.Message{To: []string{"a@example.com"}, Headers: map[string]string{"bcc": "x@example.com"}}, "own fields"},
		"HeaderInjection":  {email.Message{To: []string{"a@example.com"}, Headers: map[string]string{"X-A": "1\nBcc: y"}}, "line breaks"},
		"BadHeaderName":    {email.Message{To: []string{"a@example.com"}, Headers: map[string]string{"X A": "1"}}, "field name"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.m.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := ok.Bytes(""); err == nil || !strings.Contains(err.Error(), "no sender") {
		t.Fatalf("Bytes without any sender: %v", err)
	}
}

func TestMessageRecipientsDecodeFromStringOrArray(t *testing.T) {
	t.Parallel()
	var one, many email.Message
	if err := json.Unmarshal([]byte(`{"to":"a@example.com","subject":"s"}`), &one); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"to":["a@example.com","b@example.com"]}`), &many); err != nil {
		t.Fatal(err)
	}
	if len(one.To) != 1 || one.To[0] != "a@example.com" || len(many.To) != 2 {
		t.Fatalf("decoded %v and %v", one.To, many.To)
	}
	var bad email.Message
	if err := json.Unmarshal([]byte(`{"to":5}`), &bad); err == nil {
		t.Fatal("a number decoded as recipients")
	}
}
