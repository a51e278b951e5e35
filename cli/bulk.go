package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// filterFlags are the flags of a job search (queue.JobFilter), shared by `jobs list` and
// the bulk forms of `jobs retry|cancel|requeue|delete`.
func filterFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "state", Usage: "only this state: " + stateNames()},
		&ucli.StringFlag{Name: "queue", Usage: "only this queue"},
		&ucli.StringFlag{Name: "kind", Usage: "only this kind"},
		&ucli.StringFlag{Name: "tag", Usage: "only jobs with this tag"},
		&ucli.StringFlag{Name: "args", Usage: `only jobs whose args contain this JSON object, e.g. '{"customer": 42}'`},
		&ucli.StringFlag{Name: "metadata", Usage: "only jobs whose metadata contain this JSON object"},
		&ucli.StringFlag{Name: "error", Usage: "only jobs whose last error holds every one of these words"},
		&ucli.StringFlag{Name: "created-after", Usage: "only jobs enqueued at or after this time (RFC 3339, e.g. 2026-01-31T14:00:00Z)"},
		&ucli.StringFlag{Name: "created-before", Usage: "only jobs enqueued before this time (RFC 3339)"},
		&ucli.BoolFlag{Name: "unknown-kinds", Usage: "only waiting jobs that no live worker of their queue has a handler for"},
		&ucli.DurationFlag{Name: "live-within", Value: queue.DefaultLiveWithin,
			Usage: "with --unknown-kinds: a worker is live if it heartbeated within this"},
	}
}

// parseFilter reads the filter flags. A bad value is a usage error naming its flag.
func parseFilter(c *ucli.Context) (queue.JobFilter, error) {
	f := queue.JobFilter{State: queue.State(c.String("state")), Queue: c.String("queue"), Kind: c.String("kind"),
		Tag: c.String("tag"), Error: c.String("error"), UnknownKinds: c.Bool("unknown-kinds"),
		LiveWithin: c.Duration("live-within")}
	if s := c.String("args"); s != "" {
		f.Args = json.RawMessage(s)
	}
	if s := c.String("metadata"); s != "" {
		f.Metadata = json.RawMessage(s)
	}
	for _, tf := range []struct {
		flag string
		to   *time.Time
	}{{"created-after", &f.CreatedAfter}, {"created-before", &f.CreatedBefore}} {
		if s := c.String(tf.flag); s != "" {
			t, err := time.Parse(time.RFC3339, s)
			if err != nil {
				return f, usageError{Err: fmt.Errorf("invalid --%s %q: want an RFC 3339 time such as 2026-01-31T14:00:00Z", tf.flag, s)}
			}
			*tf.to = t
		}
	}
	if err := positiveDurations(c, "live-within"); err != nil {
		return f, err
	}
	if err := f.Validate(); err != nil {
		return f, usageError{Err: flagError(err)}
	}
	return f, nil
}

// flagError names the flag of a filter's validation error: "invalid --args: …".
func flagError(err error) error {
	var ve *queue.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	flag := map[string]string{"created_before": "created-before", "live_within": "live-within"}[ve.Field]
	if flag == "" {
		flag = ve.Field
	}
	return fmt.Errorf("invalid --%s: %s", flag, ve.Reason)
}

var pastTense = map[string]string{"retry": "retried", "cancel": "cancelled", "requeue": "requeued", "delete": "deleted"}

type bulkFunc func(ctx context.Context, db queue.Beginner, f queue.JobFilter, o *fenceq.BulkOptions) (*fenceq.BulkResult, error)

// bulkCommand is `jobs OP ID` on one job, or `jobs OP [filter flags] [--yes]` on every
// job the filter matches.
func bulkCommand(op, usage string, one adminFunc, many bulkFunc) *ucli.Command {
	return &ucli.Command{
		Name:      op,
		Usage:     usage + "; with filter flags instead of an ID, on every job they match (after confirmation)",
		UsageText: fmt.Sprintf("fenceq jobs %s ID\n   fenceq jobs %s [filter flags] [--yes] [--batch-size N]", op, op),
		Flags: append(filterFlags(),
			&ucli.BoolFlag{Name: "yes", Usage: "act on every matching job without asking (needed when stdin is not a terminal)"},
			&ucli.IntFlag{Name: "batch-size", Value: fenceq.DefaultBulkBatchSize,
				Usage: fmt.Sprintf("jobs per transaction, 1–%d", fenceq.MaxBulkBatchSize)}),
		Action: func(c *ucli.Context) error {
			if c.Args().Len() > 0 {
				for _, fl := range filterFlags() {
					if c.IsSet(fl.Names()[0]) {
						return usageError{Err: fmt.Errorf("give a job ID or filter flags, not both (--%s)", fl.Names()[0])}
					}
				}
				return jobsAdmin(op, one)(c)
			}
			return jobsBulk(c, op, many)
		},
	}
}

func jobsBulk(c *ucli.Context, op string, many bulkFunc) error {
	f, err := parseFilter(c)
	if err != nil {
		return err
	}
	if f.Empty() {
		return usageError{Err: fmt.Errorf("jobs %s needs a job ID or at least one filter flag (--state, --queue, --kind, ...)", op)}
	}
	bs := c.Int("batch-size")
	if bs < 1 || bs > fenceq.MaxBulkBatchSize {
		return usageError{Err: fmt.Errorf("invalid --batch-size %d: want 1–%d", bs, fenceq.MaxBulkBatchSize)}
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, upTo, err := fenceq.CountMatching(c.Context, pool, f, 0, 0)
	if err != nil {
		return err
	}
	errw := c.App.ErrWriter
	if errw == nil {
		errw = os.Stderr
	}
	if n == 0 {
		fmt.Fprintf(errw, "no job matches: nothing to %s\n", op)
	} else if !c.Bool("yes") {
		in := c.App.Reader
		if in == nil {
			in = os.Stdin
		}
		if !isTerminal(in) {
			return usageError{Err: fmt.Errorf("%d jobs match; refusing to %s them without confirmation: "+
				"stdin is not a terminal, pass --yes to act without asking", n, op)}
		}
		fmt.Fprintf(errw, "%d jobs match (ids up to %d). Type yes to %s them: ", n, upTo, op)
		line, _ := bufio.NewReader(in).ReadString('\n')
		if strings.TrimSpace(line) != "yes" {
			return silentError{Msg: "not confirmed: nothing changed"}
		}
	}
	res, err := many(c.Context, pool, f, &fenceq.BulkOptions{BatchSize: bs, UpToID: upTo,
		Detail: "confirmed " + strconv.Itoa(n) + " jobs"})
	if res == nil {
		res = &fenceq.BulkResult{Changed: []int64{}}
	}
	if err != nil {
		return fmt.Errorf("%w (before it: %d jobs %s in %d batches)", err, len(res.Changed), pastTense[op], res.Batches)
	}
	return output(c, res, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "%d jobs %s, %d skipped (the action does not apply to their state, or they no longer matched), of %d matching\n",
			len(res.Changed), pastTense[op], res.Skipped, res.Matched)
		return err
	})
}
