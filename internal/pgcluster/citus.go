package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrNoCitus means the machine's PostgreSQL has no citus extension installed.
var ErrNoCitus = errors.New("the citus extension is not installed in this PostgreSQL (citus.so missing; .ci/ensure-citus builds it)")

// CitusOptions tunes StartCitus.
type CitusOptions struct {
	// Options apply to every node (BinDir, Settings, Logger, OwnerPID, …).
	// shared_preload_libraries is set to citus on every node.
	Options
	// Workers is the number of worker nodes. Defaults to 2.
	Workers int
	// NoSchemaSharding leaves citus.enable_schema_based_sharding off. By default it is
	// set on the coordinator's database, so that every schema created there becomes a
	// distributed schema whose tables live whole on one node.
	NoSchemaSharding bool
}

// Citus is a running Citus cluster of throwaway clusters: a coordinator and its worker
// nodes, all on 127.0.0.1, with the citus extension created in each node's postgres
// database. Applications connect to the coordinator.
type Citus struct {
	// Coordinator is the node applications connect to; its URL is the cluster's.
	Coordinator *Cluster
	// Workers are the worker nodes, registered with the coordinator.
	Workers []*Cluster
}

// URL connects to the coordinator's postgres database as the superuser.
func (c *Citus) URL() string { return c.Coordinator.URL }

// Nodes returns the coordinator followed by the workers.
func (c *Citus) Nodes() []*Cluster { return append([]*Cluster{c.Coordinator}, c.Workers...) }

// CitusAvailable reports whether the PostgreSQL binaries in binDir ("" finds them) have
// the citus extension installed. The error says what is missing.
func CitusAvailable(binDir string) error {
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return err
		}
	}
	out, err := exec.Command(filepath.Join(binDir, "pg_config"), "--pkglibdir").Output()
	lib := strings.TrimSpace(string(out))
	if err != nil || lib == "" {
		// Debian keeps pg_config out of the server's bin directory: derive it.
		lib = filepath.Join(filepath.Dir(binDir), "lib")
	}
	if _, err := os.Stat(filepath.Join(lib, "citus.so")); err != nil {
		return fmt.Errorf("%w: looked in %s", ErrNoCitus, lib)
	}
	return nil
}

// StartCitus starts a coordinator and opts.Workers worker nodes, creates the citus
// extension on each, registers the coordinator and the workers, and (unless
// NoSchemaSharding) turns schema-based sharding on for the coordinator's database. On
// failure every node it started is stopped and removed.
func StartCitus(ctx context.Context, opts CitusOptions) (c *Citus, err error) {
	if opts.Workers == 0 {
		opts.Workers = 2
	}
	if opts.Workers < 0 {
		return nil, fmt.Errorf("start Citus cluster: %d workers: want at least 1", opts.Workers)
	}
	if err := CitusAvailable(opts.BinDir); err != nil {
		return nil, err
	}
	base := opts.Options
	if base.Logger == nil {
		base.Logger = slog.New(slog.DiscardHandler)
	}
	base.Settings = map[string]string{
		"shared_preload_libraries": "citus",
		// Two-phase commit is how Citus commits a transaction that wrote on more than
		// one node; prepared transactions must be allowed on every node for it.
		"max_prepared_transactions": "200",
	}
	for k, v := range opts.Settings {
		base.Settings[k] = v
	}
	if base.DirPrefix == "" {
		base.DirPrefix = "fenceq-citus-"
	}
	c = &Citus{}
	defer func() {
		if err != nil {
			_ = c.Stop(context.WithoutCancel(ctx))
			c = nil
		}
	}()
	if c.Coordinator, err = Start(ctx, base); err != nil {
		return c, fmt.Errorf("start Citus coordinator: %w", err)
	}
	for i := range opts.Workers {
		w, err := Start(ctx, base)
		if err != nil {
			return c, fmt.Errorf("start Citus worker %d: %w", i+1, err)
		}
		c.Workers = append(c.Workers, w)
	}
	for _, n := range c.Nodes() {
		if err := execOn(ctx, n.URL, "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
			return c, fmt.Errorf("create extension citus on port %d: %w", n.Port, err)
		}
	}
	stmts := []string{fmt.Sprintf("SELECT citus_set_coordinator_host('%s', %d)", c.Coordinator.Host, c.Coordinator.Port)}
	for _, w := range c.Workers {
		stmts = append(stmts, fmt.Sprintf("SELECT citus_add_node('%s', %d)", w.Host, w.Port))
	}
	if !opts.NoSchemaSharding {
		stmts = append(stmts, "ALTER DATABASE postgres SET citus.enable_schema_based_sharding = on")
	}
	for _, s := range stmts {
		if err := execOn(ctx, c.Coordinator.URL, s); err != nil {
			return c, fmt.Errorf("set up Citus coordinator: %s: %w", s, err)
		}
	}
	base.Logger.Info("throwaway Citus cluster started", "coordinator", c.Coordinator.Port, "workers", len(c.Workers))
	return c, nil
}

// Stop stops and removes every node. Calling it twice is harmless.
func (c *Citus) Stop(ctx context.Context) error {
	if c == nil {
		return nil
	}
	var errs []error
	for _, w := range c.Workers {
		errs = append(errs, w.Stop(ctx))
	}
	if c.Coordinator != nil {
		errs = append(errs, c.Coordinator.Stop(ctx))
	}
	return errors.Join(errs...)
}

// SchemaNode returns the port of the node that holds the distributed schema's tables,
// from the coordinator's citus_shards view: the node of its first shard. ok is false
// when the schema has no distributed tables yet.
func SchemaNode(ctx context.Context, coordinatorURL, schema string) (port int, ok bool, err error) {
	conn, err := pgx.Connect(ctx, coordinatorURL)
	if err != nil {
		return 0, false, fmt.Errorf("schema node of %s: %w", schema, err)
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `
SELECT s.nodeport FROM citus_shards s
JOIN pg_class c ON c.oid = s.table_name
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1
ORDER BY s.shardid LIMIT 1`, schema).Scan(&port)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("schema node of %s: %w", schema, err)
	}
	return port, true, nil
}

func execOn(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}
