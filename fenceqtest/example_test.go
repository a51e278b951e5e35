package fenceqtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/migrations"
)

// exampleT stands in for the *testing.T a test would pass: an example has none. It
// panics on failure and runs its cleanups (dropping the schema) at finish.
type exampleT struct {
	testing.TB // unset: only the methods below are called
	cleanups   []func()
}

func (e *exampleT) Helper()                           {}
func (e *exampleT) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleT) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleT) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }

func (e *exampleT) finish() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// Work runs one job through its handler, as a worker would, and returns the job's row
// afterwards with the handler's error.
func ExampleWork() {
	ctx := context.Background()
	t := &exampleT{} // in a test: its *testing.T
	defer t.finish()

	// A schema of the test's own, with the core's migrations and the application's.
	db := fenceqtest.New(t, &fenceqtest.Options{Migrations: []migrations.Set{migrations.Core(), appMigrations()}})

	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		// The greeting and the job's completion commit together, fenced by the lease.
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO greetings (job_id, text) VALUES ($1, $2)`, job.ID, "hello, "+job.Args.Name)
			return err
		})
	}, nil)

	row, err := fenceqtest.Work(ctx, t, db.Pool, fenceq.Config{Handlers: hs, Logger: fenceqtest.QuietLogger()},
		GreetArgs{Name: "ada"}, nil)
	if err != nil {
		t.Fatalf("greet: %v", err)
	}
	var text string
	if err := db.Pool.QueryRow(ctx, `SELECT text FROM greetings WHERE job_id = $1`, row.ID).Scan(&text); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s after attempt %d under lease generation %d: %s\n", row.State, row.Attempt, row.LeaseGen, text)
	// Output: completed after attempt 1 under lease generation 1: hello, ada
}

// signUp is application code under test: it creates an account and, in the same
// transaction, enqueues the welcome greeting.
func signUp(ctx context.Context, tx pgx.Tx, name string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (name) VALUES ($1)`, name); err != nil {
		return err
	}
	_, err := fenceq.Enqueue(ctx, tx, GreetArgs{Name: name}, &fenceq.InsertOpts{Queue: "mail", UniqueKey: "welcome:" + name})
	return err
}

// RequireInsertedTx asserts what a transaction enqueued, before it commits.
func ExampleRequireInsertedTx() {
	ctx := context.Background()
	t := &exampleT{} // in a test: its *testing.T
	defer t.finish()

	db := fenceqtest.New(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE accounts (name text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := signUp(ctx, tx, "ada"); err != nil {
		t.Fatal(err)
	}

	job := fenceqtest.RequireInsertedTx[GreetArgs](ctx, t, tx, &fenceqtest.RequireInsertedOpts{Queue: "mail"})
	fmt.Printf("%s job for %s in queue %s, unique key %s\n", job.Kind, job.Args.Name, job.Queue, *job.UniqueKey)

	// Uncommitted, the job is invisible outside the transaction.
	fenceqtest.RequireNotInserted[GreetArgs](ctx, t, db.Pool, nil)
	// Output: greet job for ada in queue mail, unique key welcome:ada
}
