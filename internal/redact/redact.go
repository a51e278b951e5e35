// Package redact hides passwords in database connection strings before they are
// printed in errors, logs or reports.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// URL hides the password of a connection string, in URL or key=value form:
// postgres://u:secret@host/db becomes postgres://u:xxxxx@host/db, and
// "host=h password=secret" becomes "host=h password=xxxxx". A URL that does not
// parse is replaced as a whole, since its password cannot be found reliably.
func URL(raw string) string {
	if strings.Contains(raw, "://") {
		u, err := url.Parse(raw)
		if err != nil {
			return "(unparseable database URL)"
		}
		return u.Redacted()
	}
	return kvPassword.ReplaceAllString(raw, "${1}xxxxx")
}

var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)
