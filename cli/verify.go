package cli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/verify"
)

func verifyCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "verify",
		Usage: "check fenceq's invariants; exit 1 on any violation",
		Description: "Checks: one invoice per (customer, period); exactly one outbox row per invoice and\n" +
			"per order; one order per idempotency key; one outbox row per dedupe key; no job running\n" +
			"on a lease expired longer than the reaper interval; no job or outbox row that nothing\n" +
			"will finish. Checks whose tables do not exist are reported as skipped.",
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
	rep, err := verify.Run(c.Context, pool, verify.Options{ReaperInterval: c.Duration("reaper"),
		RequireAllFinal: c.Bool("all-final"), IgnoreKinds: periodicKinds()})
	if err != nil {
		return err
	}
	if err := output(c, rep, func(w io.Writer) error { return printVerify(w, rep) }); err != nil {
		return err
	}
	if !rep.Passed {
		return silentError{fmt.Sprintf("verify: %d violation(s)", rep.Violations)}
	}
	return nil
}

func printVerify(w io.Writer, rep *verify.Report) error {
	rows := make([][]string, 0, len(rep.Checks))
	for _, ch := range rep.Checks {
		st, n := "OK", strconv.FormatInt(ch.Violations, 10)
		switch {
		case ch.Skipped != "":
			st, n = "SKIPPED", "-"
		case ch.Violations > 0:
			st = "FAIL"
		}
		rows = append(rows, []string{st, ch.Description, n})
	}
	if err := table(w, []string{"STATUS", "INVARIANT", "VIOLATIONS"}, rows); err != nil {
		return err
	}
	for _, ch := range rep.Checks {
		if ch.Skipped != "" {
			fmt.Fprintf(w, "\nskipped %s: %s\n", ch.Name, ch.Skipped)
		}
		if len(ch.Examples) > 0 {
			fmt.Fprintf(w, "\n%s:\n", ch.Name)
			for _, ex := range ch.Examples {
				fmt.Fprintf(w, "  %s\n", ex)
			}
		}
	}
	if rep.Passed {
		_, err := fmt.Fprintln(w, "\nverify: all invariants hold")
		return err
	}
	_, err := fmt.Fprintf(w, "\nverify: %d violation(s)\n", rep.Violations)
	return err
}
