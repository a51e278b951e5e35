package store

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5/pgconn"
)

func invalid(field, format string, args ...any) error {
	return &queue.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// PostgreSQL error codes translated by this package.
const (
	CodeUniqueViolation     = "23505"
	CodeSerialization       = "40001"
	CodeDeadlock            = "40P01"
	CodeLockNotAvailable    = "55P03"
	CodeUndefinedTable      = "42P01"
	CodeAdminShutdown       = "57P01"
	CodeCheckViolation      = "23514"
	CodeForeignKeyViolation = "23503"
)

// IsUniqueViolation reports whether err is a unique-constraint violation, and if
// constraint is not empty, of that constraint (or of its copy on a Citus shard, whose
// name has the shard id appended, and which a Citus coordinator names only in the
// message).
func IsUniqueViolation(err error, constraint string) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != CodeUniqueViolation {
		return false
	}
	name := pe.ConstraintName
	if name == "" {
		// A Citus coordinator relays a worker's error without its constraint field;
		// the message still names it.
		if _, rest, ok := strings.Cut(pe.Message, `unique constraint "`); ok {
			name, _, _ = strings.Cut(rest, `"`)
		}
	}
	return constraint == "" || name == constraint || isShardOf(name, constraint)
}

// isShardOf reports whether name is constraint's name on a Citus shard: the constraint's
// name, an underscore and the shard id, as a worker node reports it.
func isShardOf(name, constraint string) bool {
	rest, ok := strings.CutPrefix(name, constraint+"_")
	if !ok || rest == "" {
		return false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// PgCode returns the SQLSTATE of err, or "" when err is not a PostgreSQL error.
func PgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// IsUndefinedTable reports whether err says a table does not exist, which usually means
// the migrations have not been applied.
func IsUndefinedTable(err error) bool { return PgCode(err) == CodeUndefinedTable }

// IsDeadlock reports whether the database aborted the transaction to break a deadlock
// (SQLSTATE 40P01): running it again may succeed.
func IsDeadlock(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "40P01"
}
