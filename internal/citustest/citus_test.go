package citustest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/chaos"
	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/demo"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/syncbuf"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/migrations"
)

// EnvNotBuilt is set by test.sh, to the reason, when it could not build Citus (no
// source at hand): the test then skips, naming it, instead of failing for the missing
// extension. In CI (FENCEQ_CI set) a missing extension fails the test regardless.
const EnvNotBuilt = "FENCEQ_CITUS_NOT_BUILT"

// corePackages are run again against the coordinator: the suite of the library and of
// the built-in jobs.
var corePackages = []string{".", "./queue/", "./outbox/", "./idempotency/", "./migrations/", "./jobs/..."}

// clusterPrefix names the Citus clusters' directories, so that a later run reaps those
// a dead test process left.
const clusterPrefix = "fenceq-citustest-"

func startCitus(t *testing.T) *pgcluster.Citus {
	t.Helper()
	if err := pgcluster.CitusAvailable(""); err != nil {
		if os.Getenv("FENCEQ_CI") != "" {
			t.Fatalf("%v: CI builds it with .ci/ensure-citus", err)
		}
		if why := os.Getenv(EnvNotBuilt); why != "" {
			t.Skipf("not run: test.sh did not build Citus: %s (%v)", why, err)
		}
		t.Fatalf("%v; its source is read from FENCEQ_VENDOR_DIR, else ../shared/vendor "+
			"(./test.sh builds it, or reports this test as not run when the source is missing)", err)
	}
	_, _ = pgcluster.ReapOrphans(os.TempDir(), clusterPrefix)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgcluster.StartCitus(ctx, pgcluster.CitusOptions{Options: pgcluster.Options{
		DirPrefix: clusterPrefix, OwnerPID: os.Getpid(),
		// The suite's parallel tests open many pools on the coordinator, and each of
		// its sessions opens its own connections to the worker node it writes on.
		Settings: map[string]string{"max_connections": "500", "citus.max_shared_pool_size": "400",
			"citus.recover_2pc_interval": "-1"},
	}})
	if err != nil {
		t.Fatalf("start the Citus cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stop the Citus cluster: %v", err)
		}
	})
	return c
}

// schemaOn creates a schema on the coordinator, migrates it with every built-in set,
// and returns the port of the node its tables landed on.
func schemaOn(t *testing.T, ctx context.Context, c *pgcluster.Citus, schema string) int {
	t.Helper()
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	pool, err := pgxpool.New(ctx, connstr.WithSearchPath(c.URL(), schema))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.UpAll(ctx, pool, builtin.Migrations()...); err != nil {
		t.Fatalf("migrate schema %s on Citus: %v", schema, err)
	}
	port, ok, err := pgcluster.SchemaNode(ctx, c.URL(), schema)
	if err != nil || !ok {
		t.Fatalf("node of schema %s: %d %v %v", schema, port, ok, err)
	}
	return port
}

