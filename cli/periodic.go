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

func periodicCommand() *ucli.Command {
	nameCmd := func(name, usage string, action ucli.ActionFunc) *ucli.Command {
		return &ucli.Command{Name: name, Usage: usage, ArgsUsage: "NAME", Action: action}
	}
	return &ucli.Command{
		Name:  "periodic",
		Usage: "list, add, remove, pause, resume or trigger periodic schedules",
		Description: "Schedules live in the database (fenceq_periodic): every worker enqueues the jobs of every\n" +
			"schedule, each slot exactly once, whichever worker defined it. Schedules a worker defines in\n" +
			"code (the housekeeping schedule of `fenceq worker`) are written again at each start of such a\n" +
			"worker, keeping their pause and their last slot; a start that changes a stored definition\n" +
			"logs a warning naming both definitions.",
		Subcommands: []*ucli.Command{
			{Name: "list", Usage: "list schedules with their last change, last enqueued slot, next slot and lag",
				Description: "UPDATED is when the schedule's definition or pause last changed: a worker whose code\n" +
					"defines the schedule differently from the stored definition replaces it at its start (and\n" +
					"logs a warning naming both definitions), which shows here.",
				Action: periodicList},
			{
				Name:      "add",
				Usage:     "add a schedule; its first slot is the first after now",
				ArgsUsage: "NAME",
				Description: "NAME names the schedule. --schedule says when its slots fall: a cron expression\n" +
					"(five fields, or six with seconds first), @hourly, @daily, @weekly, @monthly, @yearly, or\n" +
					"\"@every D\" (whole seconds, aligned to the Unix epoch). Cron fields are read on the wall\n" +
					"clock of --timezone. Examples:\n" +
					"  fenceq periodic add nightly --schedule '30 2 * * *' --timezone Europe/Berlin --kind noop\n" +
					"  fenceq periodic add pulse --schedule '@every 30s' --kind sleep --args '{\"duration\": \"1s\"}'",
				Flags: []ucli.Flag{
					&ucli.StringFlag{Name: "schedule", Usage: "when: cron expression, descriptor or \"@every D\" (required)"},
					&ucli.StringFlag{Name: "kind", Usage: "the job kind each slot enqueues (required)"},
					&ucli.StringFlag{Name: "args", Value: "{}", Usage: "job arguments as a JSON object"},
					&ucli.StringFlag{Name: "queue", Usage: "queue (default: the kind's queue)"},
					&ucli.StringFlag{Name: "timezone", Value: "UTC", Usage: "IANA time zone of the cron fields"},
					&ucli.StringFlag{Name: "missed", Value: string(queue.MissedSkip),
						Usage: "slots due while every worker was down: skip (none) or once (one job, for the newest)"},
					&ucli.BoolFlag{Name: "run-on-start", Usage: "also enqueue one job whenever workers start after every one was down"},
					&ucli.BoolFlag{Name: "no-overlap", Usage: "skip a slot while a job of the schedule is unfinished (its previous run)"},
					&ucli.StringFlag{Name: "unique-key", Usage: "give every job this unique key: a slot whose key is held enqueues nothing"},
					&ucli.StringSliceFlag{Name: "tag", Usage: "label every job with `TAG` (repeat for several)"},
					&ucli.StringFlag{Name: "metadata", Usage: "a JSON object every job carries; the job's periodic origin is added to it"},
					&ucli.IntFlag{Name: "priority", Value: queue.DefaultPriority, Usage: "priority 0–100, lower runs first"},
					&ucli.IntFlag{Name: "max-attempts", Value: queue.DefaultMaxAttempts, Usage: "attempts before a job is discarded"},
					&ucli.BoolFlag{Name: "allow-unknown-kind", Usage: "accept a kind neither this binary nor a live worker knows"},
				},
				Action: periodicAdd,
			},
			nameCmd("show", "show one schedule: its definition, last, next and last skipped slots", periodicShow),
			nameCmd("remove", "delete a schedule (one defined in code comes back at the next start of a worker defining it)",
				periodicRemove),
			nameCmd("pause", "enqueue nothing for a schedule until resumed (survives restarts)", periodicPause(true)),
			nameCmd("resume", "resume a paused schedule at its next slot (the paused slots are not caught up)",
				periodicPause(false)),
			nameCmd("trigger", "enqueue one job of a schedule now, leaving its slots alone", periodicTrigger),
		},
	}
}

// periodicName reads the NAME argument.
func periodicName(c *ucli.Context, usage string) (string, error) {
	if err := needArgs(c, 1, 1, usage); err != nil {
		return "", err
	}
	name := c.Args().First()
	if err := queue.ValidateName("name", name, queue.MaxPeriodicNameLen); err != nil {
		return "", usageError{Err: err}
	}
	return name, nil
}

// periodicError turns the engine's sentinels into the CLI's lines.
func periodicError(name string, err error) error {
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return fmt.Errorf("periodic schedule %q not found (see `fenceq periodic list`)", name)
	case errors.Is(err, queue.ErrExists):
		return fmt.Errorf("periodic schedule %q already exists (remove it first: `fenceq periodic remove %s`)", name, name)
	}
	return err
}

