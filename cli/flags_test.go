package cli_test

import (
	"io"
	"slices"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/internal/stockcli"
)

// commandFlags are the flags of every command (--help aside). Each command takes only
// flags it reads: a flag added to a command goes here once its action reads it, and a
// flag a command stops reading leaves both.
var commandFlags = map[string][]string{
	"migrate":        {},
	"migrate up":     {"set", "database-url", "json"},
	"migrate down":   {"set", "all", "database-url", "json"},
	"migrate status": {"set", "database-url", "json"},
	"worker": {"queues", "concurrency", "lease", "heartbeat", "reaper", "poll", "metrics-addr", "shutdown-timeout",
		"id", "max-conns", "retention", "no-listen", "no-periodic", "no-counters", "periodic-interval", "periodic-grace",
		"ui-addr", "ui-read-only", "ui-auth-basic", "ui-auth-token", "ui-refresh", "ui-allowed-hosts", "ui-trust-proxy",
		"ui-tls-cert", "ui-tls-key", "order-key-ttl", "mailer", "tax-latency", "tax-tail-probability",
		"tax-tail", "tax-error-rate", "housekeeping-interval", "http", "http-secret", "http-timeout", "http-retry-4xx", "http-config",
		"log-level", "log-format", "database-url"},
	"enqueue": {"args", "queue", "priority", "run-at", "in", "unique-key", "tag", "max-attempts", "flow-limit",
		"flow-partition", "debounce-key", "debounce-window", "debounce-max-wait", "allow-unknown-kind", "database-url", "json"},
	"jobs":              {},
	"jobs list":         {"state", "queue", "kind", "tag", "args", "metadata", "error", "created-after", "created-before", "unknown-kinds", "live-within", "limit", "before", "database-url", "json"},
	"jobs show":         {"database-url", "json"},
	"jobs signal":       {"payload", "database-url", "json"},
	"workflows":         {},
	"workflows list":    {"kind", "limit", "database-url", "json"},
	"workflows show":    {"database-url", "json"},
	"workflows enqueue": {"file", "allow-unknown-kind", "database-url", "json"},
	"jobs retry":        {"state", "queue", "kind", "tag", "args", "metadata", "error", "created-after", "created-before", "unknown-kinds", "live-within", "yes", "batch-size", "database-url", "json"},
	"jobs cancel":       {"state", "queue", "kind", "tag", "args", "metadata", "error", "created-after", "created-before", "unknown-kinds", "live-within", "yes", "batch-size", "database-url", "json"},
	"jobs delete":       {"state", "queue", "kind", "tag", "args", "metadata", "error", "created-after", "created-before", "unknown-kinds", "live-within", "yes", "batch-size", "database-url", "json"},
	"jobs requeue":      {"state", "queue", "kind", "tag", "args", "metadata", "error", "created-after", "created-before", "unknown-kinds", "live-within", "yes", "batch-size", "database-url", "json"},
	"queues":            {},
	"queues list":       {"database-url", "json"},
	"queues pause":      {"database-url", "json"},
	"queues resume":     {"database-url", "json"},
	"queues limit":      {"database-url", "json"},
	"periodic":          {},
	"periodic list":     {"database-url", "json"},
	"periodic add": {"schedule", "kind", "args", "queue", "timezone", "missed", "run-on-start", "no-overlap",
		"unique-key", "tag", "metadata", "priority", "max-attempts", "allow-unknown-kind", "database-url", "json"},
	"periodic show":    {"database-url", "json"},
	"periodic remove":  {"database-url", "json"},
	"periodic pause":   {"database-url", "json"},
	"periodic resume":  {"database-url", "json"},
	"periodic trigger": {"database-url", "json"},
	"flow":             {},
	"flow set":         {"max-running", "rate", "per", "sequence", "hold-on-discard", "database-url", "json"},
	"flow list":        {"database-url", "json"},
	"flow show":        {"limit", "database-url", "json"},
	"flow delete":      {"database-url", "json"},
	"workers":          {"database-url", "json"},
	"outbox":           {},
	"outbox list":      {"state", "topic", "limit", "database-url", "json"},
	"outbox retry":     {"database-url", "json"},
	"billing":          {},
	"billing run":      {"period", "database-url", "json"},
	"billing seed":     {"period", "customers", "database-url", "json"},
	// serve only serves the orders API: no mailer, tax service or housekeeping, and no
	// report to print.
	"serve":  {"addr", "max-conns", "shutdown-timeout", "order-key-ttl", "log-level", "log-format", "database-url"},
	"stats":  {"window", "database-url", "json"},
	"verify": {"reaper", "all-final", "database-url", "json"},
	"health": {"window", "max-outbox-age", "max-xact-age", "max-periodic-lag", "database-url", "json"},
	"ui": {"addr", "read-only", "auth-basic", "auth-token", "refresh", "allowed-hosts", "trust-proxy", "tls-cert", "tls-key", "window", "max-outbox-age", "max-xact-age", "max-periodic-lag",
		"max-conns", "shutdown-timeout", "log-level", "log-format", "database-url"},
	"demo": {"customers", "workers", "order-keys", "lease", "seed", "keep", "verbose", "timeout", "pg-bin-dir",
		"local-database-url", "database-url", "json"},
	"bench": {"jobs", "duration", "rate", "workers", "conns", "processes", "runs", "vs", "retained", "idle-xact", "no-ceiling",
		"no-checkpoint", "ceiling-claimers", "claim-batch", "queues", "split-workers", "compare-flow", "compare-queues", "args-bytes", "commit-writes", "no-search-indexes",
		"job-sleep", "layouts", "rows", "requests", "trace-sql", "cpuprofile", "memprofile", "quiet", "verbose", "database-url", "json"},
	"chaos": {"duration", "seed", "workers", "faults", "naive", "own-cluster", "hosts", "failover", "async", "replica-lag", "lease", "concurrency", "settle",
		"wave-every", "customers", "order-keys", "sleep-jobs", "workload", "flow-jobs", "worker-database-url", "no-listen", "log-dir",
		"keep-schema", "fault-log", "database-url", "json", "log-level", "log-format"},
	// The naive baseline's worker parses its own arguments (chaos.ParseNaiveFlags).
	"chaos naive-worker": {},
	"version":            {"json"},
}

