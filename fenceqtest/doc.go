// Package fenceqtest is what an application's tests need to test code built on fenceq
// against a real PostgreSQL: a schema per test, helpers that wait for a job's state or
// start a worker for the test's duration, Work to run one job through its handler
// synchronously under a real lease, and RequireInserted to assert what a transaction
// enqueued.
//
// # The server
//
// The helpers use one server per test binary (ServerURL): TEST_DATABASE_URL when set;
// else the local server at DefaultURL if something answers there; else a throwaway
// cluster started once from the machine's PostgreSQL binaries (initdb and pg_ctl, e.g.
// Debian's postgresql package) in a temporary directory. With none of these, New fails
// the test with ErrNoServer, which says what to set or install. Call Main from TestMain
// to stop and remove the throwaway cluster when the tests end:
//
//	func TestMain(m *testing.M) { fenceqtest.Main(m) }
//
// A test binary that ends without it (no TestMain, or killed) leaves its cluster
// running until the next test binary that starts one, or Main, reaps it: every cluster
// records the pid of its test process, and one whose process is gone is removed.
//
// # Schemas
//
// New creates a schema, migrates it, and returns a pool whose search_path points at it;
// the schema is dropped when the test ends. Tests with schemas of their own run in
// parallel on one database. By default the schema gets the core's migrations alone.
// Options.Migrations replaces that default with its own list of sets, applied in order,
// so an application that needs its own tables as well lists the core first:
//
//	db := fenceqtest.New(t, &fenceqtest.Options{
//		Migrations: []migrations.Set{migrations.Core(), myapp.Migrations()},
//	})
//
// # Working a job
//
// Work enqueues a job and runs it through the handler registered for its kind, the way
// a worker would: claimed with a real lease, its Job.Commit fenced, its outcome written
// by the worker's own fenced writes. It returns the job's row afterwards and the
// handler's error:
//
//	row, err := fenceqtest.Work(ctx, t, db.Pool, fenceq.Config{Handlers: hs}, GreetArgs{Name: "ada"}, nil)
//
// # Asserting what was enqueued
//
// RequireInsertedTx finds the one unfinished job of a kind that the caller's
// transaction sees, committed or not, with its arguments decoded:
//
//	job := fenceqtest.RequireInsertedTx[GreetArgs](ctx, t, tx, nil)
//	if job.Args.Name != "ada" { … }
package fenceqtest
