package fenceqtest_test

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
)

// The application the tests and examples test: a greeting job whose handler writes a
// row through the job's fenced Commit, and its migrations.

//go:embed testdata/migrations/*.sql
var appFS embed.FS

// appMigrations is the application's migration set, applied after the core's.
func appMigrations() migrations.Set {
	return migrations.Set{Name: "greetings", FS: appFS, Dir: "testdata/migrations", Table: "greetings_schema_migrations"}
}

// GreetArgs are the arguments of a greet job.
type GreetArgs struct {
	Name string `json:"name"`
}

// Kind implements fenceq.JobArgs.
func (GreetArgs) Kind() string { return "greet" }

// greetHandlers registers the greet handler: it writes the greeting and completes the
// job in one fenced transaction.
func greetHandlers() *fenceq.Handlers {
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		text := "hello, " + job.Args.Name
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO greetings (job_id, text) VALUES ($1, $2)`, job.ID, text)
			return err
		})
	}, nil)
	return hs
}
