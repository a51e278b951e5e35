package migrations_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/migrations"
)

// privilegeDenied is PostgreSQL's insufficient_privilege.
const privilegeDenied = "42501"

// createRoles runs docs/sql/roles.sql for the schema of db, with psql's variables
// replaced by the quoted names, and drops the roles when the test ends.
func createRoles(ctx context.Context, t *testing.T, db *fenceqtest.DB, enqueueRole, workerRole string) {
	t.Helper()
	b, err := os.ReadFile("../docs/sql/roles.sql")
	if err != nil {
		t.Fatal(err)
	}
	sql := strings.NewReplacer(
		`:"schema"`, pgx.Identifier{db.Schema}.Sanitize(),
		`:"enqueue_role"`, pgx.Identifier{enqueueRole}.Sanitize(),
		`:"worker_role"`, pgx.Identifier{workerRole}.Sanitize(),
	).Replace(string(b))
	if strings.Contains(sql, `:"`) {
		t.Fatalf("roles.sql uses a variable the test does not set:\n%s", sql)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, r := range []string{enqueueRole, workerRole} {
			id := pgx.Identifier{r}.Sanitize()
			if _, err := db.Pool.Exec(ctx, `DROP OWNED BY `+id); err != nil {
				t.Errorf("drop privileges of role %s: %v", r, err)
			}
			if _, err := db.Pool.Exec(ctx, `DROP ROLE `+id); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		}
	})
	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if _, err := c.Conn().PgConn().Exec(ctx, sql).ReadAll(); err != nil {
		t.Fatalf("run roles.sql: %v", err)
	}
}

// as runs one statement in a transaction of its own as role (SET LOCAL ROLE), commits
// it when it succeeds, and returns its error.
func as(ctx context.Context, t *testing.T, db *fenceqtest.DB, role, sql string, args ...any) error {
	t.Helper()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// The two roles of docs/sql/roles.sql can do what they are for and nothing else.
func TestSQLRoles(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, &fenceqtest.Options{Migrations: []migrations.Set{
		migrations.Core(), invoice.Migrations(), order.Migrations()}})
	enq, wrk := db.Schema+"_enqueue", db.Schema+"_worker"
	createRoles(ctx, t, db, enq, wrk)

	// Another application's schema in the same database.
	other := db.Schema + "_other"
	otherID := pgx.Identifier{other}.Sanitize()
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+otherID+`; CREATE TABLE `+otherID+`.secrets (v text);
        INSERT INTO `+otherID+`.secrets VALUES ('s')`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), `DROP SCHEMA `+otherID+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", other, err)
		}
	})

	mustFail := func(role, what, code, sql string, args ...any) {
		t.Helper()
		err := as(ctx, t, db, role, sql, args...)
		if pe := pgError(err); pe == nil || pe.Code != code {
			t.Errorf("%s as %s: %v; want SQLSTATE %s", what, role, err, code)
		}
	}
	mustWork := func(role, what, sql string, args ...any) {
		t.Helper()
		if err := as(ctx, t, db, role, sql, args...); err != nil {
			t.Fatalf("%s as %s: %v", what, role, err)
		}
	}

	// The enqueue role enqueues, and nothing else.
	mustWork(enq, "enqueue", `SELECT fenceq_enqueue('report', '{"secret": 1}', queue => 'roles')`)
	if n := countJobs(ctx, t, db.Pool); n != 1 {
		t.Fatalf("%d jobs after the enqueue role's enqueue; want 1", n)
	}
	held := claim(ctx, t, db.Pool, "roles", time.Minute)
	mustFail(enq, "read job args", privilegeDenied, `SELECT args FROM fenceq_jobs`)
	mustFail(enq, "insert a job directly", privilegeDenied, `INSERT INTO fenceq_jobs (kind) VALUES ('x')`)
	mustFail(enq, "complete a job", privilegeDenied, `SELECT fenceq_complete($1, $2)`, held.ID, held.LeaseGen)
	mustFail(enq, "heartbeat a job", privilegeDenied, `SELECT fenceq_heartbeat($1, $2)`, held.ID, held.LeaseGen)
	mustFail(enq, "add to the outbox", privilegeDenied, `SELECT fenceq_outbox_add('email', '{}', 'k')`)
	mustFail(enq, "call the unchecked insert", privilegeDenied,
		`SELECT fenceq_enqueue_row('k', '{}', NULL, NULL, NULL, NULL, NULL, NULL, NULL)`)

	// The worker role heartbeats, writes outbox rows and completes under its lease.
	mustWork(wrk, "heartbeat", `SELECT fenceq_heartbeat($1, $2)`, held.ID, held.LeaseGen)
	mustWork(wrk, "add to the outbox and complete",
		`SELECT fenceq_outbox_add('email', '{}', 'roles:1', job_id => $1), fenceq_complete($1, $2)`, held.ID, held.LeaseGen)
	mustFail(wrk, "complete again", stateLeaseLost, `SELECT fenceq_complete($1, $2)`, held.ID, held.LeaseGen)
	mustWork(wrk, "record the stale write", `SELECT fenceq_record_stale($1, $2)`, held.ID, held.LeaseGen)
	var state string
	if err := db.Pool.QueryRow(ctx, `SELECT state FROM fenceq_jobs WHERE id = $1`, held.ID).Scan(&state); err != nil || state != "completed" {
		t.Fatalf("job completed by the worker role: %s, %v", state, err)
	}
	mustFail(wrk, "read jobs", privilegeDenied, `SELECT args FROM fenceq_jobs`)
	mustFail(wrk, "update jobs", privilegeDenied, `UPDATE fenceq_jobs SET state = 'completed'`)
	mustFail(wrk, "read the outbox", privilegeDenied, `SELECT payload FROM fenceq_outbox`)
	for _, table := range []string{migrations.Table, invoice.MigrationsTable, order.MigrationsTable} {
		tid := pgx.Identifier{table}.Sanitize()
		mustFail(wrk, "read "+table, privilegeDenied, `SELECT version FROM `+tid)
		mustFail(wrk, "write "+table, privilegeDenied, `UPDATE `+tid+` SET dirty = true`)
		mustFail(wrk, "empty "+table, privilegeDenied, `DELETE FROM `+tid)
	}
	mustFail(wrk, "read another schema", privilegeDenied, `SELECT v FROM `+otherID+`.secrets`)
	mustFail(wrk, "create in fenceq's schema", privilegeDenied, `CREATE TABLE fenceq_jobs_shadow (id int)`)

	// The functions find fenceq's tables whatever the caller's search_path.
	mustWork(wrk, "enqueue with another search_path",
		`SET LOCAL search_path = pg_catalog; SELECT `+pgx.Identifier{db.Schema}.Sanitize()+`.fenceq_enqueue('elsewhere', queue => 'roles')`)
	var n int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'elsewhere'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("jobs enqueued under another search_path, in fenceq's schema: %d, %v; want 1", n, err)
	}
}
