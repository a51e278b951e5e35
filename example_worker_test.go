package fenceq_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/migrations"
)

// GreetArgs are the arguments of a "greet" job.
type GreetArgs struct {
	Name string `json:"name"`
}

// Kind names the handler of GreetArgs jobs.
func (GreetArgs) Kind() string { return "greet" }

// A worker runs a job whose result row and completion commit in one fenced transaction.
func Example() {
	ctx := context.Background()
	// A schema of its own on the test server; an application would use its own URL.
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE greetings (job_id bigint PRIMARY KEY, text text NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	done := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		defer close(done)
		// Slow work (calls to other services) happens here, outside the transaction.
		text := "hello, " + job.Args.Name
		// Then one short transaction, fenced by the job's lease: the result row and the
		// job's completion commit together, or not at all (ErrLeaseLost).
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO greetings (job_id, text) VALUES ($1, $2)`, job.ID, text)
			return err
		})
	}, nil)

	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	res, err := fenceq.Enqueue(ctx, pool, GreetArgs{Name: "world"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	<-done
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil { // waits for the completion to be written
		log.Fatal(err)
	}

	var text, state string
	if err := pool.QueryRow(ctx, `SELECT g.text, j.state FROM greetings g JOIN fenceq_jobs j ON j.id = g.job_id WHERE j.id = $1`,
		res.Job.ID).Scan(&text, &state); err != nil {
		log.Fatal(err)
	}
	fmt.Println(text, "/", state)
	// Output: hello, world / completed
}

// exampleSchema creates a schema of its own for an example and returns a pool whose
// search_path is that schema, and the function that drops it.
func exampleSchema(ctx context.Context) (*pgxpool.Pool, func()) {
	return newExampleSchema(ctx, false)
}

// newExampleSchema is exampleSchema; with local set, a Citus coordinator keeps the
// schema's tables on itself (see flowExampleSchema).
func newExampleSchema(ctx context.Context, local bool) (*pgxpool.Pool, func()) {
	base, err := fenceqtest.ServerURL()
	if err != nil {
		log.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		log.Fatal(err)
	}
	if local {
		var citus bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
			log.Fatal(err)
		}
		if citus {
			if _, err := admin.Exec(ctx, `SET citus.enable_schema_based_sharding = off`); err != nil {
				log.Fatal(err)
			}
		}
	}
	schema := fmt.Sprintf("fq_example_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, connstr.WithSearchPath(base, schema))
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	}
}

// A handler whose result rows are known before it commits sends its whole fenced
// transaction in one round trip: the row lock, the statements, the completion, COMMIT.
func ExampleJob_CommitWrites() {
	ctx := context.Background()
	pool, cleanup := exampleSchema(ctx)
	defer cleanup()
	if err := migrations.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE greetings (job_id bigint PRIMARY KEY, text text NOT NULL);
		CREATE TABLE webhooks (dedupe_key text PRIMARY KEY, payload jsonb NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	done := make(chan struct{})
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[GreetArgs]) error {
		defer close(done)
		text := "hello, " + job.Args.Name
		w := &fenceq.Writes{}
		w.Exec(`INSERT INTO greetings (job_id, text) VALUES ($1, $2)`, job.ID, text)
		w.Exec(`INSERT INTO webhooks (dedupe_key, payload) VALUES ($1, jsonb_build_object('text', $2::text))`,
			fmt.Sprintf("greeting:%d", job.ID), text)
		return job.CommitWrites(ctx, w)
	}, nil)

	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
	res, err := fenceq.Enqueue(ctx, pool, GreetArgs{Name: "pipeline"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	<-done
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}

	var text, payload, state string
	if err := pool.QueryRow(ctx, `
		SELECT g.text, h.payload::text, j.state FROM greetings g
		JOIN fenceq_jobs j ON j.id = g.job_id
		JOIN webhooks h ON h.dedupe_key = 'greeting:' || j.id
		WHERE j.id = $1`, res.Job.ID).Scan(&text, &payload, &state); err != nil {
		log.Fatal(err)
	}
	fmt.Println(text, "/", payload, "/", state)
	// Output: hello, pipeline / {"text": "hello, pipeline"} / completed
}
