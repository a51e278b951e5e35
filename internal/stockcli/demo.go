package stockcli

import (
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/demo"
)

func demoCommand() *ucli.Command {
	def := demo.DefaultScale()
	return &ucli.Command{
		Name:  "demo",
		Usage: "replay both incidents at a small scale, then verify that every outcome happened exactly once",
		Description: "Needs no setup. The database is --database-url / DATABASE_URL when given, else the local\n" +
			"server at 127.0.0.1:5432, else a throwaway PostgreSQL cluster started from this machine's\n" +
			"PostgreSQL binaries (initdb, pg_ctl) in a temporary directory and removed afterwards.\n" +
			"Everything happens in a fresh schema fenceq_demo_<random>, dropped at the end (--keep keeps it).\n\n" +
			"Billing: 8 workers invoice every customer, calling a simulated tax service whose slow\n" +
			"tail outlasts the (scaled-down) lease; one worker freezes past its lease mid-invoice.\n" +
			"Orders: clients retry the same idempotency keys every 300 ms against the real HTTP API\n" +
			"while first requests are still committing. Emails go through the outbox to a mail file.\n" +
			"Exit status 0 only when verify passes and the injected fault really fired.",
		Flags: []ucli.Flag{
			&ucli.IntFlag{Name: "customers", Value: def.Customers, Usage: "customers to invoice"},
			&ucli.IntFlag{Name: "workers", Value: def.Workers, Usage: "worker processes (in-process, each with its own pool)"},
			&ucli.IntFlag{Name: "order-keys", Value: def.OrderKeys, Usage: "idempotency keys of the order retry storm"},
			&ucli.DurationFlag{Name: "lease", Value: def.Lease, Usage: "the scaled-down lease"},
			&ucli.Uint64Flag{Name: "seed", Value: def.Seed, Usage: "seed of the simulated latencies"},
			&ucli.BoolFlag{Name: "keep", Usage: "keep the demo schema (and the mail and log files) for inspection"},
			&ucli.BoolFlag{Name: "verbose", Usage: "print the workers' logs (INFO and up) on stderr; by default only ERROR records"},
			&ucli.DurationFlag{Name: "timeout", Value: 3 * time.Minute, Usage: "give up after this long"},
			&ucli.StringFlag{Name: "pg-bin-dir", Usage: "where initdb and pg_ctl live, for the throwaway cluster (default: the newest /usr/lib/postgresql/*/bin, else PATH)"},
			&ucli.StringFlag{Name: "local-database-url", Value: DefaultDatabaseURL, Hidden: true,
				Usage: "the local server tried before a throwaway cluster (tests point it elsewhere)"},
			&ucli.StringFlag{Name: flagDatabaseURL, EnvVars: []string{"DATABASE_URL"},
				Usage: "PostgreSQL server to run on, in a schema of its own (default: the local server, else a throwaway cluster)"},
			jsonFlag(),
		},
		Action: demoAction,
	}
}

func demoAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[flags]"); err != nil {
		return err
	}
	cfg := demo.Config{
		Scale: demo.Scale{Customers: c.Int("customers"), Workers: c.Int("workers"), OrderKeys: c.Int("order-keys"),
			Lease: c.Duration("lease"), Seed: c.Uint64("seed")},
		DatabaseURL: dbURL(c), LocalDatabaseURL: c.String("local-database-url"), PGBinDir: c.String("pg-bin-dir"),
		Keep: c.Bool("keep"), Verbose: c.Bool("verbose"), Timeout: c.Duration("timeout"), Stderr: stderr(c),
	}
	if err := cfg.Validate(); err != nil {
		return usageError{Err: err}
	}
	rep, err := demo.Run(c.Context, cfg)
	if err != nil {
		return err
	}
	if err := output(c, rep, rep.WriteText); err != nil {
		return err
	}
	if msg := rep.Failure(); msg != "" {
		return silentError{Msg: msg}
	}
	return nil
}
