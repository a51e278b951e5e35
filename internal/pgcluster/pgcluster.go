// Package pgcluster starts a throwaway PostgreSQL cluster from the machine's own
// PostgreSQL binaries (initdb, pg_ctl) in a temporary directory, for the demo and the
// fault-injection harness, and removes it afterwards.
//
// PostgreSQL refuses to run as root, so when the calling process is root the cluster
// is created and run as an unprivileged user (nobody by default). The server listens
// on 127.0.0.1 only, on a free port, with trust authentication and fsync off: it is
// for data nobody needs to keep.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoBinaries means no initdb/pg_ctl pair was found on this machine.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries (initdb, pg_ctl) found")

// Options tunes Start. Zero values are fine.
type Options struct {
	// BinDir holds initdb and pg_ctl. Defaults to FindBinDir().
	BinDir string
	// BaseDir is where the temporary directory is created. Defaults to os.TempDir(),
	// or /tmp when the unprivileged user could not reach os.TempDir().
	BaseDir string
	// User runs the server when the process is root. Defaults to "nobody".
	User string
	// Settings are extra server settings (name → value), e.g. {"max_connections": "200"}.
	Settings map[string]string
	// StartTimeout bounds initdb and each start. Defaults to 60s.
	StartTimeout time.Duration
	// ListenAddress is the one address the server listens on. Defaults to 127.0.0.1.
	ListenAddress string
	// TrustNetworks are CIDR ranges whose clients pg_hba.conf trusts besides loopback
	// (e.g. the private network a server on ListenAddress serves).
	TrustNetworks []string
	// RunIn starts each command of the cluster (initdb, pg_ctl, pg_basebackup) in
	// place of cmd.Start, e.g. inside a network namespace so that the server listens
	// there. Defaults to cmd.Start.
	RunIn func(cmd *exec.Cmd) error
	// Logger receives progress lines. Defaults to a logger that discards.
	Logger *slog.Logger
	// DirPrefix starts the name of the temporary directory. Defaults to "fenceq-pg-".
	DirPrefix string
	// OwnerPID, when set, is recorded in the cluster directory (OwnerFile) as the
	// process the cluster belongs to, so that ReapOrphans can remove the cluster once
	// that process is gone without having stopped it.
	OwnerPID int
}

// OwnerFile is the file in a cluster's directory holding the pid of the process that
// owns the cluster (Options.OwnerPID).
const OwnerFile = "owner.pid"

// Cluster is a running throwaway cluster.
type Cluster struct {
	// URL connects to the postgres database as the postgres superuser over TCP.
	URL string
	// SocketURL connects to the same database over the server's Unix socket in Dir:
	// it works from any network namespace of the machine.
	SocketURL string
	// Host is the address the server listens on.
	Host string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// Dir is the temporary directory holding the data directory, socket and log.
	Dir string
	// BinDir holds the binaries used.
	BinDir string

	dataDir, logFile string
	cred             *syscall.Credential
	opts             Options
}

