package chaos

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/builtin"
)

// startPgBouncer runs PgBouncer (the distribution's binary) in transaction pooling mode
// in front of the test server, with one database whose server connections select the
// test's schema. It returns the URL workers use; the process is stopped on cleanup.
func startPgBouncer(t *testing.T, db *fenceqtest.DB) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			t.Fatal("pgbouncer is not installed: apt-get install pgbouncer (.ci/run installs it)")
		}
		bin = "/usr/sbin/pgbouncer"
	}
	server, err := url.Parse(fenceqtest.RequireServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	// PgBouncer refuses to run as root; as root it is started as nobody, who must be
	// able to read its files.
	dir, err := os.MkdirTemp("", "fenceq-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	user := server.User.Username()
	ini := fmt.Sprintf(`[databases]
fenceq = host=%s port=%s dbname=%s user=%s connect_query='SET search_path TO %s'

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 200
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
logfile = %s
`, server.Hostname(), portOf(server), server.Path[1:], user, db.Schema, port,
		filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"))
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": strconv.Quote(user) + ` ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "nobody"}, args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer does not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// No statement cache: PgBouncer 1.18 in transaction mode cannot keep named prepared
	// statements; cache_describe uses the unnamed statement and still knows the types.
	return fmt.Sprintf("postgres://%s@%s/fenceq?sslmode=disable&default_query_exec_mode=cache_describe", user, addr)
}

// TestThroughPgBouncer runs the workers through PgBouncer in transaction pooling mode
// under faults. Wake-ups need a session, so the workers run with --no-listen and poll.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts PgBouncer; skipped with -short")
	}
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2, Migrations: builtin.Migrations()})
	bouncer := startPgBouncer(t, db)
	rep := runChaos(t, Config{
		Env: EnvConfig{Workers: 3, Concurrency: 3, DatabaseURL: db.URL, WorkerDatabaseURL: bouncer,
			WorkerArgs: []string{"--no-listen"}},
		Workload: faultWorkload,
		Seed:     5, Duration: 16 * time.Second,
		Faults: []FaultType{FaultPause, FaultKill, FaultReset, FaultCommitDrop},
	})
	for _, f := range []FaultType{FaultPause, FaultKill, FaultReset, FaultCommitDrop} {
		requireFired(t, rep, f)
	}
	requirePass(t, rep)
}
