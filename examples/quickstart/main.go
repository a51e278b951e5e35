// Command quickstart runs one fenceq job end to end: it migrates fenceq's tables and its
// own, starts a worker, enqueues a job, waits until the job has finished and prints it.
// DATABASE_URL names the database (add ?search_path=SCHEMA for a schema of its own).
package main

import (
	"context"
	"embed"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
)

//go:embed migrations/*.sql
var files embed.FS

// appTables is the application's own migration set, versioned apart from fenceq's.
var appTables = migrations.Set{Name: "quickstart", FS: files, Dir: "migrations", Table: "quickstart_schema_migrations"}

// GreetArgs are the arguments of a "greet" job.
type GreetArgs struct {
	Name string `json:"name"`
}

// Kind names the handler of GreetArgs jobs.
func (GreetArgs) Kind() string { return "greet" }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	check(err)
	defer pool.Close()
	check(migrations.UpAll(ctx, pool, migrations.Core(), appTables)) // fenceq's tables, then ours

	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		text := "hello, " + job.Args.Name // slow calls belong here, outside any transaction
		// One transaction fenced by the job's lease: the result row and the job's
		// completion commit together, or nothing is written (queue.ErrLeaseLost).
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO greetings (job_id, text) VALUES ($1, $2)`, job.ID, text)
			return err
		})
	}, nil)
	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs})
	check(err)
	check(w.Start(ctx))

	res, err := fenceq.Enqueue(ctx, pool, GreetArgs{Name: "world"}, nil)
	check(err)
	job := res.Job
	for !job.State.Final() { // poll the job's row until it has an outcome
		time.Sleep(50 * time.Millisecond)
		job, err = fenceq.GetJob(ctx, pool, job.ID)
		check(err)
	}
	var text string
	check(pool.QueryRow(ctx, `SELECT text FROM greetings WHERE job_id = $1`, job.ID).Scan(&text))
	fmt.Printf("job %d %s: %s\n", job.ID, job.State, text)
	check(w.Stop(ctx)) // graceful: running jobs finish, then the worker deregisters
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
