package chaos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/health"
	"github.com/fenceq/fenceq/internal/chaos"
	"github.com/fenceq/fenceq/jobs/diag"
)

// TestLongTransaction holds an idle transaction open — its snapshot holds back the
// vacuum horizon — while jobs flow through a worker process, then checks that the
// oldest-transaction gauge of fenceqprom and `fenceq health` both report it.
func TestLongTransaction(t *testing.T) {
	t.Parallel()
	env := chaos.NewTestEnv(t, chaos.EnvConfig{Workers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := env.StartWorkers(ctx); err != nil {
		t.Fatal(err)
	}

	// The long transaction: a repeatable-read snapshot, then idle.
	conn, err := pgx.Connect(ctx, env.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}

	// Jobs flow meanwhile.
	const jobs = 20
	items := make([]fenceq.EnqueueItem, jobs)
	for i := range items {
		items[i] = fenceq.EnqueueItem{Args: diag.NoopArgs{}}
	}
	if _, err := fenceq.EnqueueMany(ctx, env.Pool, items); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the noop jobs to complete", func() bool {
		var n int
		_ = env.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_jobs WHERE kind = 'noop' AND state = 'completed'`).Scan(&n)
		return n == jobs
	})

	// The idle transaction holds a snapshot (backend_xmin): VACUUM cannot remove rows
	// that died after it, such as the completed jobs' old versions.
	var state string
	var xminHeld bool
	var age float64
	waitUntil(t, "the transaction to be 2s old", func() bool {
		err := env.Pool.QueryRow(ctx, `SELECT state, backend_xmin IS NOT NULL,
			extract(epoch FROM clock_timestamp() - xact_start)::float8
			FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state, &xminHeld, &age)
		return err == nil && age >= 2
	})
	if state != "idle in transaction" || !xminHeld {
		t.Fatalf("long transaction: state %q, backend_xmin held %v; want idle in transaction holding xmin", state, xminHeld)
	}

	// The gauge, as Prometheus scrapes it.
	reg := prometheus.NewRegistry()
	if err := reg.Register(fenceqprom.NewDBCollector(env.Pool, 5*time.Second, nil)); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	gauges := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && !strings.HasPrefix(name, "#") {
			gauges[name], _ = strconv.ParseFloat(value, 64)
		}
	}
	resp.Body.Close()
	if g := gauges["fenceq_db_oldest_transaction_age_seconds"]; g < 2 {
		t.Fatalf("fenceq_db_oldest_transaction_age_seconds = %v; want at least 2 (the idle transaction)", g)
	}
	if g := gauges["fenceq_db_idle_in_transaction_sessions"]; g < 1 {
		t.Fatalf("fenceq_db_idle_in_transaction_sessions = %v; want at least 1", g)
	}

	// `fenceq health` raises the alert.
	var stdout, stderr bytes.Buffer
	code := cli.Run(ctx, cli.New(cli.Options{Stdout: &stdout, Stderr: &stderr}), []string{"fenceq", "health", "--database-url", env.URL, "--max-xact-age", "1s", "--json"})
	if code != cli.ExitError {
		t.Fatalf("fenceq health exited %d; want %d (alert)\n%s%s", code, cli.ExitError, stdout.String(), stderr.String())
	}
	var rep struct {
		Conditions []health.Condition `json:"conditions"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("health --json: %v\n%s", err, stdout.String())
	}
	found := false
	for _, c := range rep.Conditions {
		if c.Name == "oldest open transaction" {
			found = true
			if !c.Alert {
				t.Fatalf("health: oldest open transaction %s is not an alert", c.Value)
			}
		}
	}
	if !found {
		t.Fatalf("health reports no oldest-transaction condition: %s", stdout.String())
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	fenceqtest.WaitFor(t, what, 30*time.Second, cond)
}
