package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/queue"
)

func enqueueCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "enqueue",
		Usage:     "enqueue one job of a built-in kind",
		ArgsUsage: "KIND",
		Description: "KIND is one of the built-in kinds (see `fenceq worker --help`). Examples:\n" +
			"  fenceq enqueue noop\n" +
			"  fenceq enqueue sleep --args '{\"duration\": \"30s\"}' --in 1m",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "args", Value: "{}", Usage: "job arguments as a JSON object"},
			&ucli.StringFlag{Name: "queue", Usage: "queue (default: the kind's queue)"},
			&ucli.IntFlag{Name: "priority", Value: queue.DefaultPriority, Usage: "priority 0–100, lower runs first"},
			&ucli.StringFlag{Name: "run-at", Usage: "run at this time (RFC 3339, e.g. 2026-01-31T09:00:00Z)"},
			&ucli.DurationFlag{Name: "in", Usage: "run this long from now, by the database's clock (e.g. 30s, 5m)"},
			&ucli.StringFlag{Name: "unique-key", Usage: "while a job with this key is unfinished, return it instead of a new one"},
			&ucli.StringSliceFlag{Name: "tag", Usage: "label the job with `TAG` (repeat for several; find it with: fenceq jobs list --tag TAG)"},
			&ucli.IntFlag{Name: "max-attempts", Value: queue.DefaultMaxAttempts, Usage: "attempts before the job is discarded"},
			&ucli.BoolFlag{Name: "allow-unknown-kind", Usage: "accept a kind no built-in handler runs (for your own workers)"},
		},
		Action: enqueue,
	}
}

type enqueueResult struct {
	Job      *queue.JobRow `json:"job"`
	Existing bool          `json:"existing"`
}

func enqueue(c *ucli.Context) error {
	if err := needArgs(c, 1, 1, "KIND [--args JSON] [flags]"); err != nil {
		return err
	}
	kind := c.Args().First()
	k, known := builtin.LookupKind(kind)
	// Every mistake in the command line is a usage error (exit 2), found before any
	// connection is made.
	if !known && !c.Bool("allow-unknown-kind") {
		return usageError{fmt.Errorf("unknown kind %q: built-in kinds are %s (or pass --allow-unknown-kind)",
			kind, strings.Join(builtin.KindNames(), ", "))}
	}
	raw := []byte(c.String("args"))
	if err := queue.ValidateArgs(raw, 0); err != nil {
		return usageError{fmt.Errorf("--args: %w", err)}
	}
	if known {
		if err := k.ValidateArgs(raw); err != nil {
			return usageError{fmt.Errorf("invalid args for kind %s: %w", kind, err)}
		}
	}
	args := fenceq.RawArgs{KindName: kind, JSON: raw}
	opts := &fenceq.InsertOpts{Queue: c.String("queue"), Priority: new(c.Int("priority")),
		MaxAttempts: c.Int("max-attempts"), UniqueKey: c.String("unique-key"), RunIn: c.Duration("in"),
		Tags: c.StringSlice("tag")}
	if opts.Queue == "" {
		opts.Queue = queue.DefaultQueue
		if known {
			opts.Queue = k.Queue
		}
	}
	if s := c.String("run-at"); s != "" {
		if c.IsSet("in") {
			return usageError{errors.New("give either --run-at or --in, not both")}
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return usageError{fmt.Errorf("invalid --run-at %q: want RFC 3339 such as 2026-01-31T09:00:00Z", s)}
		}
		opts.RunAt = t
	}
	if d := c.Duration("in"); d < 0 {
		return usageError{fmt.Errorf("invalid --in %s: must not be negative", d)}
	}
	if c.Int("max-attempts") < 1 {
		return usageError{fmt.Errorf("invalid --max-attempts %d: must be at least 1", c.Int("max-attempts"))}
	}
	if err := fenceq.ValidateEnqueue(args, opts); err != nil { // queue, priority, unique key, tags
		return usageError{err}
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := fenceq.Enqueue(c.Context, pool, args, opts)
	if err != nil {
		return err
	}
	out := enqueueResult{Job: res.Job, Existing: res.Existing}
	return output(c, out, func(w io.Writer) error {
		j := res.Job
		if res.Existing {
			_, err := fmt.Fprintf(w, "job %d with unique key %q already exists (%s, queue %s): %s\n",
				j.ID, opts.UniqueKey, j.Kind, j.Queue, j.State)
			return err
		}
		_, err := fmt.Fprintf(w, "enqueued job %d (%s, queue %s): %s, runs at %s\n",
			j.ID, j.Kind, j.Queue, j.State, fmtTime(&j.RunAt))
		return err
	})
}