// FindBinDir returns the directory holding initdb and pg_ctl: the newest
// /usr/lib/postgresql/*/bin (Debian, Ubuntu), else /usr/pgsql-*/bin (RHEL), else the
// directory of initdb on PATH.
func FindBinDir() (string, error) {
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin"} {
		dirs, _ := filepath.Glob(pattern)
		slices.SortFunc(dirs, func(a, b string) int { return versionOf(b) - versionOf(a) })
		for _, d := range dirs {
			if hasBinaries(d) {
				return d, nil
			}
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if d := filepath.Dir(p); hasBinaries(d) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(binDir string) int {
	// /usr/lib/postgresql/15/bin → 15; /usr/pgsql-16/bin → 16
	base := filepath.Base(filepath.Dir(binDir))
	base = strings.TrimPrefix(base, "pgsql-")
	v, _ := strconv.Atoi(base)
	return v
}

func hasBinaries(dir string) bool {
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// Start creates a cluster in a new temporary directory and starts it. On failure
// everything it created is removed.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ListenAddress == "" {
		opts.ListenAddress = "127.0.0.1"
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !hasBinaries(opts.BinDir) {
		return nil, fmt.Errorf("%w in %s", ErrNoBinaries, opts.BinDir)
	}
	if c, err = newCluster(opts); err != nil {
		return nil, err
	}
	dir := c.Dir // c is nil once an error is returned
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()

	ictx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	opts.Logger.Info("creating a throwaway PostgreSQL cluster", "dir", c.Dir, "bin", c.BinDir, "user", c.opts.User)
	if out, err := c.run(ictx, "initdb", "-D", c.dataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(out, 3))
	}
	if err := c.trustNetworks(); err != nil {
		return nil, err
	}
	if err := c.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	opts.Logger.Info("throwaway PostgreSQL cluster started", "port", c.Port)
	return c, nil
}

// trustNetworks adds Options.TrustNetworks to pg_hba.conf.
func (c *Cluster) trustNetworks() error {
	if len(c.opts.TrustNetworks) == 0 {
		return nil
	}
	var b strings.Builder
	for _, n := range c.opts.TrustNetworks {
		if _, _, err := net.ParseCIDR(n); err != nil {
			return fmt.Errorf("start PostgreSQL cluster: Options.TrustNetworks: %w", err)
		}
		fmt.Fprintf(&b, "host all all %s trust\nhost replication all %s trust\n", n, n)
	}
	f, err := os.OpenFile(filepath.Join(c.dataDir, "pg_hba.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("start PostgreSQL cluster: %w", err)
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("start PostgreSQL cluster: pg_hba.conf: %w", err)
	}
	return nil
}

// newCluster makes the cluster's temporary directory, owned by the user the server
// runs as.
func newCluster(opts Options) (*Cluster, error) {
	c := &Cluster{BinDir: opts.BinDir, Host: opts.ListenAddress, opts: opts}
	if os.Geteuid() == 0 {
		if c.opts.User == "" {
			c.opts.User = "nobody"
		}
		var err error
		if c.cred, err = credentialOf(c.opts.User); err != nil {
			return nil, fmt.Errorf("start PostgreSQL cluster: run as %s: %w", c.opts.User, err)
		}
	}
	base := opts.BaseDir
	if base == "" {
		base = os.TempDir()
		if c.cred != nil && !reachableByAll(base) {
			base = "/tmp"
		}
	}
	prefix := opts.DirPrefix
	if prefix == "" {
		prefix = "fenceq-pg-"
	}
	var err error
	if c.Dir, err = os.MkdirTemp(base, prefix); err != nil {
		return nil, fmt.Errorf("start PostgreSQL cluster: %w", err)
	}
	if opts.OwnerPID > 0 {
		if err := os.WriteFile(filepath.Join(c.Dir, OwnerFile), []byte(strconv.Itoa(opts.OwnerPID)+"\n"), 0o644); err != nil {
			_ = os.RemoveAll(c.Dir)
			return nil, fmt.Errorf("start PostgreSQL cluster: record its owner: %w", err)
		}
	}
	c.dataDir = filepath.Join(c.Dir, "data")
	c.logFile = filepath.Join(c.Dir, "postgres.log")
	if c.cred != nil {
		if err := os.Chown(c.Dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			_ = os.RemoveAll(c.Dir)
			return nil, fmt.Errorf("start PostgreSQL cluster: hand %s to %s: %w", c.Dir, c.opts.User, err)
		}
	}
	return c, nil
}

// startOnFreePort starts the server on a free port, trying another one if the port
// was taken in the meantime, and sets the URLs.
func (c *Cluster) startOnFreePort(ctx context.Context) error {
	for try := 0; ; try++ {
		var err error
		if c.Port, err = freePort(); err != nil {
			return fmt.Errorf("start PostgreSQL cluster: find a free port: %w", err)
		}
		err = c.startServer(ctx)
		if err == nil {
			break
		}
		if try == 2 || !strings.Contains(c.readLog(), "could not bind") {
			return err
		}
	}
	c.URL = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	c.SocketURL = fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", url.QueryEscape(c.Dir), c.Port)
	return nil
}

func (c *Cluster) startServer(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	settings := map[string]string{
		"listen_addresses": c.Host, "port": strconv.Itoa(c.Port),
		"unix_socket_directories": c.Dir, "fsync": "off", "synchronous_commit": "off",
		"full_page_writes": "off", "max_connections": "200",
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var o strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&o, " -c %s=%s", k, settings[k])
	}
	out, err := c.run(sctx, "pg_ctl", "-D", c.dataDir, "-l", c.logFile, "-w",
		"-t", strconv.Itoa(int(c.opts.StartTimeout.Seconds())), "-o", strings.TrimSpace(o.String()), "start")
	if err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s %s", err, lastLines(out, 2), lastLines([]byte(c.readLog()), 3))
	}
	return nil
}