func TestCommandFlags(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	var walk func(prefix string, cmds []*ucli.Command)
	walk = func(prefix string, cmds []*ucli.Command) {
		for _, c := range cmds {
			name := strings.TrimSpace(prefix + " " + c.Name)
			seen[name] = true
			var got []string
			for _, f := range c.Flags {
				if n := f.Names()[0]; n != "help" {
					got = append(got, n)
				}
			}
			want, ok := commandFlags[name]
			switch {
			case !ok:
				t.Errorf("fenceq %s is not in commandFlags: add it with the flags %q", name, got)
			case !slices.Equal(got, want) && (len(got) > 0 || len(want) > 0):
				t.Errorf("fenceq %s takes the flags\n  %q\nwant\n  %q", name, got, want)
			}
			walk(name, c.Subcommands)
		}
	}
	walk("", stockcli.New(io.Discard, io.Discard).Commands)
	for name := range commandFlags {
		if !seen[name] {
			t.Errorf("commandFlags lists fenceq %s, which does not exist", name)
		}
	}
}

// A flag another command takes is a usage error where it does nothing, found before
// any connection is made.
func TestFlagsThatDoNothingAreUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"serve", "--tax-latency", "1s"},
		{"serve", "--mailer", "file:-"},
		{"serve", "--housekeeping-interval", "1m"},
		{"serve", "--json"},
		{"worker", "--json"},
		{"demo", "--log-level", "debug"},
	} {
		r := runCLI(t.Context(), append(args, "--database-url", "postgres://u@127.0.0.1:1/x")...)
		oneErrorLine(t, r, "flag provided but not defined: -"+strings.TrimPrefix(args[1], "--"))
		if r.code != cli.ExitUsage {
			t.Errorf("fenceq %s: exit %d, want %d", strings.Join(args, " "), r.code, cli.ExitUsage)
		}
	}
	// The demo's --database-url has no default: without it, the demo picks a server.
	r := runCLI(t.Context(), "demo", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "(default: the local server, else a throwaway cluster)") ||
		strings.Contains(r.stdout, "5432/postgres") {
		t.Errorf("demo --help:\n%s", r.stdout)
	}
}
