package cli

import (
	"fmt"
	"io"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/verify"
)

func verifyCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "verify",
		Usage: "check fenceq's invariants; exit 1 on any violation",
		Description: "Checks: one outbox row per dedupe key; no job running on a lease expired longer\n" +
			"than the reaper interval; no job or outbox row that nothing will finish. When the binary\n" +
			"knows the built-in invoice and order sets: one invoice per (customer, period), one order\n" +
			"per idempotency key, exactly one outbox row per invoice and per order; a set that is not\n" +
			"installed has its checks reported as skipped.",
		Flags: []ucli.Flag{
			&ucli.DurationFlag{Name: "reaper", Value: 5 * time.Second, Usage: "the workers' reaper interval"},
			&ucli.BoolFlag{Name: "all-final", Usage: "also demand that every job finished (after a run that drained its queues)"},
		},
		Action: verifyAction,
	}
}

func verifyAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	pool, err := openPool(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	e := envOf(c)
	rep, err := verify.Run(c.Context, pool, verify.Options{ReaperInterval: c.Duration("reaper"),
		RequireAllFinal: c.Bool("all-final"), IgnoreKinds: e.opts.RecurringKinds, Sets: e.setNames()})
	if err != nil {
		return err
	}
	if err := output(c, rep, func(w io.Writer) error { return rep.WriteText(w) }); err != nil {
		return err
	}
	if !rep.Passed {
		return silentError{Msg: fmt.Sprintf("verify: %d violation(s)", rep.Violations)}
	}
	return nil
}
