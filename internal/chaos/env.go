package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/faultproxy"
	"github.com/fenceq/fenceq/internal/netns"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/migrations"
)

// ErrClusterUnavailable means the harness could not start its own PostgreSQL cluster
// (no initdb/pg_ctl on this machine, or the server would not start).
var ErrClusterUnavailable = errors.New("cannot start a throwaway PostgreSQL cluster")

// EnvConfig describes the processes and database of a run.
type EnvConfig struct {
	// Binary is the fenceq binary the workers run. Required.
	Binary string
	// DatabaseURL names the server (postgres:// form). When it sets search_path, that
	// schema is used as it is (migrated already, as fenceqtest.New hands out);
	// otherwise the harness creates a schema, migrates it, and drops it on Close unless
	// KeepSchema.
	DatabaseURL string
	// OwnCluster starts a throwaway PostgreSQL cluster (internal/pgcluster) instead of
	// using DatabaseURL: the harness can then restart PostgreSQL.
	OwnCluster bool
	// WorkerDatabaseURL, when set, is what the worker processes connect to (through
	// their fault proxies) instead of the run's schema URL: e.g. a PgBouncer in front of
	// the same database whose server connections select the run's schema. The harness
	// itself keeps using DatabaseURL directly.
	WorkerDatabaseURL string
	// Workers is the number of worker processes. Defaults to 3.
	Workers int
	// Hosts, when positive, runs each of that many worker processes on a host of its
	// own: a network namespace per worker and one for PostgreSQL (a throwaway cluster
	// listening on that host's address), cabled to a private bridge (internal/netns).
	// Each worker's fault proxy runs inside the worker's namespace, so its traffic
	// crosses the worker's own link. Needs root and iproute2; sets Workers and
	// OwnCluster.
	Hosts int
	// Failover runs a primary and a streaming standby (throwaway clusters); workers
	// reach both with a multi-host URL (target_session_attrs=read-write), through a
	// fault proxy per server, so that the failover fault can kill the primary and
	// promote the standby. Replication is synchronous unless AsyncReplication. Sets
	// OwnCluster.
	Failover         bool
	AsyncReplication bool
	// ReplicaLag, with AsyncReplication, silences the link the standby streams over
	// for this long before the primary is killed: the standby lacks what the primary
	// acknowledged meanwhile.
	ReplicaLag time.Duration
	// Naive runs the naive baseline worker instead of `fenceq worker`, on a schema whose
	// business unique constraints are dropped.
	Naive bool
	// NaiveCommand is the command line that starts a naive worker, before its flags.
	// Defaults to Binary chaos naive-worker.
	NaiveCommand []string
	// NaiveArgs are extra flags of every naive worker (see ParseNaiveFlags).
	NaiveArgs []string
	// ProcessEnv is added to the environment of every worker process.
	ProcessEnv []string
	// Lease, Heartbeat, Reaper and Poll tune the workers. Default 2s, 500ms, 500ms, 250ms.
	Lease, Heartbeat, Reaper, Poll time.Duration
	// Concurrency is the jobs per queue a worker runs at once. Defaults to 4.
	Concurrency int
	// MaxConns is each worker's connection pool size. Defaults to 4.
	MaxConns int
	// WorkerArgs are extra flags of every `fenceq worker`.
	WorkerArgs []string
	// MailArgs returns the flags that make a worker deliver email to a file (a JSON
	// line per message). Defaults to --mailer file:PATH.
	MailArgs func(path string) []string
	// TaxArgs shape the simulated tax service of invoice jobs. Defaults to 20–300ms
	// with a 10% tail of 1.25–2 leases: past the lease, which heartbeats must cover.
	TaxArgs []string
	// LogDir receives each worker's log (w1.log, …) and mail file. Defaults to a new
	// temporary directory, kept after the run.
	LogDir string
	// KeepSchema keeps a schema the harness created.
	KeepSchema bool
	// Logger receives progress. Defaults to discarding.
	Logger *slog.Logger
}

