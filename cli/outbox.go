package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

func outboxCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "outbox",
		Usage: "list outbox rows (emails and other external effects) or retry a failed one",
		Subcommands: []*ucli.Command{
			{
				Name:  "list",
				Usage: "list the newest outbox rows",
				Flags: []ucli.Flag{
					&ucli.StringFlag{Name: "state", Usage: "only this state: " + outboxStateNames()},
					&ucli.StringFlag{Name: "topic", Usage: "only this topic, e.g. email"},
					&ucli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many rows"},
				},
				Action: outboxList,
			},
			{
				Name:      "retry",
				Usage:     "make a failed (or orphaned pending) row pending again with a new delivery job; it keeps its dedupe key",
				ArgsUsage: "ID",
				Action:    outboxRetry,
			},
		},
	}
}

func outboxStateNames() string {
	s := make([]string, len(outbox.States()))
	for i, st := range outbox.States() {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func outboxList(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--state S] [--topic T] [--limit N]"); err != nil {
		return err
	}
	st := outbox.State(c.String("state"))
	if st != "" && !st.Valid() {
		return usageError{Err: fmt.Errorf("invalid --state %q: want one of %s", st, outboxStateNames())}
	}
	limit, err := listLimit(c)
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	rows, err := outbox.List(c.Context, pool, outbox.ListParams{State: st, Topic: c.String("topic"),
		Limit: limit})
	if err != nil {
		return err
	}
	if rows == nil {
		rows = []*outbox.Row{}
	}
	return output(c, rows, func(w io.Writer) error {
		if len(rows) == 0 {
			_, err := fmt.Fprintln(w, "no outbox rows")
			return err
		}
		out := make([][]string, 0, len(rows))
		for _, o := range rows {
			job := "-"
			if o.DeliveryJobID != nil {
				job = fmt.Sprintf("%d (%s)", *o.DeliveryJobID, orDash(string(o.DeliveryJobState)))
			}
			created := o.CreatedAt
			out = append(out, []string{strconv.FormatInt(o.ID, 10), o.Topic, o.DedupeKey, string(o.State),
				strconv.Itoa(o.Attempt), fmtTime(&created), fmtTime(o.DeliveredAt), job, truncate(fmtStr(o.LastError), 50)})
		}
		return table(w, []string{"ID", "TOPIC", "DEDUPE_KEY", "STATE", "ATTEMPTS", "CREATED", "DELIVERED", "DELIVERY_JOB", "LAST_ERROR"}, out)
	})
}

func outboxRetry(c *ucli.Context) error {
	id, err := parseID(c, "outbox row id")
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	o, err := outbox.Retry(c.Context, pool, id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return fmt.Errorf("outbox row %d not found", id)
	case errors.Is(err, queue.ErrWrongState):
		return fmt.Errorf("cannot retry outbox row %d: %s; only failed or orphaned rows can be retried", id, wrongStateDetail(err))
	case err != nil:
		return err
	}
	return output(c, o, func(w io.Writer) error {
		job := int64(0)
		if o.DeliveryJobID != nil {
			job = *o.DeliveryJobID
		}
		_, err := fmt.Fprintf(w, "outbox row %d (%s) is pending again: delivery job %d enqueued\n", o.ID, o.DedupeKey, job)
		return err
	})
}
