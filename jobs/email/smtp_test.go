package email_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/email/emailtest"
	"github.com/fenceq/fenceq/outbox"
)

func newSMTP(t *testing.T, cfg email.SMTPConfig) *email.SMTPMailer {
	t.Helper()
	if cfg.From == "" {
		cfg.From = "Billing <billing@example.com>"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	m, err := email.NewSMTPMailer(cfg)
	if err != nil {
		t.Fatalf("new smtp mailer: %v", err)
	}
	return m
}

func testMessage(to ...string) email.Message {
	return email.Message{
		To: to, Subject: "Your invoice", Text: "Total: 1.00 USD\n.\nA line with a lone dot above.",
		MessageID: email.MessageIDFor("k:1", ""), IdempotencyKey: outbox.DeliveryKey("k:1"),
		Date: time.Date(2025, 2, 1, 0, 0, 0, 0, time.UTC),
	}
}

func TestSMTPMailerSendsPlain(t *testing.T) {
	t.Parallel()
	srv := emailtest.Start(t)
	m := newSMTP(t, email.SMTPConfig{Addr: srv.Addr, StartTLS: email.StartTLSOpportunistic})
	if err := m.Send(context.Background(), testMessage("ada@example.com", "Bob <bob@example.com>")); err != nil {
		t.Fatalf("send: %v", err)
	}
	got := srv.Received()
	if len(got) != 1 {
		t.Fatalf("received %d messages", len(got))
	}
	r := got[0]
	if r.From != "billing@example.com" || len(r.To) != 2 || r.To[1] != "bob@example.com" || r.TLS {
		t.Fatalf("envelope: %+v", r)
	}
	if r.MessageID != email.MessageIDFor("k:1", "") || r.IdempotencyKey != "k:1" {
		t.Fatalf("headers: Message-ID %q Idempotency-Key %q", r.MessageID, r.IdempotencyKey)
	}
	// Dot-stuffing round-trips: the lone dot line is part of the body, not the end.
	if !bytes.Contains(r.Body, []byte("A line with a lone dot above.")) {
		t.Fatalf("body: %q", r.Body)
	}
}

func TestSMTPMailerStartTLSAndAuth(t *testing.T) {
	t.Parallel()
	serverTLS, clientTLS, err := emailtest.SelfSignedTLS()
	if err != nil {
		t.Fatal(err)
	}
	srv := emailtest.Start(t, emailtest.Options{TLS: serverTLS, Username: "relay", Password: "s3cret"})
	m := newSMTP(t, email.SMTPConfig{Addr: srv.Addr, StartTLS: email.StartTLSRequired, TLSConfig: clientTLS,
		Username: "relay", Password: "s3cret", HelloName: "worker.example.com"})
	if err := m.Send(context.Background(), testMessage("ada@example.com")); err != nil {
		t.Fatalf("send over STARTTLS with auth: %v", err)
	}
	got := srv.Received()
	if len(got) != 1 || !got[0].TLS || got[0].AuthUser != "relay" {
		t.Fatalf("received %+v", got)
	}

	t.Run("WrongPasswordIsPermanent", func(t *testing.T) {
		bad := newSMTP(t, email.SMTPConfig{Addr: srv.Addr, StartTLS: email.StartTLSRequired, TLSConfig: clientTLS,
			Username: "relay", Password: "wrong"})
		err := bad.Send(context.Background(), testMessage("ada@example.com"))
		if !email.IsPermanent(err) || !strings.Contains(err.Error(), "535") {
			t.Fatalf("wrong password: %v (permanent %v)", err, email.IsPermanent(err))
		}
	})
	t.Run("UntrustedCertificateIsAnError", func(t *testing.T) {
		untrusted := newSMTP(t, email.SMTPConfig{Addr: srv.Addr, StartTLS: email.StartTLSOpportunistic})
		if err := untrusted.Send(context.Background(), testMessage("ada@example.com")); err == nil || !strings.Contains(err.Error(), "starttls") {
			t.Fatalf("self-signed certificate without trust: %v", err)
		}
	})
	if n := len(srv.Received()); n != 1 {
		t.Fatalf("failed sends delivered something: %d messages", n)
	}
}

func TestSMTPMailerRequiredTLSRefusesPlainServer(t *testing.T) {
	t.Parallel()
	srv := emailtest.Start(t)
	m := newSMTP(t, email.SMTPConfig{Addr: srv.Addr, StartTLS: email.StartTLSRequired})
	err := m.Send(context.Background(), testMessage("ada@example.com"))
	if err == nil || !strings.Contains(err.Error(), "does not offer it") || email.IsPermanent(err) {
		t.Fatalf("required STARTTLS against a plain server: %v", err)
	}
	if len(srv.Received()) != 0 {
		t.Fatal("message sent in plain text although TLS was required")
	}
}

func TestSMTPMailerClassifiesRejections(t *testing.T) {
	t.Parallel()
	srv := emailtest.Start(t)
	srv.RejectRecipient("nobody@example.com", 550, "no such user", -1)
	srv.RejectRecipient("busy@example.com", 451, "try again later", -1)
	m := newSMTP(t, email.SMTPConfig{Addr: srv.Addr, StartTLS: email.StartTLSOff})

	err := m.Send(context.Background(), testMessage("ada@example.com", "nobody@example.com"))
	var pe *email.PermanentError
	if !errors.As(err, &pe) || pe.Code != 550 || !strings.Contains(err.Error(), "no such user") || !strings.Contains(err.Error(), "nobody@example.com") {
		t.Fatalf("550: %v", err)
	}
	err = m.Send(context.Background(), testMessage("busy@example.com"))
	if err == nil || email.IsPermanent(err) || !strings.Contains(err.Error(), "451") {
		t.Fatalf("451: %v (permanent %v)", err, email.IsPermanent(err))
	}
	if err := m.Send(context.Background(), email.Message{To: []string{"bad address"}}); !email.IsPermanent(err) {
		t.Fatalf("invalid message: %v", err)
	}
	// A refused recipient stops the whole message before DATA: nobody got a copy.
	if n := len(srv.Received()); n != 0 {
		t.Fatalf("%d messages accepted despite refused recipients", n)
	}
}

func TestSMTPMailerHonoursContext(t *testing.T) {
	t.Parallel()
	srv := emailtest.Start(t, emailtest.Options{DataDelay: 3 * time.Second})
	m := newSMTP(t, email.SMTPConfig{Addr: srv.Addr, StartTLS: email.StartTLSOff})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := m.Send(ctx, testMessage("ada@example.com"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send past its context: %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("send returned %s after its context ended", time.Since(start))
	}
}

func TestSMTPConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]email.SMTPConfig{
		"NoAddr":       {From: "a@example.com"},
		"BadAddr":      {Addr: "localhost", From: "a@example.com"},
		"NoFrom":       {Addr: "localhost:25"},
		"BadMode":      {Addr: "localhost:25", From: "a@example.com", StartTLS: "sometimes"},
		"PasswordOnly": {Addr: "localhost:25", From: "a@example.com", Password: "x"},
	} {
		if _, err := email.NewSMTPMailer(cfg); err == nil {
			t.Errorf("%s: accepted %+v", name, cfg)
		}
	}
	if _, err := email.ParseStartTLSMode("required"); err != nil {
		t.Error(err)
	}
}