func (c *EnvConfig) withDefaults() error {
	if c.Binary == "" {
		return errors.New("chaos: EnvConfig.Binary: the fenceq binary is required")
	}
	switch {
	case c.Hosts < 0 || c.Hosts > 64:
		return fmt.Errorf("chaos: EnvConfig.Hosts: %d must be between 0 and 64", c.Hosts)
	case c.Hosts > 0 && c.Failover:
		return errors.New("chaos: EnvConfig.Hosts and Failover cannot be combined")
	case (c.Hosts > 0 || c.Failover) && c.WorkerDatabaseURL != "":
		return errors.New("chaos: EnvConfig.WorkerDatabaseURL cannot be combined with Hosts or Failover")
	case c.AsyncReplication && !c.Failover:
		return errors.New("chaos: EnvConfig.AsyncReplication needs Failover")
	case c.ReplicaLag < 0 || (c.ReplicaLag > 0 && !c.AsyncReplication):
		return errors.New("chaos: EnvConfig.ReplicaLag needs AsyncReplication (a synchronous standby that lags stalls every commit)")
	}
	if c.Hosts > 0 {
		if c.Workers != 0 && c.Workers != c.Hosts {
			return fmt.Errorf("chaos: EnvConfig.Workers %d differs from Hosts %d: one worker runs per host", c.Workers, c.Hosts)
		}
		c.Workers = c.Hosts
		c.OwnCluster = true
	}
	if c.Failover {
		c.OwnCluster = true
	}
	if !c.OwnCluster && c.DatabaseURL == "" {
		return errors.New("chaos: EnvConfig.DatabaseURL: required unless OwnCluster")
	}
	if c.Workers == 0 {
		c.Workers = 3
	}
	if c.Workers < 1 || c.Workers > 64 {
		return fmt.Errorf("chaos: workers %d must be between 1 and 64", c.Workers)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.Lease, 2*time.Second)
	def(&c.Heartbeat, 500*time.Millisecond)
	def(&c.Reaper, 500*time.Millisecond)
	def(&c.Poll, 250*time.Millisecond)
	if c.Heartbeat >= c.Lease {
		return fmt.Errorf("chaos: heartbeat %s must be shorter than the lease %s", c.Heartbeat, c.Lease)
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.MaxConns == 0 {
		c.MaxConns = 4
	}
	if c.Concurrency < 1 || c.MaxConns < 2 {
		return fmt.Errorf("chaos: concurrency %d must be at least 1 and max conns %d at least 2", c.Concurrency, c.MaxConns)
	}
	if c.MailArgs == nil {
		c.MailArgs = func(path string) []string { return []string{"--mailer", "file:" + path} }
	}
	if c.TaxArgs == nil {
		c.TaxArgs = []string{"--tax-latency", "20ms-300ms", "--tax-tail-probability", "0.1",
			"--tax-tail", fmt.Sprintf("%s-%s", c.Lease*5/4, 2*c.Lease)}
	}
	if len(c.NaiveCommand) == 0 {
		c.NaiveCommand = []string{c.Binary, "chaos", "naive-worker"}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Env is a run's database schema, its fault proxies and its worker processes.
type Env struct {
	cfg EnvConfig
	log *slog.Logger
	// Token makes names of this run unique on a shared server.
	Token string
	// Cluster is the throwaway cluster, nil unless OwnCluster; with Failover it is the
	// primary and Standby the standby.
	Cluster *pgcluster.Cluster
	Standby *pgcluster.Cluster
	// Net is the private network of a Hosts run, DBHost its PostgreSQL host.
	Net    *netns.Network
	DBHost *netns.Host
	// Schema is the run's schema; URL connects to it directly.
	Schema string
	URL    string
	// Pool is the harness's own connection pool (direct, not through a proxy).
	Pool *pgxpool.Pool
	// Workers are the worker slots.
	Workers []*Worker
	// LogDir holds the workers' logs and mail files.
	LogDir string
	// Citus is set when the run's schema is distributed by a Citus coordinator; the
	// harness then has no lease log (see sqlInstallLeaseLog).
	Citus bool

	ownsSchema bool
	serverURL  string

	mu    sync.Mutex
	until time.Time // faults stop waiting for work then (see RunSchedule)
	fo    *failoverState
	// replProxy carries the standby's replication connection in a Failover run.
	replProxy *faultproxy.Proxy
}

// Worker is one worker slot: a process (restarted after kills) behind its own fault
// proxy, with a stable application_name by which its sessions are found.
type Worker struct {
	env *Env
	// Slot is the 0-based index; Name is "w1", "w2", ….
	Slot int
	Name string
	// AppName is the application_name of every session of the slot.
	AppName string
	// Proxy sits between the slot's processes and PostgreSQL. With Failover, Proxies
	// holds one proxy per server (primary first) and Proxy is the primary's.
	Proxy   *faultproxy.Proxy
	Proxies []*faultproxy.Proxy
	// Host is the slot's network namespace in a Hosts run, nil otherwise.
	Host *netns.Host
	// Proc is the slot's process.
	Proc *Process
	// MailFile receives the emails the slot delivers.
	MailFile string

	url string // through the proxy, with application_name
	mu  sync.Mutex
	ids []string
}

// NewEnv prepares the database (creating and migrating a schema when needed, the naive
// schema changes, the harness's lease log) and a fault proxy per worker slot. Workers
// start with StartWorkers. Close releases everything, also after a failed NewEnv.
func NewEnv(ctx context.Context, cfg EnvConfig) (e *Env, err error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	e = &Env{cfg: cfg, log: cfg.Logger, Token: randomToken()}
	if cfg.Failover {
		e.fo = &failoverState{}
	}
	defer func() {
		if err != nil {
			_ = e.Close(context.Background())
			e = nil
		}
	}()
	if e.LogDir = cfg.LogDir; e.LogDir == "" {
		if e.LogDir, err = os.MkdirTemp("", "fenceq-chaos-"); err != nil {
			return e, fmt.Errorf("chaos: log directory: %w", err)
		}
	} else if err := os.MkdirAll(e.LogDir, 0o755); err != nil {
		return e, fmt.Errorf("chaos: log directory: %w", err)
	}

	base := cfg.DatabaseURL
	if cfg.OwnCluster {
		if base, err = e.startClusters(ctx); err != nil {
			return e, err
		}
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return e, fmt.Errorf("chaos: database URL %s: want the postgres://user@host:port/db form", redact.URL(base))
	}
	q := u.Query()
	e.Schema = q.Get("search_path")
	if e.Schema == "" {
		e.Schema = "chaos_" + e.Token
		e.ownsSchema = true
		q.Set("search_path", e.Schema)
		u.RawQuery = q.Encode()
	}
	e.URL = u.String()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	e.serverURL = u.String()

	if e.ownsSchema {
		if err := e.createSchema(ctx); err != nil {
			return e, err
		}
	}
	pcfg, err := pgxpool.ParseConfig(e.URL)
	if err != nil {
		return e, fmt.Errorf("chaos: parse database URL: %w", err)
	}
	pcfg.MaxConns = 8
	pcfg.ConnConfig.RuntimeParams["application_name"] = "fenceq-" + e.Token + "-harness"
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	if e.Pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return e, fmt.Errorf("chaos: connect: %w", err)
	}
	if e.ownsSchema {
		if err := migrations.UpAll(ctx, e.Pool, builtin.Migrations()...); err != nil {
			return e, fmt.Errorf("chaos: migrate schema %s: %w", e.Schema, err)
		}
	}
	if cfg.Naive {
		if err := PrepareNaiveSchema(ctx, e.Pool); err != nil {
			return e, err
		}
	}
	if e.Citus, err = store.Distributed(ctx, e.Pool); err != nil {
		return e, fmt.Errorf("chaos: %w", err)
	}
	switch {
	case e.Citus && cfg.Naive:
		return e, errors.New("chaos: --naive is not supported on Citus: its takeovers are counted by a trigger on fenceq_jobs, which a distributed table cannot have")
	case e.Citus:
		// The lease log is a trigger with transition tables, which Citus does not run
		// on a distributed table: the report leaves out what it measures.
		e.log.Info("Citus: no lease log; the report leaves out claims and revocation waits")
	default:
		if _, err := e.Pool.Exec(ctx, sqlInstallLeaseLog); err != nil {
			return e, fmt.Errorf("chaos: install the lease log: %w", err)
		}
	}

	upstream := net.JoinHostPort(u.Hostname(), portOf(u))
	workerURL := e.URL
	if cfg.WorkerDatabaseURL != "" {
		wu, err := url.Parse(cfg.WorkerDatabaseURL)
		if err != nil || (wu.Scheme != "postgres" && wu.Scheme != "postgresql") {
			return e, fmt.Errorf("chaos: worker database URL %s: want the postgres://user@host:port/db form",
				redact.URL(cfg.WorkerDatabaseURL))
		}
		upstream = net.JoinHostPort(wu.Hostname(), portOf(wu))
		workerURL = cfg.WorkerDatabaseURL
	}
	for i := 0; i < cfg.Workers; i++ {
		w := &Worker{env: e, Slot: i, Name: fmt.Sprintf("w%d", i+1)}
		w.AppName = "fenceq-" + e.Token + "-" + w.Name
		w.Proc = NewProcess(w.Name, filepath.Join(e.LogDir, w.Name+".log"))
		e.Workers = append(e.Workers, w)
		if err := e.startProxies(w, upstream); err != nil {
			return e, err
		}
		wu, _ := url.Parse(workerURL)
		hosts := make([]string, len(w.Proxies))
		for j, p := range w.Proxies {
			hosts[j] = p.Addr()
		}
		wu.Host = strings.Join(hosts, ",")
		wq := wu.Query()
		// The harness may reach the server over its Unix socket (host=DIR&port=P in
		// the query); the workers go through their proxies only.
		wq.Del("host")
		wq.Del("port")
		wq.Set("application_name", w.AppName)
		if wq.Get("connect_timeout") == "" {
			wq.Set("connect_timeout", "3")
		}
		wu.RawQuery = wq.Encode()
		w.url = wu.String()
		w.MailFile = filepath.Join(e.LogDir, w.Name+".mail.jsonl")
	}
	return e, nil
}

func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	return "5432"
}

func (e *Env) createSchema(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, e.serverURL)
	if err != nil {
		return fmt.Errorf("chaos: connect to %s: %w", redact.URL(e.serverURL), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{e.Schema}.Sanitize()); err != nil {
		return fmt.Errorf("chaos: create schema %s: %w", e.Schema, err)
	}
	return nil
}

func (e *Env) dropSchema(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, e.serverURL)
	if err != nil {
		return fmt.Errorf("chaos: drop schema %s: %w", e.Schema, err)
	}
	defer conn.Close(ctx)
	// A session or a prepared transaction that still holds a lock on the schema's tables
	// would make the drop wait for ever; it waits a bounded time and then names what
	// held it.
	if _, err := conn.Exec(ctx, "SET lock_timeout = '"+dropLockTimeout+"'"); err != nil {
		return fmt.Errorf("chaos: drop schema %s: %w", e.Schema, err)
	}
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{e.Schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("chaos: drop schema %s: %w (%s)", e.Schema, err, lockHolders(ctx, e.serverURL))
	}
	return nil
}

