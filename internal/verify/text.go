package verify

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

// WriteText writes the report for a human: one row per check (OK, FAIL or SKIPPED),
// why checks were skipped, the examples of each violation, and the verdict.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tINVARIANT\tVIOLATIONS")
	for _, ch := range r.Checks {
		st, n := "OK", strconv.FormatInt(ch.Violations, 10)
		switch {
		case ch.Skipped != "":
			st, n = "SKIPPED", "-"
		case ch.Violations > 0:
			st = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", st, ch.Description, n)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, ch := range r.Checks {
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
	if r.Passed {
		_, err := fmt.Fprintln(w, "\nverify: all invariants hold")
		return err
	}
	_, err := fmt.Fprintf(w, "\nverify: %d violation(s)\n", r.Violations)
	return err
}
