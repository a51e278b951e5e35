package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// A workflow, a wait and a signal from SQL alone, as a service in another language makes
// them: the workflow's tasks become available in order, the wait holds no lease, the
// signal wakes it once, and bad input raises the documented SQLSTATEs.
func TestSQLWorkflowWaitAndSignal(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "workflows and signals are refused on a Citus distributed schema")
	db := fenceqtest.New(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := db.Pool
	rows, err := pool.Query(ctx, `SELECT workflow_id, task, job_id FROM fenceq_enqueue_workflow('etl', $1::jsonb)`,
		`[{"name": "extract", "kind": "x"}, {"name": "load", "kind": "y", "after": ["extract"], "queue": "q2"}]`)
	if err != nil {
		t.Fatal(err)
	}
	jobs := map[string]int64{}
	var wf int64
	for rows.Next() {
		var task string
		var id int64
		if err := rows.Scan(&wf, &task, &id); err != nil {
			t.Fatal(err)
		}
		jobs[task] = id
	}
	if err := rows.Err(); err != nil || len(jobs) != 2 {
		t.Fatalf("enqueue_workflow: %v %v", jobs, err)
	}
	state := func(id int64) queue.State {
		t.Helper()
		j, err := store.GetJob(ctx, pool, id)
		if err != nil {
			t.Fatal(err)
		}
		return j.State
	}
	if state(jobs["load"]) != queue.StatePending {
		t.Fatalf("load = %s, want pending", state(jobs["load"]))
	}
	claim := func(q string) queue.Lease {
		t.Helper()
		rs, err := store.Claim(ctx, pool, store.ClaimParams{Queue: q, WorkerID: "sql", Limit: 1, Lease: time.Minute})
		if err != nil || len(rs) != 1 {
			t.Fatalf("claim from %s: %v %v", q, rs, err)
		}
		return store.LeaseOf(rs[0])
	}
	ex := claim(queue.DefaultQueue)
	if _, err := pool.Exec(ctx, `SELECT fenceq_complete($1, $2)`, ex.JobID, ex.Gen); err != nil {
		t.Fatal(err)
	}
	if state(jobs["load"]) != queue.StateAvailable {
		t.Fatalf("load after extract completed = %s, want available", state(jobs["load"]))
	}
	ld := claim("q2")
	var st string
	if err := pool.QueryRow(ctx, `SELECT fenceq_wait($1, $2, 'go')`, ld.JobID, ld.Gen).Scan(&st); err != nil || st != "pending" {
		t.Fatalf("fenceq_wait: %s %v", st, err)
	}
	_, err = pool.Exec(ctx, `SELECT fenceq_wait($1, $2, 'go')`, ld.JobID, ld.Gen)
	wantCode(t, err, stateLeaseLost)
	for _, want := range []string{"delivered", "duplicate"} {
		if err := pool.QueryRow(ctx, `SELECT fenceq_send_signal($1, 'go', '{"n": 1}')`, ld.JobID).Scan(&st); err != nil || st != want {
			t.Fatalf("fenceq_send_signal: %s %v, want %s", st, err, want)
		}
	}
	if state(jobs["load"]) != queue.StateAvailable {
		t.Fatalf("load after the signal = %s, want available", state(jobs["load"]))
	}
	_, err = pool.Exec(ctx, `SELECT fenceq_send_signal(999999, 'go')`)
	wantCode(t, err, "QF004")
	_, err = pool.Exec(ctx, `SELECT fenceq_send_signal($1, 'a b')`, ld.JobID)
	wantCode(t, err, stateInvalid)
	_, err = pool.Exec(ctx, `SELECT fenceq_enqueue_workflow('w', '[{"name": "a", "kind": "x", "after": ["b"]}]')`)
	wantCode(t, err, stateInvalid)
	_, err = pool.Exec(ctx, `SELECT fenceq_enqueue_workflow('w', '[{"name": "a", "kind": "x"}, {"name": "a", "kind": "x"}]')`)
	wantCode(t, err, stateInvalid)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_workflows`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("workflows after refused calls: %d %v, want 1", n, err)
	}
}

// Going down below 16 is refused while a job waits for a dependency, and works once
// none does.
func TestFlowDownRefusedWhileWaiting(t *testing.T) {
	t.Parallel()
	fenceqtest.SkipOnCitus(t, "workflows are refused on a Citus distributed schema")
	db := fenceqtest.New(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var id int64
	if err := db.Pool.QueryRow(ctx, `SELECT job_id FROM fenceq_enqueue_workflow('w', $1::jsonb) WHERE task = 'b'`,
		`[{"name": "a", "kind": "x"}, {"name": "b", "kind": "x", "after": ["a"]}]`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Core().Migrate(ctx, db.Pool, 15); err == nil {
		t.Fatal("down to 15 with a pending task: no error")
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs SET state = 'cancelled', finished_at = now() WHERE state <> 'cancelled'`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Core().Migrate(ctx, db.Pool, 15); err != nil {
		t.Fatalf("down to 15 with nothing waiting: %v", err)
	}
	if err := migrations.Core().Migrate(ctx, db.Pool, 16); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Fatalf("error %v, want SQLSTATE %s", err, code)
	}
}
