package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func enqueueCommand(e *env) *ucli.Command {
	return &ucli.Command{
		Name:      "enqueue",
		Usage:     "enqueue one job",
		ArgsUsage: "KIND",
		Description: "KIND is a kind this binary knows (" + listOrNone(e.kindNames()) + ")\n" +
			"or one that a live worker registers (see `" + e.opts.Name + " workers list`). Example:\n" +
			"  " + e.opts.Name + " enqueue KIND --args '{\"key\": \"value\"}' --in 1m\n" +
			"With --debounce-key K --debounce-window D, a job of KIND with key K that has not started\n" +
			"yet takes these args and runs D from now instead of a second job being added; a job\n" +
			"that has started is left alone and a new one waits D.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "args", Value: "{}", Usage: "job arguments as a JSON object"},
			&ucli.StringFlag{Name: "queue", Usage: "queue (default: the kind's queue)"},
			&ucli.IntFlag{Name: "priority", Value: queue.DefaultPriority, Usage: "priority 0–100, lower runs first"},
			&ucli.StringFlag{Name: "run-at", Usage: "run at this time (RFC 3339, e.g. 2026-01-31T09:00:00Z)"},
			&ucli.DurationFlag{Name: "in", Usage: "run this long from now, by the database's clock (e.g. 30s, 5m)"},
			&ucli.StringFlag{Name: "unique-key", Usage: "while a job with this key is unfinished, return it instead of a new one"},
			&ucli.StringSliceFlag{Name: "tag", Usage: "label the job with `TAG` (repeat for several; find it with: fenceq jobs list --tag TAG)"},
			&ucli.IntFlag{Name: "max-attempts", Value: queue.DefaultMaxAttempts, Usage: "attempts before the job is discarded"},
			&ucli.StringFlag{Name: "flow-limit", Usage: "run the job under the flow limit `NAME` (see: fenceq flow list)"},
			&ucli.StringFlag{Name: "flow-partition", Usage: "the job's `PARTITION` of --flow-limit, e.g. a customer id (default: the whole limit)"},
			&ucli.StringFlag{Name: "debounce-key", Usage: "replace the waiting job of this kind with this `KEY` that has not started (or insert one); needs --debounce-window"},
			&ucli.DurationFlag{Name: "debounce-window", Usage: "with --debounce-key: the job runs this long after the latest enqueue (e.g. 30s)"},
			&ucli.DurationFlag{Name: "debounce-max-wait", Usage: "with --debounce-key: the job runs at the latest this long after the enqueue that created it, however often it is replaced (at least the window)"},
			&ucli.BoolFlag{Name: "allow-unknown-kind", Usage: "accept a kind neither this binary nor a live worker knows"},
		},
		Action: enqueue,
	}
}

type enqueueResult struct {
	Job      *queue.JobRow `json:"job"`
	Existing bool          `json:"existing"`
	// Debounced: the waiting job with the debounce key took these args (Job is it).
	Debounced bool `json:"debounced"`
}

// debounceFlag names the flag of a debounce field of a validation error.
var debounceFlag = map[string]string{"debounce": "--debounce-key", "debounce.key": "--debounce-key",
	"debounce.window": "--debounce-window", "debounce.max_wait": "--debounce-max-wait"}

func enqueue(c *ucli.Context) error {
	if err := needArgs(c, 1, 1, "KIND [--args JSON] [flags]"); err != nil {
		return err
	}
	e := envOf(c)
	kind := c.Args().First()
	if err := queue.ValidateKind(kind); err != nil {
		return usageError{Err: err}
	}
	k, known := e.lookupKind(kind)
	// Every mistake in the command line is a usage error (exit 2), found before any
	// connection is made; only a kind the binary does not know is looked up among the
	// live workers' kinds.
	raw := []byte(c.String("args"))
	if err := queue.ValidateArgs(raw, 0); err != nil {
		return usageError{Err: fmt.Errorf("--args: %w", err)}
	}
	if known && k.ValidateArgs != nil {
		if err := k.ValidateArgs(raw); err != nil {
			return usageError{Err: fmt.Errorf("invalid args for kind %s: %w", kind, err)}
		}
	}
	args := fenceq.RawArgs{KindName: kind, JSON: raw}
	opts := &fenceq.InsertOpts{Queue: c.String("queue"), Priority: new(c.Int("priority")),
		MaxAttempts: c.Int("max-attempts"), UniqueKey: c.String("unique-key"), RunIn: c.Duration("in"),
		Tags: c.StringSlice("tag"), Flow: queue.FlowOpts{Limit: c.String("flow-limit"), Partition: c.String("flow-partition")},
		Debounce: queue.DebounceOpts{Key: c.String("debounce-key"), Window: c.Duration("debounce-window"),
			MaxWait: c.Duration("debounce-max-wait")}}
	if opts.Flow.Limit == "" && opts.Flow.Partition != "" {
		return usageError{Err: errors.New("--flow-partition needs --flow-limit, the limit it is a partition of")}
	}
	if opts.Queue == "" {
		opts.Queue = queue.DefaultQueue
		if known {
			opts.Queue = k.Queue
		}
	}
	if s := c.String("run-at"); s != "" {
		if c.IsSet("in") {
			return usageError{Err: errors.New("give either --run-at or --in, not both")}
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return usageError{Err: fmt.Errorf("invalid --run-at %q: want RFC 3339 such as 2026-01-31T09:00:00Z", s)}
		}
		opts.RunAt = t
	}
	if d := c.Duration("in"); d < 0 {
		return usageError{Err: fmt.Errorf("invalid --in %s: must not be negative", d)}
	}
	if c.Int("max-attempts") < 1 {
		return usageError{Err: fmt.Errorf("invalid --max-attempts %d: must be at least 1", c.Int("max-attempts"))}
	}
	if err := fenceq.ValidateEnqueue(args, opts); err != nil { // queue, priority, unique key, tags, debounce
		var ve *queue.ValidationError
		if errors.As(err, &ve) && debounceFlag[ve.Field] != "" {
			return usageError{Err: fmt.Errorf("%s: %w", debounceFlag[ve.Field], err)}
		}
		return usageError{Err: err}
	}
	pool, err := e.openForKind(c, known, kind, "")
	if err != nil {
		return err
	}
	defer pool.Close()
	if !known {
		if _, _, err := e.checkKind(c.Context, pool, kind, "", c.Bool("allow-unknown-kind")); err != nil {
			return err
		}
	}
	res, err := fenceq.Enqueue(c.Context, pool, args, opts)
	if err != nil {
		return err
	}
	out := enqueueResult{Job: res.Job, Existing: res.Existing, Debounced: res.Debounced}
	return output(c, out, func(w io.Writer) error {
		j := res.Job
		if res.Debounced {
			_, err := fmt.Fprintf(w, "job %d with debounce key %q had not started (%s, queue %s): it takes these args and runs at %s\n",
				j.ID, opts.Debounce.Key, j.Kind, j.Queue, fmtTime(&j.RunAt))
			return err
		}
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
