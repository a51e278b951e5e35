package fenceqtest

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/connstr"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// unreachableURL is a local address where nothing listens (port 1, tcpmux, is never a
// PostgreSQL server): a connection is refused at once.
const unreachableURL = "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2"

// With no TEST_DATABASE_URL and nothing at the local address, the helpers start a
// throwaway cluster from the machine's binaries; a migrated schema works on it; stopping
// it removes it.
func TestResolveStartsThrowawayCluster(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := resolve(ctx, serverConfig{localURL: unreachableURL, baseDir: sharedTempDir(t), probe: 2 * time.Second})
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	t.Cleanup(func() { _ = srv.stop(context.Background()) })
	if srv.cluster == nil {
		t.Fatalf("resolved %s, want a throwaway cluster", srv.url)
	}
	dir := srv.cluster.Dir
	if !strings.HasPrefix(filepath.Base(dir), clusterPrefix) {
		t.Errorf("cluster directory %s lacks the prefix %s that reaping looks for", dir, clusterPrefix)
	}
	owner, err := os.ReadFile(filepath.Join(dir, pgcluster.OwnerFile))
	if err != nil || strings.TrimSpace(string(owner)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("owner file: %q %v, want this process's pid %d", owner, err, os.Getpid())
	}

	// A schema on it, migrated, takes a job and gives it out under a lease.
	pool, err := pgxpool.New(ctx, srv.url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA fq_cluster_test`); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	pool, err = pgxpool.New(ctx, connstr.WithSearchPath(srv.url, "fq_cluster_test"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.UpAll(ctx, pool, migrations.Core()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	res, err := store.Insert(ctx, pool, store.InsertParams{Kind: "noop"})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := store.Claim(ctx, pool, store.ClaimParams{Queue: queue.DefaultQueue, WorkerID: "w", Limit: 10, Lease: time.Minute})
	if err != nil || len(claimed) != 1 || claimed[0].ID != res.Job.ID || claimed[0].LeaseGen != 1 {
		t.Fatalf("claim on the throwaway cluster: %+v %v, want job %d at generation 1", claimed, err, res.Job.ID)
	}
	if err := store.Complete(ctx, pool, store.LeaseOf(claimed[0])); err != nil {
		t.Fatalf("complete: %v", err)
	}
	var maxConns string
	if err := pool.QueryRow(ctx, `SHOW max_connections`).Scan(&maxConns); err != nil || maxConns != clusterSettings["max_connections"] {
		t.Errorf("max_connections %q %v, want %s", maxConns, err, clusterSettings["max_connections"])
	}
	pool.Close()

	if err := srv.stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still exists after stop (err %v)", dir, err)
	}
}

// Without binaries (and nothing at the local address), the error says in one line what
// to set or install.
func TestResolveWithoutBinaries(t *testing.T) {
	t.Parallel()
	_, err := resolve(context.Background(), serverConfig{localURL: unreachableURL, binDir: t.TempDir(),
		baseDir: t.TempDir(), probe: 2 * time.Second})
	if !errors.Is(err, ErrNoServer) {
		t.Fatalf("err = %v, want ErrNoServer", err)
	}
	want := "fenceqtest: no PostgreSQL: set TEST_DATABASE_URL, start a server on 127.0.0.1:5432, " +
		"or install the PostgreSQL server package (initdb, pg_ctl)"
	if err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}
}

// TEST_DATABASE_URL wins over the local server, and when it does not answer that is the
// error: no other server is tried behind the user's back.
func TestResolveEnvURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	real, err := ServerURL()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := resolve(ctx, serverConfig{envURL: real, localURL: unreachableURL, binDir: t.TempDir(), probe: time.Second})
	if err != nil || srv.url != real || srv.cluster != nil {
		t.Fatalf("resolve with the env URL set: %+v %v, want %s itself", srv, err, real)
	}
	_, err = resolve(ctx, serverConfig{envURL: "postgres://u:secret@127.0.0.1:1/x?connect_timeout=2", localURL: real, probe: time.Second})
	if err == nil {
		t.Fatal("an unreachable TEST_DATABASE_URL resolved")
	}
	if msg := err.Error(); !strings.Contains(msg, "TEST_DATABASE_URL=postgres://u:xxxxx@127.0.0.1:1/x") || strings.Contains(msg, "secret") {
		t.Fatalf("error %q should name TEST_DATABASE_URL with its password redacted", msg)
	}
}

// A local server that answers but refuses (here: no such database) is reported, not
// replaced by a throwaway cluster.
func TestResolveLocalServerThatRefuses(t *testing.T) {
	t.Parallel()
	real, err := ServerURL()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(real)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/fenceqtest_no_such_database"
	refusing := u.String()
	_, err = resolve(context.Background(), serverConfig{localURL: refusing, binDir: t.TempDir(), probe: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "answered") || !strings.Contains(err.Error(), "fenceqtest_no_such_database") {
		t.Fatalf("err = %v, want the server's refusal", err)
	}
}

// sharedTempDir returns a new directory that every user can enter (t.TempDir's cannot),
// for clusters run by an unprivileged user when the tests run as root. It is removed
// when the test ends.
func sharedTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fenceqtest-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

type runFunc func() int

func (f runFunc) Run() int { return f() }

// Run hands the tests the shared server and stops its throwaway cluster when they end.
// Not parallel: it swaps the package's shared server for a cluster of its own while no
// other test runs.
func TestRunStopsTheThrowawayCluster(t *testing.T) {
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := resolve(ctx, serverConfig{localURL: unreachableURL, baseDir: sharedTempDir(t), probe: 2 * time.Second})
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	t.Cleanup(func() { _ = srv.stop(context.Background()) })

	dir := srv.cluster.Dir
	shared.mu.Lock()
	resolved, saved, savedErr := shared.resolved, shared.srv, shared.err
	shared.resolved, shared.srv, shared.err = true, srv, nil
	shared.mu.Unlock()
	defer func() {
		shared.mu.Lock()
		shared.resolved, shared.srv, shared.err = resolved, saved, savedErr
		shared.mu.Unlock()
	}()

	var seen string
	code := Run(runFunc(func() int {
		seen, _ = ServerURL()
		return 3
	}))
	if code != 3 {
		t.Errorf("Run returned %d, want the tests' 3", code)
	}
	if seen != srv.url {
		t.Errorf("the tests saw %q, want the cluster's %q", seen, srv.url)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still exists after Run (err %v)", dir, err)
	}
	shared.mu.Lock()
	still := shared.resolved
	shared.mu.Unlock()
	if still {
		t.Error("after Run the shared server is still marked resolved")
	}
}
