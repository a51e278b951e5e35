package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fenceq/fenceq/internal/faultproxy"
	"github.com/fenceq/fenceq/internal/netns"
	"github.com/fenceq/fenceq/internal/pgcluster"
)

// subnet is the private network of a Hosts run: it exists only inside the run's
// namespaces, so concurrent runs may all use it.
const subnet = "10.123.0"

// ErrNoHosts means a fault needs the multi-host network of EnvConfig.Hosts.
var ErrNoHosts = errors.New("the workers do not run on hosts of their own (run with --hosts N)")

// startClusters starts the run's own PostgreSQL: a single cluster, inside the database
// host's namespace for a Hosts run, or a primary and a standby for a Failover run. It
// returns the URL the harness connects with.
func (e *Env) startClusters(ctx context.Context) (string, error) {
	c := e.cfg
	// synchronous_commit on: an immediate restart must not lose committed transactions
	// (fsync may stay off: the machine does not crash, only PostgreSQL).
	opts := pgcluster.Options{Logger: e.log,
		Settings: map[string]string{"max_connections": "150", "synchronous_commit": "on"}}
	if c.Hosts > 0 {
		if removed, err := netns.Cleanup(); err != nil {
			return "", fmt.Errorf("chaos: remove the namespaces of an earlier run: %w", err)
		} else if len(removed) > 0 {
			e.log.Warn("removed the namespaces an earlier run left behind", "namespaces", removed)
		}
		names := []string{"db"}
		for i := 1; i <= c.Hosts; i++ {
			names = append(names, fmt.Sprintf("w%d", i))
		}
		var err error
		if e.Net, err = netns.Create(ctx, e.Token, subnet, names); err != nil {
			return "", fmt.Errorf("chaos: %w", err)
		}
		e.DBHost = e.Net.Host("db")
		opts.ListenAddress = e.DBHost.Addr
		opts.TrustNetworks = []string{subnet + ".0/24"}
		opts.RunIn = e.DBHost.Start
		e.log.Info("private network up", "namespaces", e.Net.Name+"-*", "db", e.DBHost.Addr)
	}
	if c.Failover && c.AsyncReplication {
		opts.Settings["synchronous_commit"] = "local"
	}
	e.log.Info("starting a throwaway PostgreSQL cluster")
	var err error
	if e.Cluster, err = pgcluster.Start(ctx, opts); err != nil {
		return "", fmt.Errorf("chaos: %w: %w", ErrClusterUnavailable, err)
	}
	if c.Hosts > 0 {
		// The harness stays in its own namespace: it reaches the server over its Unix
		// socket, never through the private network.
		return e.Cluster.SocketURL, nil
	}
	if !c.Failover {
		return e.Cluster.URL, nil
	}
	// The standby streams through a proxy of its own: the link between the servers,
	// which the failover fault can starve to make the standby lag (ReplicaLag).
	if e.replProxy, err = faultproxy.New(hostPort(e.Cluster)); err != nil {
		return "", fmt.Errorf("chaos: replication proxy: %w", err)
	}
	if e.Standby, err = e.Cluster.StartStandby(ctx, pgcluster.StandbyOptions{Name: "fenceq_standby",
		Sync: !c.AsyncReplication, Via: e.replProxy.Addr()}); err != nil {
		return "", fmt.Errorf("chaos: %w: %w", ErrClusterUnavailable, err)
	}
	return multiHostURL(e.Cluster.URL, []string{hostPort(e.Cluster), hostPort(e.Standby)}), nil
}

func hostPort(c *pgcluster.Cluster) string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }

// multiHostURL is base with its host replaced by hosts, tried in order, and
// target_session_attrs=read-write: pgx connects to the first that accepts writes.
func multiHostURL(base string, hosts []string) string {
	u, _ := url.Parse(base)
	u.Host = strings.Join(hosts, ",")
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	return u.String()
}

