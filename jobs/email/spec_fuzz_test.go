package email_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fenceq/fenceq/jobs/email"
)

// FuzzParseMailer parses fuzzed --mailer specs. A spec it cannot use is a *SpecError
// whose text never shows the URL's password; a file that cannot be opened is the only
// other error; a usable spec gives a mailer, a description naming where mail goes and a
// release func. File paths are moved into a temporary directory, so the fuzzer never
// writes elsewhere.
func FuzzParseMailer(f *testing.F) {
	for _, s := range []string{
		// valid
		"file:mail.jsonl", "file:-", "file:dir with spaces.jsonl",
		"smtp://127.0.0.1:25?from=billing@example.com",
		"smtp://ada:secret@127.0.0.1:2525?from=billing@example.com&starttls=off",
		"smtp://ada@mail.example.com:587?from=Billing%20%3Cbilling@example.com%3E&starttls=required",
		"smtp://[::1]:25?from=a@example.com&starttls=opportunistic",
		"smtp://ada:p%40ss%3Aw0rd@127.0.0.1:25?from=a@example.com",
		// invalid
		"", "file:", "carrier-pigeon", "smtp:", "smtp://", "smtp://127.0.0.1:25", "smtp://127.0.0.1?from=a@example.com",
		"smtp://127.0.0.1:25?from=not-an-address", "smtp://127.0.0.1:25?from=a@example.com&starttls=maybe",
		"smtp://:secret@127.0.0.1:25?from=a@example.com", "smtp://ada:secret@bad host:25?from=a@example.com",
		"smtp://ada:secret%zz@127.0.0.1:25?from=a@example.com", "smtp://ada:secret@127.0.0.1:port?from=a@example.com",
		"smtp://ada:secret@[::1:25?from=a@example.com", "smtp://ada:secret@127.0.0.1:25?from=a@example.com&starttls=%zz",
		"SMTP://127.0.0.1:25?from=a@example.com", "smtp://ada:se\x00cret@127.0.0.1:25?from=a@example.com",
		"smtps://127.0.0.1:465?from=a@example.com",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		if path, ok := strings.CutPrefix(spec, "file:"); ok && path != "" && path != "-" {
			name := strings.NewReplacer("/", "_", "\x00", "_", "\\", "_").Replace(path)
			if len(name) > 200 {
				name = name[:200]
			}
			if name == "." || name == ".." {
				name = "_" + name
			}
			spec = "file:" + filepath.Join(t.TempDir(), name)
		}
		m, desc, closeFn, err := email.ParseMailer(spec)
		if err != nil {
			if m != nil || closeFn != nil {
				t.Fatalf("ParseMailer(%q) = %v with a mailer or a release func", spec, err)
			}
			var se *email.SpecError
			if !errors.As(err, &se) {
				if !strings.HasPrefix(spec, "file:") || !strings.Contains(err.Error(), "open mail file") {
					t.Fatalf("ParseMailer(%q) = %v (%T), want a *email.SpecError", spec, err, err)
				}
				return
			}
			if se.Reason == "" || !strings.HasPrefix(err.Error(), "invalid mailer ") {
				t.Fatalf("ParseMailer(%q) = %v: want \"invalid mailer SPEC: REASON\"", spec, err)
			}
			if pw := password(spec); len(pw) >= 4 && strings.Count(spec, pw) == 1 &&
				(strings.Contains(err.Error(), pw) || strings.Contains(se.Spec, pw)) {
				t.Fatalf("ParseMailer(%q) = %v: shows the password %q", spec, err, pw)
			}
			return
		}
		if m == nil || closeFn == nil || desc == "" {
			t.Fatalf("ParseMailer(%q) = %v, %q, release func %v: want all three", spec, m, desc, closeFn != nil)
		}
		if err := closeFn(); err != nil {
			t.Fatalf("ParseMailer(%q): release: %v", spec, err)
		}
		switch m.(type) {
		case *email.FileMailer:
			if !strings.HasPrefix(spec, "file:") || !strings.HasSuffix(desc, strings.TrimPrefix(spec, "file:")) {
				t.Fatalf("ParseMailer(%q): a file mailer described as %q", spec, desc)
			}
		case *email.SMTPMailer:
			if !strings.HasPrefix(spec, "smtp://") || !strings.HasPrefix(desc, "emails are sent over SMTP to ") {
				t.Fatalf("ParseMailer(%q): an SMTP mailer described as %q", spec, desc)
			}
			if pw := password(spec); len(pw) >= 4 && strings.Count(spec, pw) == 1 && strings.Contains(desc, pw) {
				t.Fatalf("ParseMailer(%q): description %q shows the password", spec, desc)
			}
		default:
			t.Fatalf("ParseMailer(%q) = %T", spec, m)
		}
	})
}

// password is the text between the first ':' and the last '@' of an smtp:// spec's
// authority, as written (escaped), whether or not the URL parses; "" when there is none.
func password(spec string) string {
	rest, ok := strings.CutPrefix(spec, "smtp://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, ok := strings.Cut(rest[:at], ":")
	if !ok {
		return ""
	}
	return pw
}
