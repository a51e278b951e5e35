package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func jobsCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "jobs",
		Usage: "list, show, retry, cancel, requeue or signal jobs",
		Subcommands: []*ucli.Command{
			{
				Name:  "list",
				Usage: "list the newest jobs",
				Flags: []ucli.Flag{
					&ucli.StringFlag{Name: "state", Usage: "only this state: " + stateNames()},
					&ucli.StringFlag{Name: "queue", Usage: "only this queue"},
					&ucli.StringFlag{Name: "kind", Usage: "only this kind"},
					&ucli.StringFlag{Name: "tag", Usage: "only jobs with this tag"},
					&ucli.BoolFlag{Name: "unknown-kinds", Usage: "only waiting jobs that no live worker of their queue has a handler for"},
					&ucli.DurationFlag{Name: "live-within", Value: queue.DefaultLiveWithin,
						Usage: "with --unknown-kinds: a worker is live if it heartbeated within this"},
					&ucli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many jobs"},
				},
				Action: jobsList,
			},
			{Name: "show", Usage: "show one job, its errors and its lease events", ArgsUsage: "ID", Action: jobsShow},
			{Name: "retry", Usage: "run a finished, retryable or scheduled job again now", ArgsUsage: "ID",
				Action: jobsAdmin("retry", fenceq.RetryJob)},
			{Name: "cancel", Usage: "cancel an unfinished job (a running job's lease is revoked)", ArgsUsage: "ID",
				Action: jobsAdmin("cancel", func(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
					return fenceq.CancelJob(ctx, db, id, "")
				})},
			{Name: "signal", Usage: "send the signal NAME to a job: it wakes the job's wait for it, once, or is kept " +
				"for the job's next wait", ArgsUsage: "ID NAME",
				Flags:  []ucli.Flag{&ucli.StringFlag{Name: "payload", Usage: "the signal's payload, JSON"}},
				Action: jobsSignal},
			{Name: "requeue", Usage: "force a job of any state back to available; a running job's lease is revoked " +
				"(its generation bumped) so its holder can write nothing more", ArgsUsage: "ID",
				Action: jobsAdmin("requeue", fenceq.RequeueJob)},
		},
	}
}

func stateNames() string {
	s := make([]string, len(queue.JobStates()))
	for i, st := range queue.JobStates() {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func parseJobID(c *ucli.Context) (int64, error) {
	if err := needArgs(c, 1, 1, "ID"); err != nil {
		return 0, err
	}
	id, err := strconv.ParseInt(c.Args().First(), 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError{Err: fmt.Errorf("invalid job id %q: want a positive integer", c.Args().First())}
	}
	return id, nil
}

// wrongStateDetail is the "it is …" part of an ErrWrongState error from the engine
// (whose messages say what the row is), or the whole message when there is none.
func wrongStateDetail(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "it is "); i >= 0 {
		msg = strings.TrimSuffix(msg[i:], ": "+queue.ErrWrongState.Error())
	}
	return msg
}

// jobError turns the engine's sentinels into the CLI's lines.
func jobError(op string, id int64, err error) error {
	switch {
	case errors.Is(err, queue.ErrNotFound):
		return fmt.Errorf("job %d not found", id)
	case errors.Is(err, queue.ErrWrongState):
		msg := wrongStateDetail(err)
		hint := ""
		if op == "retry" {
			hint = fmt.Sprintf(" (use `fenceq jobs requeue %d` to force it)", id)
		}
		return fmt.Errorf("cannot %s job %d: %s%s", op, id, msg, hint)
	}
	return err
}

func jobsList(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--state S] [--queue Q] [--kind K] [--tag T] [--unknown-kinds] [--limit N]"); err != nil {
		return err
	}
	if t := c.String("tag"); t != "" {
		if err := queue.ValidateName("--tag", t, queue.MaxTagLen); err != nil {
			return usageError{Err: err}
		}
	}
	// A queue or kind no job can have is a mistake in the command line, not a filter
	// that matches nothing (and text PostgreSQL cannot hold would fail the query).
	if q := c.String("queue"); q != "" {
		if err := queue.ValidateName("--queue", q, queue.MaxQueueLen); err != nil {
			return usageError{Err: err}
		}
	}
	if k := c.String("kind"); k != "" {
		if err := queue.ValidateName("--kind", k, queue.MaxKindLen); err != nil {
			return usageError{Err: err}
		}
	}
	if err := positiveDurations(c, "live-within"); err != nil {
		return err
	}
	st := queue.State(c.String("state"))
	if st != "" && !st.Valid() {
		return usageError{Err: fmt.Errorf("invalid --state %q: want one of %s", st, stateNames())}
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
	page, err := fenceq.ListJobs(c.Context, pool, queue.ListParams{State: st, Queue: c.String("queue"),
		Kind: c.String("kind"), Tag: c.String("tag"), UnknownKinds: c.Bool("unknown-kinds"),
		LiveWithin: c.Duration("live-within"), Limit: limit})
	if err != nil {
		return err
	}
	jobs := page.Jobs
	if jobs == nil {
		jobs = []*queue.JobRow{}
	}
	return output(c, jobs, func(w io.Writer) error {
		if len(jobs) == 0 {
			_, err := fmt.Fprintln(w, "no jobs")
			return err
		}
		rows := make([][]string, 0, len(jobs))
		for _, j := range jobs {
			rows = append(rows, []string{strconv.FormatInt(j.ID, 10), j.Kind, j.Queue, string(j.State),
				fmt.Sprintf("%d/%d", j.Attempt, j.MaxAttempts), strconv.FormatInt(j.LeaseGen, 10),
				fmtTime(&j.RunAt), fmtStr(j.LeasedBy), truncate(string(j.EncodedArgs), 40)})
		}
		return table(w, []string{"ID", "KIND", "QUEUE", "STATE", "ATTEMPT", "GEN", "RUN_AT", "LEASED_BY", "ARGS"}, rows)
	})
}

