package fenceqtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/redact"
)

// EnvDatabaseURL names the environment variable that points the helpers at a server.
const EnvDatabaseURL = "TEST_DATABASE_URL"

// DefaultURL is the local server the helpers use when TEST_DATABASE_URL is not set and
// something answers there.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// ErrNoServer means no PostgreSQL server could be found or started. Its text says what
// to set or install.
var ErrNoServer = errors.New("fenceqtest: no PostgreSQL: set " + EnvDatabaseURL +
	", start a server on 127.0.0.1:5432, or install the PostgreSQL server package (initdb, pg_ctl)")

// clusterPrefix starts the directory names of the throwaway clusters this package
// starts, so that a later run can find and reap the ones a dead test process left.
const clusterPrefix = "fenceqtest-pg-"

// clusterSettings are the throwaway cluster's server settings: room for the
// connections of parallel tests, each with pools of its own.
var clusterSettings = map[string]string{"max_connections": "300"}

// serverConfig says where resolve looks for a server. The package resolves with the
// environment and the defaults (envServerConfig); its tests pass others.
type serverConfig struct {
	// envURL is the value of TEST_DATABASE_URL; when set it is used, and only it.
	envURL string
	// localURL is tried next: used when something answers there.
	localURL string
	// binDir holds the PostgreSQL binaries of the throwaway cluster; "" finds them.
	binDir string
	// baseDir is where throwaway clusters are created and orphans reaped.
	baseDir string
	// probe bounds the attempt to connect to localURL.
	probe time.Duration
}

func envServerConfig() serverConfig {
	return serverConfig{envURL: os.Getenv(EnvDatabaseURL), localURL: DefaultURL, baseDir: os.TempDir(),
		probe: 3 * time.Second}
}

// server is a resolved PostgreSQL server.
type server struct {
	// url connects to the server's database without a search_path.
	url string
	// cluster is the throwaway cluster started for it, nil for an existing server.
	cluster *pgcluster.Cluster
}

// stop stops and removes the throwaway cluster, if one was started.
func (s *server) stop(ctx context.Context) error {
	if s == nil || s.cluster == nil {
		return nil
	}
	if err := s.cluster.Stop(ctx); err != nil {
		return fmt.Errorf("fenceqtest: stop the throwaway cluster in %s: %w", s.cluster.Dir, err)
	}
	return nil
}

// resolve finds the server: cfg.envURL when set; else cfg.localURL if a server answers
// there; else a throwaway cluster started from the machine's PostgreSQL binaries (after
// reaping the clusters of test processes that died without stopping theirs).
func resolve(ctx context.Context, cfg serverConfig) (*server, error) {
	if cfg.envURL != "" {
		if err := ping(ctx, cfg.envURL, 30*time.Second); err != nil {
			return nil, fmt.Errorf("fenceqtest: connect to %s=%s: %w", EnvDatabaseURL, redact.URL(cfg.envURL), err)
		}
		return &server{url: cfg.envURL}, nil
	}
	err := ping(ctx, cfg.localURL, cfg.probe)
	if err == nil {
		return &server{url: cfg.localURL}, nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Something answers, and refuses: a server that is there but not set up for the
		// tests. Starting another would hide that.
		return nil, fmt.Errorf("fenceqtest: the server at %s answered: %w (set %s to use another)",
			redact.URL(cfg.localURL), err, EnvDatabaseURL)
	}
	reapOrphans(cfg.baseDir)
	c, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: cfg.binDir, BaseDir: cfg.baseDir,
		DirPrefix: clusterPrefix, OwnerPID: os.Getpid(), Settings: clusterSettings})
	if errors.Is(err, pgcluster.ErrNoBinaries) {
		return nil, ErrNoServer
	}
	if err != nil {
		return nil, fmt.Errorf("fenceqtest: no PostgreSQL answers at %s and a throwaway cluster did not start: %w",
			redact.URL(cfg.localURL), err)
	}
	return &server{url: c.URL, cluster: c}, nil
}

// ping connects to url and closes the connection.
func ping(ctx context.Context, url string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// reapOrphans removes the throwaway clusters of test processes that are gone. Failing
// to is not the tests' problem: it is reported, and tried again by the next run.
func reapOrphans(baseDir string) {
	if _, err := pgcluster.ReapOrphans(baseDir, clusterPrefix); err != nil {
		fmt.Fprintf(os.Stderr, "fenceqtest: reap leftover throwaway clusters: %v\n", err)
	}
}

// shared is the server of this test binary, resolved once, on first use.
var shared struct {
	mu       sync.Mutex
	resolved bool
	srv      *server
	err      error
}

// ServerURL returns the URL of the server the helpers use, resolving it on first use:
// TEST_DATABASE_URL when set; else the local server at DefaultURL if something answers
// there; else a throwaway cluster started once per test binary from the machine's
// PostgreSQL binaries (Main stops it). The URL names the server's database with no
// search_path: New hands out schemas in it. The error, ErrNoServer or one naming the
// server that failed, is the same on every call.
func ServerURL() (string, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.resolved {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		shared.srv, shared.err = resolve(ctx, envServerConfig())
		cancel()
		shared.resolved = true
		if c := shared.srv; c != nil && c.cluster != nil {
			fmt.Fprintf(os.Stderr, "fenceqtest: no PostgreSQL answers at %s; started a throwaway cluster "+
				"(PostgreSQL from %s, port %d, in %s)\n", redact.URL(DefaultURL), c.cluster.BinDir, c.cluster.Port, c.cluster.Dir)
		}
	}
	if shared.err != nil {
		return "", shared.err
	}
	return shared.srv.url, nil
}

// RequireServerURL is ServerURL for a test: it fails the test when there is no server.
// Use it to hand the server to code that makes schemas of its own (a command under
// test, a harness); New is the way to a schema of the test's own.
func RequireServerURL(t testing.TB) string {
	t.Helper()
	u, err := ServerURL()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// stopShared stops the throwaway cluster of this test binary, if one was started; a
// later ServerURL resolves again.
func stopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := shared.srv.stop(ctx)
	shared.resolved, shared.srv, shared.err = false, nil, nil
	return err
}

// TestingM is what TestMain receives: *testing.M, or a wrapper of it.
type TestingM interface {
	Run() int
}

// Main runs the tests of m and exits with their status, having stopped and removed the
// throwaway cluster if one was started. Call it from TestMain:
//
//	func TestMain(m *testing.M) { fenceqtest.Main(m) }
//
// With goleak, wrap m instead: goleak.VerifyTestMain(fenceqtest.WrapM(m)).
func Main(m TestingM) { os.Exit(Run(m)) }

// Run runs the tests of m, stops and removes the throwaway cluster if one was started,
// and returns the tests' exit status, for a TestMain that does more before it exits.
// It also reaps clusters left by test processes that died without stopping theirs.
func Run(m TestingM) int {
	reapOrphans(os.TempDir())
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// WrapM returns m with Run replaced by this package's Run, for harnesses that take a
// TestingM themselves, such as goleak.VerifyTestMain.
func WrapM(m TestingM) TestingM { return wrappedM{m} }

type wrappedM struct{ m TestingM }

func (w wrappedM) Run() int { return Run(w.m) }