// startProxies gives a worker slot its fault proxies: one to upstream, inside the
// worker's namespace in a Hosts run (its connections leave through the worker's own
// link), or one per server in a Failover run.
func (e *Env) startProxies(w *Worker, upstream string) error {
	var cfgs []faultproxy.Config
	switch {
	case e.Net != nil:
		w.Host = e.Net.Host(w.Name)
		ln, err := w.Host.Listen("127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("chaos: proxy for %s: listen in its namespace: %w", w.Name, err)
		}
		host := w.Host
		cfgs = append(cfgs, faultproxy.Config{Upstream: net.JoinHostPort(e.DBHost.Addr, strconv.Itoa(e.Cluster.Port)),
			Listener: ln, Dial: func(ctx context.Context, addr string) (net.Conn, error) {
				return host.Dial(ctx, addr, 3*time.Second)
			}})
	case e.Standby != nil:
		cfgs = append(cfgs, faultproxy.Config{Upstream: hostPort(e.Cluster)}, faultproxy.Config{Upstream: hostPort(e.Standby)})
	default:
		cfgs = append(cfgs, faultproxy.Config{Upstream: upstream})
	}
	for _, cfg := range cfgs {
		p, err := faultproxy.NewWithConfig(cfg)
		if err != nil {
			if cfg.Listener != nil {
				_ = cfg.Listener.Close()
			}
			return fmt.Errorf("chaos: proxy for %s: %w", w.Name, err)
		}
		w.Proxies = append(w.Proxies, p)
	}
	w.Proxy = w.Proxies[0]
	return nil
}

// dbAddr is the database's address on the private network.
func (e *Env) dbAddr() string {
	return net.JoinHostPort(e.DBHost.Addr, strconv.Itoa(e.Cluster.Port))
}

// probeDial tries to connect from host to the database and reports the error, nil when
// the connection was made.
func (e *Env) probeDial(ctx context.Context, h *netns.Host) error {
	c, err := h.Dial(ctx, e.dbAddr(), 300*time.Millisecond)
	if err == nil {
		_ = c.Close()
	}
	return err
}

// cut brings a host's link down and returns the proof: the operstate read back.
func cut(ctx context.Context, h *netns.Host) (string, error) {
	if err := h.SetLink(ctx, false); err != nil {
		return "", err
	}
	st, err := h.Operstate(ctx)
	if err != nil {
		return "", err
	}
	if st != "DOWN" {
		return "", fmt.Errorf("%s's eth0 reads back as %s after ip link set down", h.Name, st)
	}
	return st, nil
}