// flagOf names the command-line flag of a schedule's field.
var flagOf = map[string]string{"spec": "--schedule", "timezone": "--timezone", "kind": "--kind", "args": "--args",
	"queue": "--queue", "missed": "--missed", "priority": "--priority", "max_attempts": "--max-attempts", "name": "NAME",
	"unique_key": "--unique-key", "tags": "--tag", "metadata": "--metadata"}

func periodicAdd(c *ucli.Context) error {
	name, err := periodicName(c, "NAME --schedule WHEN --kind KIND [--args JSON] [flags]")
	if err != nil {
		return err
	}
	for _, f := range []string{"schedule", "kind"} {
		if strings.TrimSpace(c.String(f)) == "" {
			return usageError{Err: fmt.Errorf("--%s is required (see `%s --help`)", f, c.Command.HelpName)}
		}
	}
	e := envOf(c)
	kind := c.String("kind")
	if err := queue.ValidateKind(kind); err != nil {
		return usageError{Err: fmt.Errorf("--kind: %w", err)}
	}
	k, known := e.lookupKind(kind)
	raw := []byte(c.String("args"))
	if err := queue.ValidateArgs(raw, 0); err != nil {
		return usageError{Err: fmt.Errorf("--args: %w", err)}
	}
	if known && k.ValidateArgs != nil {
		if err := k.ValidateArgs(raw); err != nil {
			return usageError{Err: fmt.Errorf("--args: invalid args for kind %s: %w", kind, err)}
		}
	}
	p := queue.PeriodicParams{Name: name, Spec: c.String("schedule"), Timezone: c.String("timezone"), Kind: kind,
		Args: raw, Queue: c.String("queue"), Priority: new(c.Int("priority")), MaxAttempts: c.Int("max-attempts"),
		Missed: queue.MissedPolicy(c.String("missed")), RunOnStart: c.Bool("run-on-start"), Source: queue.SourceCLI,
		NoOverlap: c.Bool("no-overlap"), UniqueKey: c.String("unique-key"), Tags: c.StringSlice("tag"),
		Metadata: []byte(c.String("metadata"))}
	if p.Queue == "" && known {
		p.Queue = k.Queue
	}
	if c.Int("max-attempts") < 1 {
		return usageError{Err: fmt.Errorf("--max-attempts: %d must be at least 1", c.Int("max-attempts"))}
	}
	// Every field is checked before a connection is made.
	if _, err := fenceq.ValidatePeriodic(&p); err != nil {
		var ve *queue.ValidationError
		if errors.As(err, &ve) && flagOf[ve.Field] != "" {
			return usageError{Err: fmt.Errorf("%s: %w", flagOf[ve.Field], err)}
		}
		return usageError{Err: err}
	}
	pool, err := e.openForKind(c, known, kind, "--kind: ")
	if err != nil {
		return err
	}
	defer pool.Close()
	if !known {
		if _, _, err := e.checkKind(c.Context, pool, kind, "--kind: ", c.Bool("allow-unknown-kind")); err != nil {
			return err
		}
	}
	info, err := fenceq.AddPeriodic(c.Context, pool, p)
	if err != nil {
		return periodicError(name, err)
	}
	return output(c, info, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "added periodic schedule %s: %s (%s), kind %s, queue %s; next slot %s\n",
			info.Name, info.Spec, info.Timezone, info.Kind, info.Queue, fmtTime(info.Next))
		return err
	})
}

func periodicList(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	infos, err := fenceq.ListPeriodic(c.Context, pool)
	if err != nil {
		return err
	}
	if infos == nil {
		infos = []fenceq.PeriodicInfo{}
	}
	return output(c, infos, func(w io.Writer) error {
		if len(infos) == 0 {
			_, err := fmt.Fprintln(w, "no periodic schedules (add one with `fenceq periodic add`)")
			return err
		}
		rows := make([][]string, 0, len(infos))
		for _, p := range infos {
			lag := "-"
			switch {
			case p.Error != "":
				lag = "broken: " + truncate(p.Error, 60)
			case p.Paused:
				lag = "paused"
			case p.Next != nil:
				lag = fmtAge(p.Lag)
			}
			skipped := "-"
			if p.NoOverlap {
				skipped = fmtTime(p.LastSkippedSlot)
			}
			rows = append(rows, []string{p.Name, p.Spec, p.Timezone, p.Kind, p.Queue, string(p.Missed),
				yesNo(p.Paused), string(p.Source), fmtTime(&p.UpdatedAt), fmtTime(p.LastEnqueuedSlot), fmtTime(p.Next), lag,
				skipped})
		}
		return table(w, []string{"NAME", "SCHEDULE", "TIMEZONE", "KIND", "QUEUE", "MISSED", "PAUSED", "SOURCE",
			"UPDATED", "LAST_SLOT", "NEXT_SLOT", "LAG", "LAST_SKIPPED"}, rows)
	})
}

