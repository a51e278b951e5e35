package email

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// SpecError is a mailer spec ParseMailer cannot use: the command line's mistake, not
// the mail system's.
type SpecError struct {
	// Spec is the spec as given, with any password hidden.
	Spec string
	// Reason says what is wrong with it.
	Reason string
}

// Error implements error.
func (e *SpecError) Error() string { return fmt.Sprintf("invalid mailer %q: %s", e.Spec, e.Reason) }

// ParseMailer builds the mailer a spec names:
//
//	file:PATH     a FileMailer appending JSON lines to PATH (file:- for standard output)
//	smtp://[USER:PASSWORD@]HOST:PORT?from=ADDR[&starttls=off|opportunistic|required]
//	              an SMTPMailer (STARTTLS opportunistic unless starttls says otherwise)
//
// It returns a line describing where emails go, for the log, and a func releasing the
// mailer (closing the file). A spec it cannot use is a *SpecError; any other error
// (the file cannot be opened) comes from the mailer.
func ParseMailer(spec string) (m Mailer, desc string, closeFn func() error, err error) {
	bad := func(reason string) error { return &SpecError{Spec: shownSpec(spec), Reason: reason} }
	switch {
	case strings.HasPrefix(spec, "file:"):
		path := strings.TrimPrefix(spec, "file:")
		if path == "" {
			return nil, "", nil, bad("file: needs a path")
		}
		fm, err := NewFileMailer(path)
		if err != nil {
			return nil, "", nil, fmt.Errorf("open mail file: %w", err)
		}
		return fm, "emails are written as JSON lines to " + path, fm.Close, nil
	case strings.HasPrefix(spec, "smtp://"):
		u, err := url.Parse(spec)
		if err != nil {
			// url.Error repeats the URL, password included: keep only the reason.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return nil, "", nil, bad(err.Error())
		}
		cfg := SMTPConfig{Addr: u.Host, From: u.Query().Get("from"), Timeout: 30 * time.Second}
		if u.User != nil {
			cfg.Username = u.User.Username()
			cfg.Password, _ = u.User.Password()
		}
		if s := u.Query().Get("starttls"); s != "" {
			if cfg.StartTLS, err = ParseStartTLSMode(s); err != nil {
				return nil, "", nil, bad(err.Error())
			}
		}
		sm, err := NewSMTPMailer(cfg)
		if err != nil {
			return nil, "", nil, bad(err.Error())
		}
		return sm, "emails are sent over SMTP to " + cfg.Addr, func() error { return nil }, nil
	}
	return nil, "", nil, bad("want file:PATH or smtp://HOST:PORT?from=ADDR")
}

// shownSpec is spec with any password hidden. A URL that does not parse is cut after
// its scheme, since where its password is cannot be known.
func shownSpec(spec string) string {
	scheme, _, isURL := strings.Cut(spec, "://")
	if !isURL {
		return spec
	}
	u, err := url.Parse(spec)
	if err != nil {
		return scheme + "://…"
	}
	return u.Redacted()
}