// Kill stops the server in immediate mode, as a crash would (no checkpoint, clients cut
// off), and leaves it stopped; Stop still removes its directory.
// If pg_ctl does not report the server stopped within 10s, the postmaster is killed
// outright (SIGQUIT, then SIGKILL).
func (c *Cluster) Kill(ctx context.Context) error {
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := c.stopServer(kctx, "immediate")
	if err == nil {
		return nil
	}
	if kerr := c.killPostmaster(); kerr != nil {
		return errors.Join(err, kerr)
	}
	if _, serr := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); serr == nil {
		// The pid file stays behind a killed postmaster; it no longer runs.
		_ = os.Remove(filepath.Join(c.dataDir, "postmaster.pid"))
	}
	c.opts.Logger.Warn("pg_ctl stop -m immediate did not finish; postmaster killed", "err", err)
	return nil
}

// Restart stops the server (mode "immediate" simulates a crash; "fast" is a clean
// shutdown) and starts it again on the same port and data.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	if err := c.stopServer(ctx, mode); err != nil {
		return err
	}
	return c.startServer(ctx)
}

func (c *Cluster) stopServer(ctx context.Context, mode string) error {
	if mode == "" {
		mode = "fast"
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := c.run(sctx, "pg_ctl", "-D", c.dataDir, "-m", mode, "-w", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, lastLines(out, 2))
	}
	return nil
}

// Stop shuts the server down and removes the temporary directory. If pg_ctl cannot
// stop it, the postmaster is killed. Calling Stop twice is harmless.
func (c *Cluster) Stop(ctx context.Context) error {
	if c == nil || c.Dir == "" {
		return nil
	}
	var errs []error
	if _, err := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); err == nil {
		if err := c.stopServer(ctx, "fast"); err != nil {
			errs = append(errs, err)
			if kerr := c.killPostmaster(); kerr != nil {
				errs = append(errs, kerr)
			}
		}
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", c.Dir, err))
	}
	c.Dir = ""
	return errors.Join(errs...)
}

func (c *Cluster) killPostmaster() error { return killPostmaster(c.dataDir) }

// ReapOrphans removes the clusters under baseDir whose directory name starts with prefix
// and whose owner (OwnerFile) is no longer running: their postmaster is shut down
// (immediately) and their directory removed. A directory without an owner file is left
// alone: it belongs to a cluster started without OwnerPID, or to one being created. It
// returns the directories removed.
func ReapOrphans(baseDir, prefix string) ([]string, error) {
	if prefix == "" {
		return nil, errors.New("reap orphaned clusters: prefix is empty")
	}
	dirs, err := filepath.Glob(filepath.Join(baseDir, prefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("reap orphaned clusters in %s: %w", baseDir, err)
	}
	var removed []string
	var errs []error
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, OwnerFile))
		if err != nil {
			continue
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || owner <= 0 || processAlive(owner) {
			continue
		}
		if err := killPostmaster(filepath.Join(dir, "data")); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove orphaned cluster %s: %w", dir, err))
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// processAlive reports whether a process with this pid exists (a process of another
// user counts).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killPostmaster shuts down the postmaster of the data directory, if one runs.
func killPostmaster(dataDir string) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 0 || !runsDataDir(pid, dataDir) {
		return nil
	}
	// SIGQUIT is PostgreSQL's immediate shutdown; the children follow the postmaster.
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill postmaster %d: %w", pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return nil
}

// runsDataDir reports whether process pid may be the postmaster of dataDir. Where /proc
// shows command lines, it must be a process started with dataDir in its arguments (a
// postmaster that died leaves its pid file behind, and the pid may since belong to
// another process); elsewhere any process counts.
func runsDataDir(pid int, dataDir string) bool {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(b), "\x00"), dataDir)
}

func (c *Cluster) readLog() string {
	b, _ := os.ReadFile(c.logFile)
	return string(b)
}

// run runs one of the cluster's binaries as the cluster's user, in its own process
// group so a Ctrl-C meant for the caller does not reach the server.
func (c *Cluster) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, bin), args...)
	cmd.Dir = c.Dir
	cmd.Env = []string{"PATH=" + c.BinDir + ":/usr/bin:/bin", "LC_ALL=C", "LANG=C", "HOME=" + c.Dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := cmd.Start
	if c.opts.RunIn != nil {
		start = func() error { return c.opts.RunIn(cmd) }
	}
	if err := start(); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	return out.Bytes(), err
}

func credentialOf(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("gid %q: %w", u.Gid, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("user %s is root; PostgreSQL refuses to run as root", name)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// reachableByAll reports whether every directory from / down to dir can be traversed
// by any user.
func reachableByAll(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		st, err := os.Stat(dir)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
