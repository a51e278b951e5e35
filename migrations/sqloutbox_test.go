package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
)

const sqlOutboxAdd = `SELECT fenceq_outbox_add($1::text, $2::jsonb, $3::text, $4::bigint, $5::int)`

// A handler outside Go commits its result, its outgoing message and its completion in
// one transaction; the outbox row and its delivery job are those Go's outbox.Insert
// writes, and the Go relay delivers the row.
func TestSQLOutboxAddIsDeliveredByTheRelay(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE results (job_id bigint, lease_gen bigint)`); err != nil {
		t.Fatal(err)
	}
	id, err := sqlJob{Kind: "invoice", Queue: ptr("billing")}.enqueue(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	held := claim(ctx, t, db.Pool, "billing", time.Minute)

	var rowID, again int64
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO results (job_id, lease_gen) VALUES ($1, $2)`, id, held.LeaseGen); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlOutboxAdd, "email", `{"to": "a@example.com"}`, "invoice-email:1", id, nil).Scan(&rowID); err != nil {
			return err
		}
		// The same dedupe key again: nothing new, the existing row's id.
		if err := tx.QueryRow(ctx, sqlOutboxAdd, "email", `{"other": 1}`, "invoice-email:1", id, nil).Scan(&again); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT fenceq_complete($1, $2)`, id, held.LeaseGen)
		return err
	})
	if err != nil {
		t.Fatalf("commit of result, outbox row and completion: %v", err)
	}
	if again != rowID {
		t.Fatalf("second add with the same dedupe key returned %d; want the first row %d", again, rowID)
	}
	sqlRow, err := outbox.Get(ctx, db.Pool, rowID)
	if err != nil {
		t.Fatal(err)
	}
	if sqlRow.Topic != "email" || sqlRow.DedupeKey != "invoice-email:1" || string(sqlRow.Payload) != `{"to": "a@example.com"}` ||
		sqlRow.JobID == nil || *sqlRow.JobID != id || sqlRow.DeliveryJobID == nil || sqlRow.State != outbox.StatePending {
		t.Fatalf("outbox row written from SQL: %+v", sqlRow)
	}

	// Go's outbox.Insert of a like message, for comparison.
	var goRes *outbox.InsertResult
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		goRes, err = outbox.Insert(ctx, tx, outbox.Message{Topic: "email", DedupeKey: "go-email:1",
			Payload: []byte(`{"to": "b@example.com"}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sqlJobRow, goJobRow := row(ctx, t, db.Pool, *sqlRow.DeliveryJobID), row(ctx, t, db.Pool, goRes.DeliveryJobID)
	for name, r := range map[int64]map[string]any{rowID: sqlJobRow, goRes.ID: goJobRow} {
		wantArgs := map[string]any{"outbox_id": float64(name)}
		if fmt.Sprint(r["args"]) != fmt.Sprint(wantArgs) || r["unique_key"] != fmt.Sprintf("outbox:%d", name) {
			t.Fatalf("delivery job of outbox row %d: args %v, unique key %v", name, r["args"], r["unique_key"])
		}
		delete(r, "args")
		delete(r, "unique_key")
	}
	gb, _ := json.Marshal(goJobRow)
	sb, _ := json.Marshal(sqlJobRow)
	if string(gb) != string(sb) {
		t.Fatalf("delivery jobs differ beyond their row's id\n Go: %s\nSQL: %s", gb, sb)
	}

	// The relay of a Go worker delivers the row added from SQL.
	hs := fenceq.NewHandlers()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: db.Pool, Logger: fenceqtest.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	delivered := make(chan *outbox.Delivery, 2)
	if err := relay.Handle("email", outbox.DelivererFunc(func(ctx context.Context, d *outbox.Delivery) error {
		delivered <- d
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := relay.Register(hs); err != nil {
		t.Fatal(err)
	}
	fenceqtest.StartWorker(ctx, t, db.Pool, fenceq.Config{Handlers: hs, Logger: fenceqtest.QuietLogger(),
		Queues: map[string]fenceq.QueueConfig{outbox.Queue: {}}})
	fenceqtest.WaitFor(t, "both outbox rows delivered", time.Minute, func() bool {
		a, errA := outbox.Get(ctx, db.Pool, rowID)
		b, errB := outbox.Get(ctx, db.Pool, goRes.ID)
		return errA == nil && errB == nil && a.State == outbox.StateDelivered && b.State == outbox.StateDelivered
	})
	seen := map[int64]*outbox.Delivery{}
	for len(seen) < 2 {
		d := <-delivered
		seen[d.Row.ID] = d
	}
	if d := seen[rowID]; d == nil || d.Key != outbox.DeliveryKey("invoice-email:1") {
		t.Fatalf("delivery of the SQL row: %+v; want key %q", d, outbox.DeliveryKey("invoice-email:1"))
	}
	if j, err := fenceq.GetJob(ctx, db.Pool, *sqlRow.DeliveryJobID); err != nil || j.State != queue.StateCompleted {
		t.Fatalf("delivery job of the SQL row: %+v, %v; want completed", j, err)
	}
}

// A rolled-back add leaves neither a row nor a delivery job; bad input is refused
// naming the field.
func TestSQLOutboxAddRollbackAndValidation(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := fenceqtest.New(t, nil)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRow(ctx, sqlOutboxAdd, "email", nil, "k1", nil, 3).Scan(&id); err != nil {
		t.Fatal(err)
	}
	var attempts int
	if err := tx.QueryRow(ctx, `SELECT j.max_attempts FROM fenceq_outbox o JOIN fenceq_jobs j ON j.id = o.delivery_job_id
        WHERE o.id = $1`, id).Scan(&attempts); err != nil || attempts != 3 {
		t.Fatalf("delivery job in the transaction: max_attempts %d, %v; want 3", attempts, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int64
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM fenceq_outbox) + (SELECT count(*) FROM fenceq_jobs)`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d outbox rows and jobs after the rollback, %v; want none", rows, err)
	}
	long := make([]byte, 129)
	for i := range long {
		long[i] = 't'
	}
	for _, c := range []struct {
		topic, payload, key any
		attempts            any
		field               string
	}{
		{"", nil, "k", nil, "topic"},
		{string(long), nil, "k", nil, "topic"},
		{"email", nil, "", nil, "dedupe_key"},
		{"email", nil, "a\x01b", nil, "dedupe_key"},
		{"email", `[1]`, "k", nil, "payload"},
		{"email", nil, "k", 1001, "max_attempts"},
		{"email", nil, "k", -1, "max_attempts"},
	} {
		_, err := db.Pool.Exec(ctx, sqlOutboxAdd, c.topic, c.payload, c.key, nil, c.attempts)
		if pe := pgError(err); pe == nil || pe.Code != stateInvalid || pe.ColumnName != c.field {
			t.Errorf("add %v: %v; want SQLSTATE %s naming %s", c, err, stateInvalid, c.field)
		}
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_outbox`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d outbox rows after invalid adds, %v; want none", rows, err)
	}
}