type jobDetail struct {
	*queue.JobRow
	LeaseEvents []queue.LeaseEvent `json:"lease_events"`
}

func jobsShow(c *ucli.Context) error {
	id, err := parseJobID(c)
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	j, err := fenceq.GetJob(c.Context, pool, id)
	if err != nil {
		return jobError("show", id, err)
	}
	events, err := fenceq.ListLeaseEvents(c.Context, pool, id, 50)
	if err != nil {
		return err
	}
	if events == nil {
		events = []queue.LeaseEvent{}
	}
	return output(c, jobDetail{JobRow: j, LeaseEvents: events}, func(w io.Writer) error {
		printJob(w, j)
		if len(j.Errors) > 0 {
			fmt.Fprintln(w, "\nerrors:")
			rows := make([][]string, 0, len(j.Errors))
			for _, e := range j.Errors {
				at := e.At
				rows = append(rows, []string{fmtTime(&at), strconv.Itoa(e.Attempt), strconv.FormatInt(e.LeaseGen, 10),
					orDash(e.Worker), truncate(e.Error, 100)})
			}
			if err := table(w, []string{"AT", "ATTEMPT", "GEN", "WORKER", "ERROR"}, rows); err != nil {
				return err
			}
		}
		if len(events) > 0 {
			fmt.Fprintln(w, "\nlease events:")
			rows := make([][]string, 0, len(events))
			for _, e := range events {
				at := e.At
				rows = append(rows, []string{fmtTime(&at), string(e.Kind), strconv.FormatInt(e.LeaseGen, 10),
					fmtStr(e.WorkerID), truncate(fmtStr(e.Detail), 80)})
			}
			return table(w, []string{"AT", "EVENT", "GEN", "WORKER", "DETAIL"}, rows)
		}
		return nil
	})
}

func printJob(w io.Writer, j *queue.JobRow) {
	_ = keyValues(w, [][2]string{
		{"id", strconv.FormatInt(j.ID, 10)},
		{"kind", j.Kind},
		{"queue", j.Queue},
		{"state", string(j.State)},
		{"priority", strconv.Itoa(int(j.Priority))},
		{"attempt", fmt.Sprintf("%d of %d", j.Attempt, j.MaxAttempts)},
		{"lease_gen", strconv.FormatInt(j.LeaseGen, 10)},
		{"leased_by", fmtStr(j.LeasedBy)},
		{"heartbeat_at", fmtTime(j.HeartbeatAt)},
		{"lease_expires_at", fmtTime(j.LeaseExpiresAt)},
		{"run_at", fmtTime(&j.RunAt)},
		{"unique_key", fmtStr(j.UniqueKey)},
		{"unique_states", uniqueStates(j)},
		{"tags", orDash(strings.Join(j.Tags, ", "))},
		{"created_at", fmtTime(&j.CreatedAt)},
		{"finished_at", fmtTime(j.FinishedAt)},
		{"args", string(j.EncodedArgs)},
		{"output", fmtOutput(j.Output)},
	})
}

func uniqueStates(j *queue.JobRow) string {
	s := make([]string, len(j.UniqueStates))
	for i, st := range j.UniqueStates {
		s[i] = string(st)
	}
	return orDash(strings.Join(s, ", "))
}

// fmtOutput shows a job's recorded output, "-" when it has none.
func fmtOutput(out json.RawMessage) string {
	if out == nil {
		return "-"
	}
	return string(out)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// adminFunc is one operator action on a job.
type adminFunc func(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error)

type adminResult struct {
	Before *queue.JobRow `json:"before"`
	After  *queue.JobRow `json:"after"`
	// Revoked is true when a running job's lease was revoked.
	Revoked bool `json:"revoked"`
}

func jobsAdmin(op string, fn adminFunc) ucli.ActionFunc {
	return func(c *ucli.Context) error {
		id, err := parseJobID(c)
		if err != nil {
			return err
		}
		pool, err := openSchema(c, 2)
		if err != nil {
			return err
		}
		defer pool.Close()
		before, err := fenceq.GetJob(c.Context, pool, id)
		if err != nil {
			return jobError(op, id, err)
		}
		after, err := fn(c.Context, pool, id)
		if err != nil {
			return jobError(op, id, err)
		}
		res := adminResult{Before: before, After: after, Revoked: after.LeaseGen != before.LeaseGen}
		return output(c, res, func(w io.Writer) error {
			past := map[string]string{"retry": "retried", "cancel": "cancelled", "requeue": "requeued"}[op]
			msg := fmt.Sprintf("job %d %s: %s → %s", id, past, before.State, after.State)
			if res.Revoked {
				msg += fmt.Sprintf("; lease of %s revoked (generation %d → %d): its writes are rejected from now on",
					fmtStr(before.LeasedBy), before.LeaseGen, after.LeaseGen)
			}
			_, err := fmt.Fprintln(w, msg)
			return err
		})
	}
}
