// Command outbox-webhook shows the transactional outbox: a job's handler writes its
// result row and an outbox row for a webhook in one fenced commit, and the outbox relay
// delivers the webhook to an HTTP receiver. The program starts its own receiver on
// loopback and exits 0 when the webhook arrived exactly once.
//
// DATABASE_URL names the database (add ?search_path=SCHEMA for a schema of its own).
package main

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

//go:embed migrations/*.sql
var files embed.FS

// appTables is the application's own migration set: the receipts table.
var appTables = migrations.Set{Name: "outbox-webhook", FS: files, Dir: "migrations", Table: "outbox_webhook_schema_migrations"}

// ReceiptArgs are the arguments of a "receipt" job.
type ReceiptArgs struct {
	OrderID    int64 `json:"order_id"`
	TotalCents int64 `json:"total_cents"`
}

// Kind names the handler of ReceiptArgs jobs.
func (ReceiptArgs) Kind() string { return "receipt" }

// webhookTopic routes the outbox rows of this program to its webhook deliverer.
const webhookTopic = "webhook"

// receiver is the webhook's receiving end. It counts the deliveries of each
// Idempotency-Key, as a receiver that drops second copies would.
type receiver struct {
	mu      sync.Mutex
	byKey   map[string]int
	payload []byte
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body bytes.Buffer
	if _, err := body.ReadFrom(r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.byKey[r.Header.Get("Idempotency-Key")]++
	rc.payload = body.Bytes()
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

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
	check(migrations.UpAll(ctx, pool, migrations.Core(), appTables))

	// The webhook's receiver, on a free loopback port.
	rc := &receiver{byKey: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	hookURL := "http://" + ln.Addr().String() + "/hooks/receipt"

	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, job *fenceq.Job[ReceiptArgs]) error {
		payload, err := json.Marshal(job.Args)
		if err != nil {
			return err
		}
		// The receipt row, the webhook's outbox row (with its delivery job) and the job's
		// completion commit together under the lease, or none of them does.
		return job.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO receipts (job_id, order_id, total_cents) VALUES ($1, $2, $3)`,
				job.ID, job.Args.OrderID, job.Args.TotalCents); err != nil {
				return err
			}
			_, err := outbox.Insert(ctx, tx, outbox.Message{Topic: webhookTopic,
				DedupeKey: fmt.Sprintf("receipt:%d", job.Args.OrderID), Payload: payload, JobID: job.ID})
			return err
		})
	}, nil)

	// The relay runs as the handler of outbox.deliver jobs, one Deliverer per topic.
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool})
	check(err)
	check(relay.Handle(webhookTopic, outbox.DelivererFunc(func(ctx context.Context, d *outbox.Delivery) error {
		return postWebhook(ctx, hookURL, d)
	})))
	check(relay.Register(hs))

	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs,
		Queues: map[string]fenceq.QueueConfig{"default": {MaxWorkers: 4}, outbox.Queue: {MaxWorkers: 2}}})
	check(err)
	check(w.Start(ctx))

	res, err := fenceq.Enqueue(ctx, pool, ReceiptArgs{OrderID: 42, TotalCents: 1999}, nil)
	check(err)
	job := waitFinal(ctx, pool, res.Job.ID)
	if job.State != queue.StateCompleted {
		log.Fatalf("receipt job %d ended %s", job.ID, job.State)
	}
	// Its delivery is a job too: wait until the relay has marked the row delivered.
	row := waitDelivered(ctx, pool, webhookTopic)
	check(w.Stop(ctx))

	rc.mu.Lock()
	defer rc.mu.Unlock()
	key := outbox.DeliveryKey(row.DedupeKey)
	if n := rc.byKey[key]; len(rc.byKey) != 1 || n != 1 {
		log.Fatalf("webhook deliveries by key %v, want exactly one for %s", rc.byKey, key)
	}
	fmt.Printf("webhook delivered exactly once: outbox row %s, payload %s\n", row.DedupeKey, rc.payload)
}

// postWebhook sends one delivery. Its Idempotency-Key is the same on every attempt, so
// a receiver that deduplicates sees one webhook even when a retry follows a lost reply.
func postWebhook(ctx context.Context, url string, d *outbox.Delivery) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(d.Row.Payload))
	if err != nil {
		return outbox.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", d.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("post webhook: %w", err) // retried with backoff
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500:
		return fmt.Errorf("post webhook: receiver answered %s", resp.Status)
	case resp.StatusCode >= 400:
		return outbox.Permanent(fmt.Errorf("post webhook: receiver answered %s", resp.Status))
	}
	return nil
}

// waitFinal polls a job's row until it has an outcome.
func waitFinal(ctx context.Context, pool *pgxpool.Pool, id int64) *queue.JobRow {
	for {
		job, err := fenceq.GetJob(ctx, pool, id)
		check(err)
		if job.State.Final() {
			return job
		}
		pause(ctx)
	}
}

// waitDelivered polls the outbox until the topic's one row has left pending.
func waitDelivered(ctx context.Context, pool *pgxpool.Pool, topic string) *outbox.Row {
	for {
		rows, err := outbox.List(ctx, pool, outbox.ListParams{Topic: topic})
		check(err)
		if len(rows) == 1 && rows[0].State != outbox.StatePending {
			if rows[0].State != outbox.StateDelivered {
				log.Fatalf("outbox row %d ended %s", rows[0].ID, rows[0].State)
			}
			return rows[0]
		}
		pause(ctx)
	}
}

func pause(ctx context.Context) {
	select {
	case <-ctx.Done():
		log.Fatal(ctx.Err())
	case <-time.After(50 * time.Millisecond):
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
