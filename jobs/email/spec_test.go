package email_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenceq/fenceq/jobs/email"
)

func TestParseMailer(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "mail.jsonl")
	m, desc, closeFn, err := email.ParseMailer("file:" + path)
	if err != nil {
		t.Fatalf("file: %v", err)
	}
	if _, ok := m.(*email.FileMailer); !ok || desc != "emails are written as JSON lines to "+path {
		t.Errorf("file: %T, %q", m, desc)
	}
	if err := closeFn(); err != nil {
		t.Errorf("close the file mailer: %v", err)
	}

	m, desc, closeFn, err = email.ParseMailer("smtp://ada:secret@127.0.0.1:2525?from=billing@example.com&starttls=off")
	if err != nil {
		t.Fatalf("smtp: %v", err)
	}
	if _, ok := m.(*email.SMTPMailer); !ok || desc != "emails are sent over SMTP to 127.0.0.1:2525" {
		t.Errorf("smtp: %T, %q", m, desc)
	}
	if err := closeFn(); err != nil {
		t.Errorf("close the smtp mailer: %v", err)
	}
}

func TestParseMailerErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ spec, want string }{
		{"carrier-pigeon", `invalid mailer "carrier-pigeon": want file:PATH or smtp://HOST:PORT?from=ADDR`},
		{"", `invalid mailer "": want file:PATH`},
		{"file:", `invalid mailer "file:": file: needs a path`},
		{"smtp://127.0.0.1:25", "From: required"},
		{"smtp://127.0.0.1:25?from=a@example.com&starttls=maybe", `starttls mode "maybe"`},
		{"smtp://ada:secret@127.0.0.1:25?starttls=maybe", "ada:xxxxx@127.0.0.1:25"},
		{"smtp://ada:secret@bad host:25?from=a@example.com", `invalid mailer "smtp://…": invalid character`},
	} {
		_, _, _, err := email.ParseMailer(c.spec)
		var se *email.SpecError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseMailer(%q) = %v, want a *SpecError containing %q", c.spec, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseMailer(%q): %v shows the password", c.spec, err)
		}
	}
	// A file that cannot be opened is the mailer's error, not the spec's.
	_, _, _, err := email.ParseMailer("file:" + filepath.Join(t.TempDir(), "no", "such", "dir", "mail.jsonl"))
	var se *email.SpecError
	if err == nil || errors.As(err, &se) || !strings.Contains(err.Error(), "open mail file") {
		t.Errorf("unopenable file: %v, want an open error that is not a *SpecError", err)
	}
}
