package migrations

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/jackc/pgx/v5/pgconn"
)

// splitStatements cuts a migration file into its SQL statements, at the semicolons
// that end them. A semicolon inside a string literal ('…', E'…' with backslash
// escapes), a quoted identifier ("…"), a dollar-quoted body ($$…$$, $tag$…$tag$), a
// line comment (-- …) or a block comment (/* … */, nested) does not end a statement.
// Statements are returned trimmed, with their comments, without the final semicolon;
// a piece that holds only whitespace and comments is dropped.
func splitStatements(sql string) []string {
	var out []string
	start := 0
	emit := func(end int) {
		if s := strings.TrimSpace(sql[start:end]); !onlyComments(s) {
			out = append(out, s)
		}
	}
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ';':
			emit(i)
			i++
			start = i
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			i = skipLineComment(sql, i)
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = skipBlockComment(sql, i)
		case c == '\'':
			escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i < 2 || !isIdentChar(sql[i-2]))
			i = skipQuoted(sql, i, '\'', escapes)
		case c == '"':
			i = skipQuoted(sql, i, '"', false)
		case c == '$' && (i == 0 || !isIdentChar(sql[i-1])):
			if tag, ok := dollarTag(sql, i); ok {
				end := strings.Index(sql[i+len(tag):], tag)
				if end < 0 {
					i = len(sql)
				} else {
					i += len(tag) + end + len(tag)
				}
			} else {
				i++
			}
		default:
			i++
		}
	}
	emit(len(sql))
	return out
}

// onlyComments reports whether s holds nothing but whitespace and comments.
func onlyComments(s string) bool {
	for i := 0; i < len(s); {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f':
			i++
		case strings.HasPrefix(s[i:], "--"):
			i = skipLineComment(s, i)
		case strings.HasPrefix(s[i:], "/*"):
			i = skipBlockComment(s, i)
		default:
			return false
		}
	}
	return true
}

func skipLineComment(s string, i int) int {
	if nl := strings.IndexByte(s[i:], '\n'); nl >= 0 {
		return i + nl + 1
	}
	return len(s)
}

