package cli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/queue"
)

func healthCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "health",
		Usage: "check the alert conditions; exit 1 when any holds",
		Description: "Alerts: a lease expired while its holder lived, or a stale write was rejected, in\n" +
			"the last --window; the oldest pending outbox row is older than --max-outbox-age; the\n" +
			"oldest open transaction is older than --max-xact-age.",
		Flags: []ucli.Flag{
			&ucli.DurationFlag{Name: "window", Value: 5 * time.Minute, Usage: "look back this far for lease events"},
			&ucli.DurationFlag{Name: "max-outbox-age", Value: 5 * time.Minute, Usage: "alert when the oldest pending outbox row is older"},
			&ucli.DurationFlag{Name: "max-xact-age", Value: 5 * time.Minute, Usage: "alert when a transaction has been open longer"},
		},
		Action: health,
	}
}

// Condition is one alert condition and whether it holds.
type Condition struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Bound string `json:"bound"`
	Alert bool   `json:"alert"`
}

type healthReport struct {
	Conditions []Condition `json:"conditions"`
	Alerts     int         `json:"alerts"`
	Healthy    bool        `json:"healthy"`
}

// positiveDurations returns a usage error for the first of the duration flags that is
// not positive.
func positiveDurations(c *ucli.Context, flags ...string) error {
	for _, f := range flags {
		if c.Duration(f) <= 0 {
			return usageError{fmt.Errorf("invalid --%s %s: must be positive", f, c.Duration(f))}
		}
	}
	return nil
}

func health(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	if err := positiveDurations(c, "window", "max-outbox-age", "max-xact-age"); err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	window := c.Duration("window")
	events, err := queue.CountLeaseEvents(c.Context, pool, window)
	if err != nil {
		return err
	}
	snap, err := fenceqprom.TakeSnapshot(c.Context, pool)
	if err != nil {
		return err
	}
	within := "0 in the last " + fmtAge(window)
	maxOutbox, maxXact := c.Duration("max-outbox-age"), c.Duration("max-xact-age")
	conds := []Condition{
		{Name: "leases expired while the holder lived", Value: strconv.FormatInt(events[queue.EventExpiredHolderAlive], 10),
			Bound: within, Alert: events[queue.EventExpiredHolderAlive] > 0},
		{Name: "stale writes rejected", Value: strconv.FormatInt(events[queue.EventStaleWriteRejected], 10),
			Bound: within, Alert: events[queue.EventStaleWriteRejected] > 0},
	}
	if snap.OutboxPresent {
		conds = append(conds, Condition{Name: "oldest pending outbox row",
			Value: fmt.Sprintf("%s (%d pending)", fmtAge(snap.OutboxOldestPendingAge), snap.OutboxPending),
			Bound: "≤ " + fmtAge(maxOutbox), Alert: snap.OutboxOldestPendingAge > maxOutbox})
	}
	conds = append(conds, Condition{Name: "oldest open transaction", Value: fmtAge(snap.OldestTransactionAge),
		Bound: "≤ " + fmtAge(maxXact), Alert: snap.OldestTransactionAge > maxXact})
	rep := healthReport{Conditions: conds, Healthy: true}
	for _, cd := range conds {
		if cd.Alert {
			rep.Alerts++
			rep.Healthy = false
		}
	}
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
		return silentError{fmt.Sprintf("health: %d alert condition(s) hold", rep.Alerts)}
	}
	return nil
}
