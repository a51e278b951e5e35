// Command appcli is an application's own fenceq command: package cli's command tree
// over the application's kind (app.greet) and its migration set (app). Its team gets
// worker, migrate, enqueue, jobs, queues, periodic, verify, health, ui and the rest for
// its own jobs:
//
//	appcli migrate up                                  # fenceq's core tables and the app's
//	appcli enqueue app.greet --args '{"name": "ada"}'
//	appcli worker                                      # runs app.greet until SIGTERM
//
// Every command takes --database-url (env DATABASE_URL).
package main

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/migrations"
)

//go:embed migrations/*.sql
var files embed.FS

// GreetArgs are the arguments of an app.greet job.
type GreetArgs struct {
	Name string `json:"name"`
}

// Kind names the handler of GreetArgs jobs.
func (GreetArgs) Kind() string { return "app.greet" }

// greet writes the greeting row in the job's fenced commit: the row and the job's
// completion commit together, or nothing is written.
func greet(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
	return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO greetings (job_id, name) VALUES ($1, $2)`, job.ID, job.Args.Name)
		return err
	})
}

func main() {
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, greet, nil)
	app := cli.New(cli.Options{
		Name:       "appcli",
		Usage:      "runs and administers the example application's jobs",
		Handlers:   hs,
		Kinds:      []cli.Kind{{Name: "app.greet", ValidateArgs: validateGreet}},
		Migrations: []migrations.Set{{Name: "app", FS: files, Dir: "migrations", Table: "app_schema_migrations"}},
	})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, app, os.Args)
	stop()
	os.Exit(code)
}

// validateGreet checks an app.greet job's args before `appcli enqueue` enqueues it.
func validateGreet(args []byte) error {
	var a GreetArgs
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return err
	}
	if a.Name == "" {
		return errors.New("name is required")
	}
	return nil
}