// skipBlockComment returns the index after the block comment starting at i; block
// comments nest in PostgreSQL.
func skipBlockComment(s string, i int) int {
	depth := 0
	for i < len(s) {
		switch {
		case strings.HasPrefix(s[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(s[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(s)
}

// skipQuoted returns the index after the literal or identifier opened by q at i. A
// doubled quote stands for itself; with escapes a backslash escapes the next byte.
func skipQuoted(s string, i int, q byte, escapes bool) int {
	for i++; i < len(s); i++ {
		switch {
		case escapes && s[i] == '\\':
			i++
		case s[i] == q:
			if i+1 < len(s) && s[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(s)
}

// dollarTag returns the dollar-quote delimiter ($$ or $tag$) starting at i, if one
// does: a tag is an identifier that does not start with a digit ($1 is a parameter).
func dollarTag(s string, i int) (string, bool) {
	for j := i + 1; j < len(s); j++ {
		c := s[j]
		if c == '$' {
			return s[i : j+1], true
		}
		if !isIdentChar(c) || (j == i+1 && c >= '0' && c <= '9') {
			return "", false
		}
	}
	return "", false
}

func isIdentChar(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// stepDriver runs each migration file statement by statement, inside one explicit
// transaction, on the connection of the driver it wraps. A file sent whole is one
// multi-statement query, which a Citus coordinator refuses ("cannot insert multiple
// commands into a prepared statement"); sent one statement at a time it is not. The
// transaction keeps what the single query gave on PostgreSQL: a file applies whole or
// not at all.
//
// It also follows the versions golang-migrate records, so that a file that failed and
// was rolled back can be named (StatementError) and the dirty mark golang-migrate set
// before running it can be taken back: the schema is exactly as it was before the file.
type stepDriver struct {
	database.Driver
	// clean is the last version recorded clean: the set's version before the file
	// being run (database.NilVersion when none).
	clean int
	// target is the version recorded dirty before the file being run.
	target int
	// failed is the last file that failed, nil when none did.
	failed *StatementError
}

// SetVersion implements database.Driver.
func (d *stepDriver) SetVersion(version int, dirty bool) error {
	if err := d.Driver.SetVersion(version, dirty); err != nil {
		return err
	}
	if dirty {
		d.target = version
	} else {
		d.clean = version
	}
	return nil
}

// Run implements database.Driver.
func (d *stepDriver) Run(migration io.Reader) error {
	b, err := io.ReadAll(migration)
	if err != nil {
		return fmt.Errorf("read migration: %w", err)
	}
	stmts := splitStatements(string(b))
	if len(stmts) == 0 {
		return nil
	}
	// The file run is the up file of target when going up, the down file of the
	// clean version when going down.
	fail := &StatementError{Version: uint(max(d.target, d.clean)), Down: d.target < d.clean}
	if err := d.Driver.Run(strings.NewReader("BEGIN")); err != nil {
		fail.Err, fail.RolledBack = err, true
		d.failed = fail
		return fail
	}
	for i, s := range stmts {
		if err := d.Driver.Run(bytes.NewReader([]byte(s))); err != nil {
			// Nothing of the file is committed: the server rolls the transaction back on
			// ROLLBACK, or when the connection ends if ROLLBACK cannot be sent.
			_ = d.Driver.Run(strings.NewReader("ROLLBACK"))
			fail.Index, fail.Statement, fail.Err, fail.RolledBack = i+1, s, cause(err), true
			d.failed = fail
			return fail
		}
	}
	if err := d.Driver.Run(strings.NewReader("COMMIT")); err != nil {
		_ = d.Driver.Run(strings.NewReader("ROLLBACK"))
		// The server refusing COMMIT rolled back; a COMMIT lost with its connection may
		// have committed, so the dirty mark stays for a person to check.
		var pgErr *pgconn.PgError
		fail.Statement, fail.Err, fail.RolledBack = "COMMIT", cause(err), errors.As(err, &pgErr)
		d.failed = fail
		return fail
	}
	return nil
}

// cause unwraps the driver's error to the database's own.
func cause(err error) error {
	var de database.Error
	if errors.As(err, &de) && de.OrigErr != nil {
		return de.OrigErr
	}
	return err
}

// StatementError is a migration file that failed: which file, which statement, and
// whether the file was rolled back whole (then the set's version is as before the
// file, and not dirty).
type StatementError struct {
	// Set names the migration set.
	Set string
	// Version is the file's version; Name its name.
	Version uint
	Name    string
	// Down is true for a down file.
	Down bool
	// Index is the failed statement's position in the file, from 1 (0: the
	// transaction could not start); Statement is its text.
	Index     int
	Statement string
	// RolledBack reports that nothing of the file is applied.
	RolledBack bool
	// Err is the database's error.
	Err error
}

func (e *StatementError) Error() string {
	dir := "up"
	if e.Down {
		dir = "down"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "set %s, version %d", e.Set, e.Version)
	if e.Name != "" {
		fmt.Fprintf(&b, " (%s.%s.sql)", e.Name, dir)
	}
	switch {
	case e.Statement == "COMMIT":
		b.WriteString(", at COMMIT")
	case e.Index > 0:
		fmt.Fprintf(&b, ", statement %d: %q", e.Index, abbreviate(e.Statement, 120))
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	if e.RolledBack {
		b.WriteString("; rolled back, nothing of this migration is applied")
	} else {
		b.WriteString("; the migration may have committed: the set is marked dirty")
	}
	return b.String()
}

func (e *StatementError) Unwrap() error { return e.Err }

// abbreviate drops the comments that lead statement s, folds whitespace and cuts s to
// about n bytes.
func abbreviate(s string, n int) string {
	for {
		s = strings.TrimSpace(s)
		switch {
		case strings.HasPrefix(s, "--"):
			s = s[skipLineComment(s, 0):]
			continue
		case strings.HasPrefix(s, "/*"):
			s = s[skipBlockComment(s, 0):]
			continue
		}
		break
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
