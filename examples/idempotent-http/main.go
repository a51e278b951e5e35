// Command idempotent-http shows idempotency keys: an HTTP handler runs its work under
// the request's Idempotency-Key with package idempotency, so a client that retries with
// the same key gets the first answer back and the work happens once. The program serves
// on loopback, sends the same request twice and exits 0 when both answers are the
// same and one signup exists.
//
// DATABASE_URL names the database (add ?search_path=SCHEMA for a schema of its own).
package main

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/migrations"
)

//go:embed migrations/*.sql
var files embed.FS

// appTables is the application's own migration set: the signups table. The
// idempotency keys' table is the core's.
var appTables = migrations.Set{Name: "idempotent-http", FS: files, Dir: "migrations", Table: "idempotent_http_schema_migrations"}

// SignupRequest is the body of POST /signups.
type SignupRequest struct {
	Email string `json:"email"`
}

// signups is the key space of the signup endpoint: keys are remembered for a day and a
// retry waits up to 2s for a first request still in flight (the defaults).
var signups = &idempotency.Scope{Name: "signups"}

// signupHandler serves POST /signups under the request's Idempotency-Key.
func signupHandler(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		var req SignupRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || key == "" || req.Email == "" {
			http.Error(w, "want an Idempotency-Key header and a JSON body with an email", http.StatusBadRequest)
			return
		}
		hash, err := idempotency.HashRequest(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// Claims the key, runs the work as its owner and stores the response, in one
		// transaction. A retry with the same key and request gets the stored response.
		res, err := signups.Do(r.Context(), pool, key, hash, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO signups (email) VALUES ($1) RETURNING id`, req.Email).Scan(&id); err != nil {
				return idempotency.Response{}, err
			}
			body, err := json.Marshal(map[string]int64{"id": id})
			return idempotency.Response{ResourceID: strconv.FormatInt(id, 10), Status: http.StatusCreated, Body: body}, err
		})
		switch {
		case errors.Is(err, idempotency.ErrKeyReuse): // same key, different request
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		case errors.Is(err, idempotency.ErrKeyInFlight): // the first request is still running
			http.Error(w, err.Error(), http.StatusConflict)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", strconv.FormatBool(res.Replayed))
		w.WriteHeader(res.Response.Status)
		_, _ = w.Write(res.Response.Body)
	})
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

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	mux := http.NewServeMux()
	mux.Handle("POST /signups", signupHandler(pool))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	// A client sends a request, loses the answer and retries with the same key.
	// A new email per run, so that a rerun in the same schema counts its own signups.
	key := fmt.Sprintf("signup-%d", time.Now().UnixNano())
	email := key + "@example.com"
	body := fmt.Sprintf(`{"email": %q}`, email)
	first := post(ctx, "http://"+ln.Addr().String()+"/signups", key, body)
	retry := post(ctx, "http://"+ln.Addr().String()+"/signups", key, body)

	var n int
	check(pool.QueryRow(ctx, `SELECT count(*) FROM signups WHERE email = $1`, email).Scan(&n))
	if first.status != http.StatusCreated || retry.status != first.status || retry.body != first.body ||
		first.replayed != "false" || retry.replayed != "true" || n != 1 {
		log.Fatalf("first %+v, retry %+v, %d signups: want one signup and the first answer replayed", first, retry, n)
	}
	fmt.Printf("2 requests, 1 signup: both answered %d %s, the retry replayed\n", retry.status, retry.body)
}

// answer is what the client saw of one response.
type answer struct {
	status   int
	body     string
	replayed string
}

func post(ctx context.Context, url, key, body string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
	check(err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	check(err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	check(err)
	return answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed")}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
