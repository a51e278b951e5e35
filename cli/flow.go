package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func flowCommand() *ucli.Command {
	nameCmd := func(name, usage string, action ucli.ActionFunc) *ucli.Command {
		return &ucli.Command{Name: name, Usage: usage, ArgsUsage: "NAME", Action: action}
	}
	return &ucli.Command{
		Name:  "flow",
		Usage: "set, list, show or delete flow limits (concurrency limits, rate limits, sequences per partition)",
		Description: "A flow limit lives in the database (fenceq_flow_limits) and every worker enforces it in its\n" +
			"claim. Jobs go under a limit when enqueued (`fenceq enqueue KIND --flow-limit NAME\n" +
			"--flow-partition P`); the limit's numbers hold per partition. See docs/flow.md.",
		Subcommands: []*ucli.Command{
			{
				Name:      "set",
				Usage:     "create a flow limit or change its numbers (the next claim of every worker applies them)",
				ArgsUsage: "NAME",
				Description: "Set at least one of --max-running, --rate with --per, or --sequence. Examples:\n" +
					"  fenceq flow set per-customer --max-running 2\n" +
					"  fenceq flow set smtp --rate 100 --per 1m\n" +
					"  fenceq flow set ledger --sequence --hold-on-discard",
				Flags: []ucli.Flag{
					&ucli.IntFlag{Name: "max-running", Usage: "at most `N` jobs running at once per partition (0: no concurrency limit)"},
					&ucli.IntFlag{Name: "rate", Usage: "at most `N` starts per --per per partition, retries included (0: no rate limit)"},
					&ucli.DurationFlag{Name: "per", Usage: "the rate's period, e.g. 1s or 1m (with --rate)"},
					&ucli.BoolFlag{Name: "sequence", Usage: "run each partition's jobs one at a time, in enqueue order"},
					&ucli.BoolFlag{Name: "hold-on-discard", Usage: "with --sequence: a discarded job keeps holding its partition until retried or deleted"},
				},
				Action: flowSet,
			},
			{Name: "list", Usage: "list the flow limits", Action: flowList},
			{
				Name:      "show",
				Usage:     "show a flow limit and its busiest partitions",
				ArgsUsage: "NAME",
				Flags:     []ucli.Flag{&ucli.IntFlag{Name: "limit", Value: 20, Usage: "at most this many partitions"}},
				Action:    flowShow,
			},
			nameCmd("delete", "delete a flow limit that no unfinished job is under", flowDelete),
		},
	}
}

// flowName reads the NAME argument of a flow command.
func flowName(c *ucli.Context, usage string) (string, error) {
	if err := needArgs(c, 1, 1, usage); err != nil {
		return "", err
	}
	name := c.Args().First()
	if err := queue.ValidateFlowLimitName(name); err != nil {
		return "", usageError{Err: fmt.Errorf("NAME: %w", err)}
	}
	return name, nil
}

// flowFlagOf names the command-line flag of a flow limit's field.
var flowFlagOf = map[string]string{"max_running": "--max-running", "rate": "--rate", "per": "--per",
	"hold_on_discard": "--hold-on-discard", "flow.limit": "NAME"}

// flowError turns the engine's sentinels into the CLI's lines.
func flowError(name string, err error) error {
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return fmt.Errorf("flow limit %q not found (see `fenceq flow list`)", name)
	case errors.Is(err, queue.ErrWrongState):
		return fmt.Errorf("cannot delete flow limit %q: unfinished jobs are under it "+
			"(see `fenceq flow show %s`; let them finish, or cancel or delete them first)", name, name)
	}
	return err
}

func flowSet(c *ucli.Context) error {
	name, err := flowName(c, "NAME [--max-running N] [--rate N --per DURATION] [--sequence] [--hold-on-discard]")
	if err != nil {
		return err
	}
	l := queue.FlowLimit{Name: name, MaxRunning: c.Int("max-running"), Rate: c.Int("rate"), Per: c.Duration("per"),
		Sequence: c.Bool("sequence"), HoldOnDiscard: c.Bool("hold-on-discard")}
	if err := l.Validate(); err != nil {
		var ve *queue.ValidationError
		if errors.As(err, &ve) {
			if f, ok := flowFlagOf[ve.Field]; ok {
				return usageError{Err: fmt.Errorf("invalid %s: %s", f, ve.Reason)}
			}
			if ve.Field == "flow limit" {
				return usageError{Err: fmt.Errorf("flow limit %q limits nothing: give --max-running, --rate with --per, or --sequence", name)}
			}
		}
		return usageError{Err: err}
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := fenceq.SetFlowLimit(c.Context, pool, l); err != nil {
		return err
	}
	return output(c, l, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "flow limit %s set: %s\n", name, describeFlowLimit(l))
		return err
	})
}