func periodicShow(c *ucli.Context) error {
	name, err := periodicName(c, "NAME")
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	p, err := fenceq.GetPeriodic(c.Context, pool, name)
	if err != nil {
		return periodicError(name, err)
	}
	return output(c, p, func(w io.Writer) error {
		lines := [][2]string{{"name", p.Name}, {"schedule", p.Spec}, {"timezone", p.Timezone}, {"kind", p.Kind},
			{"args", string(p.EncodedArgs)}, {"queue", p.Queue}, {"priority", strconv.Itoa(p.Priority)},
			{"max attempts", strconv.Itoa(p.MaxAttempts)}, {"missed", string(p.Missed)},
			{"run on start", yesNo(p.RunOnStart)}, {"no overlap", yesNo(p.NoOverlap)}, {"paused", yesNo(p.Paused)},
			{"source", string(p.Source)}, {"updated", fmtTime(&p.UpdatedAt)},
			{"last slot", fmtTime(&p.LastSlot)}, {"last enqueued slot", fmtTime(p.LastEnqueuedSlot)},
			{"next slot", fmtTime(p.Next)},
			{"last skipped slot", fmtTime(p.LastSkippedSlot)},
			{"skipped slots", strconv.FormatInt(p.SkippedSlots, 10)}}
		if p.UniqueKey != nil {
			lines = append(lines, [2]string{"unique key", *p.UniqueKey})
		}
		if len(p.Tags) > 0 {
			lines = append(lines, [2]string{"tags", strings.Join(p.Tags, ", ")})
		}
		if m := string(p.Metadata); m != "" && m != "{}" {
			lines = append(lines, [2]string{"metadata", m})
		}
		if p.Error != "" {
			lines = append(lines, [2]string{"error", p.Error})
		}
		return keyValues(w, lines)
	})
}

func periodicRemove(c *ucli.Context) error {
	name, err := periodicName(c, "NAME")
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := fenceq.RemovePeriodic(c.Context, pool, name)
	if err != nil {
		return periodicError(name, err)
	}
	return output(c, r, func(w io.Writer) error {
		msg := fmt.Sprintf("removed periodic schedule %s", name)
		if r.Source == queue.SourceCode {
			msg += " (defined in code: it comes back at the next start of a worker that defines it)"
		}
		_, err := fmt.Fprintln(w, msg)
		return err
	})
}

func periodicPause(paused bool) ucli.ActionFunc {
	return func(c *ucli.Context) error {
		name, err := periodicName(c, "NAME")
		if err != nil {
			return err
		}
		pool, err := openSchema(c, 2)
		if err != nil {
			return err
		}
		defer pool.Close()
		setPaused := fenceq.ResumePeriodic
		if paused {
			setPaused = fenceq.PausePeriodic
		}
		r, err := setPaused(c.Context, pool, name)
		if err != nil {
			return periodicError(name, err)
		}
		info, err := fenceq.GetPeriodic(c.Context, pool, name)
		if err != nil {
			info = &fenceq.PeriodicInfo{PeriodicRow: r}
		}
		return output(c, info, func(w io.Writer) error {
			msg := fmt.Sprintf("periodic schedule %s paused: nothing is enqueued until `fenceq periodic resume %s`", name, name)
			if !paused {
				msg = fmt.Sprintf("periodic schedule %s resumed: next slot %s", name, fmtTime(info.Next))
			}
			_, err := fmt.Fprintln(w, msg)
			return err
		})
	}
}

type triggerResult struct {
	Job *queue.JobRow `json:"job"`
}

func periodicTrigger(c *ucli.Context) error {
	name, err := periodicName(c, "NAME")
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	j, err := fenceq.TriggerPeriodic(c.Context, pool, name)
	if err != nil {
		return periodicError(name, err)
	}
	return output(c, triggerResult{Job: j}, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "enqueued job %d (%s, queue %s) for periodic schedule %s; its slots are unchanged\n",
			j.ID, j.Kind, j.Queue, name)
		return err
	})
}

// periodicSummary is the periodic part of `fenceq stats`.
type periodicSummary struct {
	Schedules int     `json:"schedules"`
	Paused    int     `json:"paused"`
	Broken    int     `json:"broken"`
	MaxLag    float64 `json:"max_lag_seconds"`
	// MaxLagName names the schedule that lags most ("" when none lags).
	MaxLagName string `json:"max_lag_name"`
}

func summarizePeriodic(infos []fenceq.PeriodicInfo) periodicSummary {
	s := periodicSummary{Schedules: len(infos)}
	for _, p := range infos {
		if p.Paused {
			s.Paused++
		}
		if p.Error != "" {
			s.Broken++
		}
		if p.LagSeconds > s.MaxLag {
			s.MaxLag, s.MaxLagName = p.LagSeconds, p.Name
		}
	}
	return s
}

func (s periodicSummary) line() string {
	if s.Schedules == 0 {
		return "none"
	}
	out := strconv.Itoa(s.Schedules) + fmt.Sprintf(" (%d paused", s.Paused)
	if s.Broken > 0 {
		out += fmt.Sprintf(", %d broken", s.Broken)
	}
	out += ")"
	if s.MaxLagName != "" {
		out += fmt.Sprintf("; most behind: %s by %s", s.MaxLagName, fmtAge(secondsDuration(s.MaxLag)))
	}
	return out
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
