package stockcli

import (
	"fmt"
	"io"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/invoice"
)

func billingCommand() *ucli.Command {
	periodFlag := func() ucli.Flag {
		return &ucli.StringFlag{Name: "period", Usage: "billing period YYYY-MM (default: last month)"}
	}
	return &ucli.Command{
		Name:  "billing",
		Usage: "run billing: one invoice job per customer and period",
		Subcommands: []*ucli.Command{
			{
				Name: "run",
				Usage: "enqueue one invoice job per customer for --period; idempotent: customers already " +
					"invoiced or with an unfinished or completed job are skipped",
				Flags:  []ucli.Flag{periodFlag()},
				Action: billingRun,
			},
			{
				Name:   "seed",
				Usage:  "create demo customers with usage for --period",
				Flags:  []ucli.Flag{periodFlag(), &ucli.IntFlag{Name: "customers", Value: 50, Usage: "how many customers"}},
				Action: billingSeed,
			},
		},
	}
}

func period(c *ucli.Context) (string, error) {
	p := c.String("period")
	if p == "" {
		p = invoice.PreviousPeriod(time.Now())
	}
	if err := invoice.ValidatePeriod(p); err != nil {
		return "", usageError{Err: fmt.Errorf("--period: %w", err)}
	}
	return p, nil
}

type billingResult struct {
	Period    string `json:"period"`
	Enqueued  int64  `json:"enqueued,omitempty"`
	Customers int    `json:"customers,omitempty"`
}

func billingRun(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--period YYYY-MM]"); err != nil {
		return err
	}
	p, err := period(c)
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 4, builtin.Migrations()...)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := invoice.RunBilling(c.Context, pool, p)
	if err != nil {
		return err
	}
	return output(c, billingResult{Period: p, Enqueued: n}, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "billing run for %s: %d invoice jobs enqueued on queue %s (customers already invoiced or in progress skipped)\n",
			p, n, invoice.Queue)
		return err
	})
}

func billingSeed(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--customers N] [--period YYYY-MM]"); err != nil {
		return err
	}
	p, err := period(c)
	if err != nil {
		return err
	}
	n := c.Int("customers")
	if n < 1 || n > 1_000_000 {
		return usageError{Err: fmt.Errorf("invalid --customers %d: want 1 to 1000000", n)}
	}
	pool, err := openSchema(c, 4, builtin.Migrations()...)
	if err != nil {
		return err
	}
	defer pool.Close()
	ids, err := invoice.SeedCustomers(c.Context, pool, n, p)
	if err != nil {
		return err
	}
	return output(c, billingResult{Period: p, Customers: len(ids)}, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "seeded %d customers with usage for %s\n", len(ids), p)
		return err
	})
}