// preparedCount counts the coordinator's records of two-phase commits.
func preparedCount(t *testing.T, ctx context.Context, c *pgcluster.Citus) int64 {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_dist_transaction`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// moveSchema moves a distributed schema to the node on port.
func moveSchema(t *testing.T, ctx context.Context, c *pgcluster.Citus, schema string, port int) {
	t.Helper()
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `SELECT citus_schema_move($1::regnamespace, $2, $3, shard_transfer_mode => 'block_writes')`,
		schema, c.Coordinator.Host, port); err != nil {
		t.Fatalf("move schema %s to port %d: %v", schema, port, err)
	}
}

func TestCitus(t *testing.T) {
	c := startCitus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	t.Logf("Citus coordinator on port %d, workers on %d and %d", c.Coordinator.Port, c.Workers[0].Port, c.Workers[1].Port)

	// Two schemas, two nodes: each distributed schema lives whole on one worker node,
	// and the two are on different ones (moved there if Citus placed them together).
	schemas := []string{"fq_citus_a", "fq_citus_b"}
	nodeA := schemaOn(t, ctx, c, schemas[0])
	nodeB := schemaOn(t, ctx, c, schemas[1])
	if nodeA == nodeB {
		other := c.Workers[0].Port
		if other == nodeA {
			other = c.Workers[1].Port
		}
		moveSchema(t, ctx, c, schemas[1], other)
		if nodeB, _, _ = pgcluster.SchemaNode(ctx, c.URL(), schemas[1]); nodeB != other {
			t.Fatalf("schema %s is on port %d after the move to %d", schemas[1], nodeB, other)
		}
	}
	if nodeA == nodeB || nodeA == c.Coordinator.Port || nodeB == c.Coordinator.Port {
		t.Fatalf("schemas on ports %d and %d; want two different worker nodes", nodeA, nodeB)
	}
	t.Logf("schema %s on the node at port %d, %s on port %d", schemas[0], nodeA, schemas[1], nodeB)

	// Every statement of a job's life and of the worker's maintenance commits in one
	// phase. Recovery of two-phase commits is off until then (citus.recover_2pc_interval
	// = -1), so any record would stay to be counted.
	t.Run("OnePhaseCommit", func(t *testing.T) { testOnePhase(t, ctx, c) })

	// From here on, two-phase commits are recovered as on any Citus cluster: a fault
	// that cuts a coordinator session between PREPARE and COMMIT PREPARED leaves a
	// prepared transaction on the worker node, holding its row locks, until recovery
	// commits or aborts it.
	setRecoveryInterval(t, ctx, c, recoverInterval)

	t.Run("Demo", func(t *testing.T) {
		for _, s := range schemas {
			var out syncbuf.Buffer
			cfg := demo.Config{Scale: demo.DefaultScale(), DatabaseURL: c.URL(), Schema: s, Timeout: 4 * time.Minute, Stderr: &out}
			rep, err := demo.Run(ctx, cfg)
			if err != nil {
				t.Fatalf("demo in schema %s: %v\n%s", s, err, out.String())
			}
			if msg := rep.Failure(); msg != "" {
				var text bytes.Buffer
				_ = rep.WriteText(&text)
				t.Fatalf("demo in schema %s: %s\n%s", s, msg, text.String())
			}
			t.Logf("demo in schema %s: %d invoices, %d orders, %d stale writes rejected, verify passed",
				s, rep.Invoices, rep.Orders, rep.StaleWritesRejected)
		}
	})

	t.Run("Chaos", func(t *testing.T) {
		dir := t.TempDir()
		bctx, bcancel := context.WithTimeout(ctx, 5*time.Minute)
		bin, err := chaos.BuildBinary(bctx, dir)
		bcancel()
		if err != nil {
			t.Fatal(err)
		}
		rep, err := chaos.Run(ctx, chaos.Config{
			Env:      chaos.EnvConfig{Binary: bin, DatabaseURL: c.URL(), Workers: 3, LogDir: dir},
			Workload: chaos.WorkloadConfig{Customers: 20, OrderKeys: 8, SleepJobs: 3},
			Seed:     1, Duration: 20 * time.Second,
			Faults: []chaos.FaultType{chaos.FaultTerminate, chaos.FaultKill},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatalf("chaos run on Citus: %v", err)
		}
		var text bytes.Buffer
		_ = rep.WriteText(&text)
		if !rep.Pass {
			t.Fatalf("chaos run on Citus failed: %v\n%s", rep.Failures, text.String())
		}
		// The verdict counts a scheduled fault that never fired as a failure; show the
		// proof that both kinds fired.
		fired := map[chaos.FaultType]int{}
		for _, f := range rep.Faults {
			fired[f.Type] = f.Fired
		}
		if fired[chaos.FaultTerminate] == 0 || fired[chaos.FaultKill] == 0 {
			t.Fatalf("faults fired: %v; want terminate and kill\n%s", fired, text.String())
		}
		if rep.Duplicates != 0 || rep.Lost != 0 {
			t.Fatalf("%d duplicates, %d lost\n%s", rep.Duplicates, rep.Lost, text.String())
		}
		// No transaction is left half-committed: every prepared one was committed or
		// aborted by recovery.
		waitNoPrepared(t, ctx, c, time.Minute)
		t.Logf("chaos on Citus: terminate fired %d, kill fired %d, %d revocations, 0 duplicates, 0 lost, no prepared transaction left",
			fired[chaos.FaultTerminate], fired[chaos.FaultKill], rep.Revocations)
	})

	t.Run("CoreSuite", func(t *testing.T) {
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		// One package at a time: every coordinator session opens connections of its own
		// to the worker node it writes on, and packages run side by side multiply them
		// on a two-core machine that also runs the rest of CI.
		args := []string{"test", "-count=1", "-p", "1", "-timeout", "30m"}
		if raceEnabled {
			args = append(args, "-race")
		}
		if testing.Short() {
			args = append(args, "-short")
		}
		args = append(args, corePackages...)
		cmd := exec.CommandContext(ctx, goBinary(), args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "TEST_DATABASE_URL="+c.URL())
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t.Logf("running go %s against the coordinator", strings.Join(args, " "))
		err = cmd.Run()
		summary := packageLines(out.String())
		if err != nil {
			t.Fatalf("the core suite failed on Citus: %v\n%s", err, tail(out.String(), 200))
		}
		t.Logf("the core suite passed on Citus:\n%s", summary)
	})
}

// goBinary is the go command of the toolchain running this test.
func goBinary() string {
	if p := filepath.Join(os.Getenv("GOROOT"), "bin", "go"); os.Getenv("GOROOT") != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "go"
}

// packageLines keeps go test's per-package result lines.
func packageLines(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "FAIL") || strings.HasPrefix(l, "?") {
			fmt.Fprintln(&b, l)
		}
	}
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// recoverInterval is how often the coordinator recovers two-phase commits once the
// one-phase check is done: shorter than Citus's default minute, so that a transaction a
// fault left prepared does not hold its locks past the chaos run's drain.
const recoverInterval = "2s"

// setRecoveryInterval sets citus.recover_2pc_interval on every node and reloads it.
func setRecoveryInterval(t *testing.T, ctx context.Context, c *pgcluster.Citus, interval string) {
	t.Helper()
	for _, n := range c.Nodes() {
		conn, err := pgx.Connect(ctx, n.URL)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "ALTER SYSTEM SET citus.recover_2pc_interval = '"+interval+"'")
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
		}
		conn.Close(ctx)
		if err != nil {
			t.Fatalf("set citus.recover_2pc_interval on %s: %v", n.URL, err)
		}
	}
}

// waitNoPrepared waits until no node holds a prepared transaction, and fails the test
// with the ones left when within is over.
func waitNoPrepared(t *testing.T, ctx context.Context, c *pgcluster.Citus, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left, n := preparedOnNodes(ctx, c)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prepared transactions left after %v: %s", within, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// preparedOnNodes describes each node's prepared transactions and counts them all; a
// node it cannot read counts as holding one.
func preparedOnNodes(ctx context.Context, c *pgcluster.Citus) (string, int) {
	var parts []string
	total := 0
	for _, n := range c.Nodes() {
		conn, err := pgx.Connect(ctx, n.URL)
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", n.URL, err))
			total++
			continue
		}
		var gids []string
		rows, err := conn.Query(ctx, `SELECT gid FROM pg_prepared_xacts`)
		if err == nil {
			gids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		conn.Close(ctx)
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", n.URL, err))
			total++
			continue
		}
		total += len(gids)
		parts = append(parts, fmt.Sprintf("port %d: %d %v", n.Port, len(gids), gids))
	}
	return strings.Join(parts, "; "), total
}