// heal brings a host's link up and waits until the database is reachable from it.
func (e *Env) heal(ctx context.Context, h *netns.Host) error {
	var err error
	for try := 0; try < 3; try++ {
		if err = h.SetLink(ctx, true); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		perr := e.probeDial(ctx, h)
		if perr == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s does not reach the database 10s after its link came up: %w", h.Name, perr)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// heldLeases returns the leases the worker's current process holds, as "job:gen".
func (e *Env) heldLeases(ctx context.Context, w *Worker) ([][2]int64, error) {
	rows, err := e.Pool.Query(ctx, sqlHeldLeaseList, w.ID())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][2]int64
	for rows.Next() {
		var id, gen int64
		if err := rows.Scan(&id, &gen); err != nil {
			return nil, err
		}
		out = append(out, [2]int64{id, gen})
	}
	return out, rows.Err()
}

// waitHoldingWhere waits (a little) until the count query sql, given the worker's id,
// finds a lease of the worker.
func (e *Env) waitHoldingWhere(ctx context.Context, w *Worker, within time.Duration, sql string) bool {
	deadline := time.Now().Add(within)
	for {
		var n int64
		err := e.Pool.QueryRow(ctx, sql, w.ID()).Scan(&n)
		if err == nil && n > 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		sleepCtx(ctx, 25*time.Millisecond)
	}
}

// linkDown cuts a worker host's link for d (longer than the lease), then heals it and
// waits for the proof that the worker found the leases it held revoked: a lease event
// recorded by that worker for one of them (heartbeat_lost, expired_holder_alive or
// stale_write_rejected).
func (e *Env) linkDown(ctx context.Context, w *Worker, d time.Duration) (proof, effect string, err error) {
	if w.Host == nil {
		return "", "", ErrNoHosts
	}
	held, err := e.heldLeases(ctx, w)
	if err != nil {
		return "", "", fmt.Errorf("read the leases %s holds: %w", w.Name, err)
	}
	id := w.ID()
	dialsBefore := w.Proxy.DialErrors()
	start := time.Now()
	st, err := cut(ctx, w.Host)
	defer func() { _ = w.Host.SetLink(context.WithoutCancel(ctx), true) }()
	if err != nil {
		return "", "", err
	}
	probe := e.probeDial(ctx, w.Host)
	if probe == nil {
		return "", "", fmt.Errorf("%s reached the database with its link down", w.Name)
	}
	sleepCtx(ctx, d)
	end, err := w.Host.Operstate(ctx)
	if err != nil {
		return "", "", err
	}
	if end != "DOWN" {
		return "", "", fmt.Errorf("%s's link was %s at the end of the cut", w.Name, end)
	}
	down := time.Since(start)
	if err := e.heal(ctx, w.Host); err != nil {
		return "", "", err
	}
	proof = fmt.Sprintf("eth0 of %s read back %s at the cut and %s %s later; a connection from it to %s failed (%v); "+
		"%d upstream connections refused meanwhile; link up and the database reachable again",
		w.Name, st, end, down.Round(time.Millisecond), e.dbAddr(), shortErr(probe), w.Proxy.DialErrors()-dialsBefore)
	if len(held) == 0 {
		return proof, "the worker held no lease at the cut", nil
	}
	// The worker learns only once it can talk to the database again: wait for it.
	deadline := time.Now().Add(2*e.cfg.Lease + 5*time.Second)
	for {
		var kinds []string
		qerr := func() error {
			rows, err := e.Pool.Query(ctx, sqlWorkerLeaseEvents, id, leaseIDs(held), leaseGens(held))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k string
				var job, gen int64
				if err := rows.Scan(&k, &job, &gen); err != nil {
					return err
				}
				kinds = append(kinds, fmt.Sprintf("%s (job %d gen %d)", k, job, gen))
			}
			return rows.Err()
		}()
		if qerr == nil && len(kinds) > 0 {
			return proof, fmt.Sprintf("held %d leases at the cut; after the heal %s recorded %s",
				len(held), id, strings.Join(kinds, ", ")), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return proof, fmt.Sprintf("held %d leases at the cut; %s recorded no lost lease after the heal", len(held), id), nil
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

func leaseIDs(ls [][2]int64) []int64 {
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l[0]
	}
	return out
}

func leaseGens(ls [][2]int64) []int64 {
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l[1]
	}
	return out
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	return s
}

// reconciledRe matches the worker's log line for a fenced commit whose reply was lost
// and that it found landed (the landed check) instead of writing again.
var reconciledRe = regexp.MustCompile(`fenced commit landed although its reply was lost.*?job_id=(\d+)`)

// commitCut lets a COMMIT of the worker reach the database and cuts the worker's link
// the moment the reply comes back, before the worker sees it; the link stays down for
// d, then comes back and the connection that lost the reply is reset. The outcome is
// unknown on that host: the worker must settle it by looking (the landed check).
func (e *Env) commitCut(ctx context.Context, w *Worker, d time.Duration) (proof, effect string, err error) {
	if w.Host == nil {
		return "", "", ErrNoHosts
	}
	logBefore := countMatches(w.LogPath(), reconciledRe)
	held := make(chan faultproxy.CommitDrop, 1)
	var cutErr error
	w.Proxy.HoldCommitReplies(1, func(cd faultproxy.CommitDrop) {
		_, cutErr = cut(context.WithoutCancel(ctx), w.Host)
		held <- cd
	})
	defer w.Proxy.HoldCommitReplies(0, nil)
	defer func() { _ = w.Host.SetLink(context.WithoutCancel(ctx), true) }()
	wait := commitDropWait
	if lim := e.waitLimit(); !lim.IsZero() && time.Until(lim) < wait {
		wait = max(time.Until(lim), time.Second)
	}
	var cd faultproxy.CommitDrop
	select {
	case cd = <-held:
	case <-time.After(wait):
		return "", "", fmt.Errorf("no COMMIT crossed %s's proxy in the %s it stayed armed", w.Name, wait.Round(time.Millisecond))
	case <-ctx.Done():
		return "", "", ctx.Err()
	}
	if cutErr != nil {
		return "", "", fmt.Errorf("cut the link at the COMMIT: %w", cutErr)
	}
	st, err := w.Host.Operstate(ctx)
	if err != nil {
		return "", "", err
	}
	probe := e.probeDial(ctx, w.Host)
	if st != "DOWN" || probe == nil {
		return "", "", fmt.Errorf("after the cut %s's link is %s and a connection from it %v", w.Name, st, probe)
	}
	sleepCtx(ctx, d)
	if err := e.heal(ctx, w.Host); err != nil {
		return "", "", err
	}
	w.Proxy.ResetConn(cd.ConnID)
	proof = fmt.Sprintf("reply %q (%d bytes) to a COMMIT on connection %d swallowed and eth0 of %s cut (read back %s, "+
		"a connection to the database failed: %s) for %s; then the link came up and that connection was reset",
		cd.Tag, cd.Bytes, cd.ConnID, w.Name, st, shortErr(probe), d.Round(time.Millisecond))
	// The worker settles the commit at once: the reset told it the reply is lost.
	deadline := time.Now().Add(5 * time.Second)
	for cd.Tag == "COMMIT" {
		if n := countMatches(w.LogPath(), reconciledRe); n > logBefore {
			jobs := lastMatches(w.LogPath(), reconciledRe, n-logBefore)
			return proof, fmt.Sprintf("%s found its commit landed (the landed check) instead of writing again: job %s",
				w.Name, strings.Join(jobs, ", ")), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return proof, "no reconciliation logged (the COMMIT was not a job's completing commit)", nil
}

// dbPartition isolates the database host from every worker host for d: its link goes
// down.
func (e *Env) dbPartition(ctx context.Context, d time.Duration) (string, error) {
	if e.DBHost == nil {
		return "", ErrNoHosts
	}
	start := time.Now()
	st, err := cut(ctx, e.DBHost)
	defer func() { _ = e.DBHost.SetLink(context.WithoutCancel(ctx), true) }()
	if err != nil {
		return "", err
	}
	failed := 0
	for _, w := range e.Workers {
		if e.probeDial(ctx, w.Host) != nil {
			failed++
		}
	}
	if failed != len(e.Workers) {
		return "", fmt.Errorf("%d of %d worker hosts still reached the database with its link down", len(e.Workers)-failed, len(e.Workers))
	}
	sleepCtx(ctx, d)
	end, err := e.DBHost.Operstate(ctx)
	if err != nil {
		return "", err
	}
	if end != "DOWN" {
		return "", fmt.Errorf("the database host's link was %s at the end of the partition", end)
	}
	down := time.Since(start)
	if err := e.DBHost.SetLink(ctx, true); err != nil {
		return "", err
	}
	for _, w := range e.Workers {
		if err := e.heal(ctx, w.Host); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("eth0 of the database host read back %s at the cut and %s %s later; connections from all %d worker hosts failed; "+
		"link up and the database reachable from every host again", st, end, down.Round(time.Millisecond), len(e.Workers)), nil
}

// countMatches counts the lines of a log file that match re (0 if it cannot be read).
func countMatches(path string, re *regexp.Regexp) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return len(re.FindAllIndex(b, -1))
}

// lastMatches returns the first submatch of the last n matches of re in a log file.
func lastMatches(path string, re *regexp.Regexp, n int) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	all := re.FindAllSubmatch(b, -1)
	if len(all) > n {
		all = all[len(all)-n:]
	}
	out := make([]string, len(all))
	for i, m := range all {
		out[i] = string(m[1])
	}
	return out
}