// dropLockTimeout bounds how long dropping a run's schema waits for its locks.
const dropLockTimeout = "60s"

// lockHolders describes the other sessions and the prepared transactions of the server
// at url that hold locks, for an error that says why a statement could not get its own.
func lockHolders(ctx context.Context, url string) string {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "lock holders unknown: " + err.Error()
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT 'pid ' || a.pid || ' ' || coalesce(a.state, '') || ': ' || left(coalesce(a.query, ''), 120)
		  FROM pg_stat_activity a
		 WHERE a.pid <> pg_backend_pid() AND a.datname = current_database()
		   AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted)
		UNION ALL
		SELECT 'prepared transaction ' || gid || ' since ' || prepared FROM pg_prepared_xacts`)
	if err != nil {
		return "lock holders unknown: " + err.Error()
	}
	holders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "lock holders unknown: " + err.Error()
	}
	if len(holders) == 0 {
		return "no other session of this server holds a lock"
	}
	return "held by " + strings.Join(holders, "; ")
}

// StartWorkers starts every slot's process and waits until each registered itself in
// fenceq_workers.
func (e *Env) StartWorkers(ctx context.Context) error {
	for _, w := range e.Workers {
		if err := w.Start(); err != nil {
			return err
		}
	}
	for _, w := range e.Workers {
		if err := w.WaitRegistered(ctx, 30*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// StopWorkers stops every process gracefully (SIGCONT, SIGTERM), killing those that
// do not exit within grace.
func (e *Env) StopWorkers(grace time.Duration) error {
	var wg sync.WaitGroup
	errs := make([]error, len(e.Workers))
	for i, w := range e.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.Proc.Stop(grace)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close stops the workers and proxies, closes the pool, drops a schema the harness
// created and stops its cluster. It never leaves a process behind.
func (e *Env) Close(ctx context.Context) error {
	var errs []error
	if err := e.StopWorkers(10 * time.Second); err != nil {
		errs = append(errs, err)
	}
	for _, w := range e.Workers {
		for _, p := range w.Proxies {
			_ = p.Close()
		}
	}
	if e.Pool != nil {
		e.Pool.Close()
	}
	if e.ownsSchema && !e.cfg.KeepSchema && e.Schema != "" && e.Cluster == nil {
		if err := e.dropSchema(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if e.replProxy != nil {
		_ = e.replProxy.Close()
	}
	for _, c := range []*pgcluster.Cluster{e.Standby, e.Cluster} {
		if c != nil {
			if err := c.Stop(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Last: the server ran inside the network.
	if err := e.Net.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// args returns the command line of the slot's next process.
func (w *Worker) args(id string) (bin string, args []string) {
	c := w.env.cfg
	if c.Naive {
		// --name=value: the CLI passes a hidden command's arguments through unparsed.
		cmd := c.NaiveCommand
		args = append(append([]string{}, cmd[1:]...),
			"--database-url="+w.url, "--id="+id, "--lease="+c.Lease.String(), "--poll="+c.Poll.String(),
			"--concurrency="+strconv.Itoa(c.Concurrency), "--mail-file="+w.MailFile)
		return cmd[0], append(args, c.NaiveArgs...)
	}
	args = []string{"worker", "--database-url", w.url, "--id", id,
		"--lease", c.Lease.String(), "--heartbeat", c.Heartbeat.String(),
		"--reaper", c.Reaper.String(), "--poll", c.Poll.String(),
		"--concurrency", strconv.Itoa(c.Concurrency), "--max-conns", strconv.Itoa(c.MaxConns),
		"--shutdown-timeout", "2s"}
	args = append(args, c.MailArgs(w.MailFile)...)
	args = append(args, c.TaxArgs...)
	return c.Binary, append(args, c.WorkerArgs...)
}

// Start starts a new process in the slot under a new worker id (a restarted process is
// a new worker: the reaper must not take the dead one's leases for a live holder's).
func (w *Worker) Start() error {
	id := fmt.Sprintf("%s-%s-%d", w.env.Token, w.Name, w.Proc.Starts()+1)
	bin, args := w.args(id)
	var in func(*exec.Cmd) error
	if w.Host != nil {
		in = w.Host.Start
	}
	if err := w.Proc.StartIn(in, bin, args, w.env.cfg.ProcessEnv); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	w.mu.Lock()
	w.ids = append(w.ids, id)
	w.mu.Unlock()
	return nil
}

// ID returns the worker id of the slot's current process.
func (w *Worker) ID() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.ids) == 0 {
		return ""
	}
	return w.ids[len(w.ids)-1]
}

// WaitRegistered waits until the slot's current process registered in fenceq_workers.
func (w *Worker) WaitRegistered(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	id := w.ID()
	for {
		var n int
		err := w.env.Pool.QueryRow(ctx, sqlWorkerRegistered, id).Scan(&n)
		if err == nil && n > 0 {
			return nil
		}
		if !w.Proc.Running() {
			return fmt.Errorf("chaos: worker %s (%s) exited before it registered: %s; see %s",
				w.Name, id, w.Proc.ExitStatus(), w.Proc.logPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: worker %s (%s) did not register within %s (last error: %v); see %s",
				w.Name, id, within, err, w.Proc.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// LogPath is the slot's log file.
func (w *Worker) LogPath() string { return w.Proc.logPath }

func randomToken() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