// describeFlowLimit says in words what a limit allows per partition.
func describeFlowLimit(l queue.FlowLimit) string {
	var parts []string
	if l.MaxRunning > 0 {
		parts = append(parts, fmt.Sprintf("at most %d running", l.MaxRunning))
	}
	if l.Rate > 0 {
		parts = append(parts, fmt.Sprintf("at most %d starts per %s", l.Rate, l.Per))
	}
	if l.Sequence {
		s := "one at a time in enqueue order"
		if l.HoldOnDiscard {
			s += ", a discarded job holds its partition"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ") + " per partition"
}

func flowList(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	ls, err := fenceq.ListFlowLimits(c.Context, pool)
	if err != nil {
		return err
	}
	if ls == nil {
		ls = []queue.FlowLimit{}
	}
	return output(c, ls, func(w io.Writer) error {
		if len(ls) == 0 {
			_, err := fmt.Fprintln(w, "no flow limits")
			return err
		}
		rows := make([][]string, 0, len(ls))
		for _, l := range ls {
			rows = append(rows, flowLimitRow(l))
		}
		return table(w, []string{"NAME", "MAX_RUNNING", "RATE", "SEQUENCE", "HOLD_ON_DISCARD"}, rows)
	})
}

func flowLimitRow(l queue.FlowLimit) []string {
	maxRunning, rate := "-", "-"
	if l.MaxRunning > 0 {
		maxRunning = strconv.Itoa(l.MaxRunning)
	}
	if l.Rate > 0 {
		rate = fmt.Sprintf("%d/%s", l.Rate, l.Per)
	}
	return []string{l.Name, maxRunning, rate, yesNo(l.Sequence), yesNo(l.HoldOnDiscard)}
}

// flowDetail is `fenceq flow show`'s report: the limit and its busiest partitions.
type flowDetail struct {
	Limit      queue.FlowLimit       `json:"limit"`
	Partitions []queue.FlowPartition `json:"partitions"`
}

func flowShow(c *ucli.Context) error {
	name, err := flowName(c, "NAME [--limit N]")
	if err != nil {
		return err
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
	ls, err := fenceq.ListFlowLimits(c.Context, pool)
	if err != nil {
		return err
	}
	var d flowDetail
	found := false
	for _, l := range ls {
		if l.Name == name {
			d.Limit, found = l, true
		}
	}
	if !found {
		return flowError(name, queue.ErrNotFound)
	}
	if d.Partitions, err = fenceq.FlowPartitions(c.Context, pool, name, limit); err != nil {
		return err
	}
	if d.Partitions == nil {
		d.Partitions = []queue.FlowPartition{}
	}
	return output(c, d, func(w io.Writer) error {
		fmt.Fprintf(w, "flow limit %s: %s\n", name, describeFlowLimit(d.Limit))
		if len(d.Partitions) == 0 {
			_, err := fmt.Fprintln(w, "no partitions: no job was enqueued under it")
			return err
		}
		fmt.Fprintln(w)
		rows := make([][]string, 0, len(d.Partitions))
		for _, p := range d.Partitions {
			rows = append(rows, []string{p.Key, flowRunning(p, d.Limit), fmtID(p.Holder),
				strconv.Itoa(p.StartsInPeriod), fmtNextStart(p.NextStart), strconv.FormatInt(p.Waiting, 10)})
		}
		if err := table(w, []string{"KEY", "RUNNING", "HOLDER", "STARTS_IN_PERIOD", "NEXT_START", "WAITING"}, rows); err != nil {
			return err
		}
		if len(d.Partitions) == limit {
			_, err := fmt.Fprintf(w, "(the %d busiest partitions; more with --limit)\n", limit)
			return err
		}
		return nil
	})
}

// flowRunning shows a partition's running count against its limit's maximum.
func flowRunning(p queue.FlowPartition, l queue.FlowLimit) string {
	switch {
	case l.MaxRunning > 0:
		return fmt.Sprintf("%d/%d", p.Running, l.MaxRunning)
	case l.Sequence:
		return fmt.Sprintf("%d/1", p.Running)
	}
	return strconv.Itoa(p.Running)
}

func fmtID(id *int64) string {
	if id == nil {
		return "-"
	}
	return strconv.FormatInt(*id, 10)
}

// fmtNextStart shows the next start a rate allows: "now" when it is not in the future.
func fmtNextStart(t *time.Time) string {
	if t == nil {
		return "-"
	}
	if !t.After(time.Now()) {
		return "now"
	}
	return t.Local().Format("2006-01-02 15:04:05.000")
}

type flowDeleteResult struct {
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

func flowDelete(c *ucli.Context) error {
	name, err := flowName(c, "NAME")
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := fenceq.DeleteFlowLimit(c.Context, pool, name); err != nil {
		return flowError(name, err)
	}
	return output(c, flowDeleteResult{Name: name, Deleted: true}, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "flow limit %s deleted\n", name)
		return err
	})
}

// printFlowPartition writes the state of a job's flow partition under `fenceq jobs show`.
func printFlowPartition(w io.Writer, p *queue.FlowPartition, l *queue.FlowLimit) {
	kv := [][2]string{{"key", p.Key}}
	if l != nil {
		kv = append(kv, [2]string{"limit", describeFlowLimit(*l)}, [2]string{"running", flowRunning(*p, *l)})
	} else {
		kv = append(kv, [2]string{"running", strconv.Itoa(p.Running)})
	}
	kv = append(kv, [2]string{"holder", fmtID(p.Holder)}, [2]string{"waiting", strconv.FormatInt(p.Waiting, 10)})
	if p.NextStart != nil {
		kv = append(kv, [2]string{"starts_in_period", strconv.Itoa(p.StartsInPeriod)},
			[2]string{"next_start", fmtNextStart(p.NextStart)})
	}
	_ = keyValues(w, kv)
}
