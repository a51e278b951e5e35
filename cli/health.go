package cli

import (
	"fmt"
	"io"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/health"
)

func healthCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "health",
		Usage: "check the alert conditions; exit 1 when any holds",
		Description: "Alerts: a lease expired while its holder lived, or a stale write was rejected, in\n" +
			"the last --window; the oldest pending outbox row is older than --max-outbox-age; the\n" +
			"oldest open transaction is older than --max-xact-age; a periodic schedule's next slot has\n" +
			"been due longer than --max-periodic-lag.",
		Flags:  healthFlags(),
		Action: healthAction,
	}
}

// healthFlags are the bounds of the alert conditions, shared by health and ui.
func healthFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.DurationFlag{Name: "window", Value: health.DefaultWindow, Usage: "look back this far for lease events"},
		&ucli.DurationFlag{Name: "max-outbox-age", Value: health.DefaultMaxOutboxAge, Usage: "alert when the oldest pending outbox row is older"},
		&ucli.DurationFlag{Name: "max-xact-age", Value: health.DefaultMaxTransactionAge, Usage: "alert when a transaction has been open longer"},
		&ucli.DurationFlag{Name: "max-periodic-lag", Value: health.DefaultMaxPeriodicLag, Usage: "alert when a periodic schedule's next slot has been due longer"},
	}
}

// positiveDurations returns a usage error for the first of the duration flags that is
// not positive.
func positiveDurations(c *ucli.Context, flags ...string) error {
	for _, f := range flags {
		if c.Duration(f) <= 0 {
			return usageError{Err: fmt.Errorf("invalid --%s %s: must be positive", f, c.Duration(f))}
		}
	}
	return nil
}

// healthThresholds reads the health command's bounds, which `fenceq ui` shares.
func healthThresholds(c *ucli.Context) (health.Thresholds, error) {
	if err := positiveDurations(c, "window", "max-outbox-age", "max-xact-age", "max-periodic-lag"); err != nil {
		return health.Thresholds{}, err
	}
	return health.Thresholds{Window: c.Duration("window"), MaxOutboxAge: c.Duration("max-outbox-age"),
		MaxTransactionAge: c.Duration("max-xact-age"), MaxPeriodicLag: c.Duration("max-periodic-lag")}, nil
}

func healthAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	th, err := healthThresholds(c)
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := health.Check(c.Context, pool, th)
	if err != nil {
		return err
	}
	conds := rep.Conditions
	err = output(c, rep, func(w io.Writer) error {
		rows := make([][]string, 0, len(conds))
		for _, cd := range conds {
			st := "OK"
			if cd.Alert {
				st = "ALERT"
			}
			rows = append(rows, []string{st, cd.Name, cd.Value, cd.Bound})
		}
		return table(w, []string{"STATUS", "CONDITION", "VALUE", "BOUND"}, rows)
	})
	if err != nil {
		return err
	}
	if !rep.Healthy {
		return silentError{Msg: fmt.Sprintf("health: %d alert condition(s) hold", rep.Alerts)}
	}
	return nil
}
