// Package examples holds fenceq's example programs, one command per directory, each
// built on the public packages only:
//
//   - quickstart: one job end to end, its result row written in the fenced commit, and
//     the application's own table added with a migration set;
//   - outbox-webhook: a result row and a webhook's outbox row in one fenced commit, and
//     the relay delivering the webhook once to a local HTTP receiver;
//   - idempotent-http: an HTTP handler under idempotency keys, a client retry answered
//     with the first response;
//   - periodic: a schedule that fires every second, and its first run;
//   - appcli: an application's own command built with cli.New: migrate, enqueue,
//     worker and the rest of the fenceq commands for its kind app.greet.
//
// Each but appcli reads DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test)
// and exits 0 when it did what it shows; appcli is a command line tool, run by its test
// through migrate up, migrate status, enqueue and worker. The tests of this package build every program and run it
// against a real PostgreSQL, each in a schema of its own, and check that the README's
// quickstart is the quickstart program and that the links of the documentation resolve.
package examples
