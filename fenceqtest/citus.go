package fenceqtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/redact"
)

var citus struct {
	once sync.Once
	on   bool
	err  error
}

// OnCitus reports whether the test server (ServerURL) is a Citus coordinator: the
// citus extension exists in its database. The answer is read once per process.
func OnCitus(t testing.TB) bool {
	t.Helper()
	citus.once.Do(func() {
		base, err := ServerURL()
		if err != nil {
			citus.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			citus.err = err
			return
		}
		defer c.Close(ctx)
		citus.err = c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus.on)
		if citus.err != nil {
			citus.err = &citusError{url: redact.URL(base), err: citus.err}
		}
	})
	if citus.err != nil {
		t.Fatalf("fenceqtest: is the server Citus: %v", citus.err)
	}
	return citus.on
}

type citusError struct {
	url string
	err error
}

func (e *citusError) Error() string { return "read extensions at " + e.url + ": " + e.err.Error() }
func (e *citusError) Unwrap() error { return e.err }

// SkipOnCitus skips the test when the test server is a Citus coordinator, logging why:
// for tests of a behaviour or a fault that Citus does not support, or that inspect
// something Citus does differently. Each call names its reason; docs/citus.md lists them.
func SkipOnCitus(t testing.TB, why string) {
	t.Helper()
	if OnCitus(t) {
		t.Skipf("skipped on Citus: %s", why)
	}
}
