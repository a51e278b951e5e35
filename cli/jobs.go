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
		Usage: "list, show, retry, cancel, requeue, delete or signal jobs, one by id or every one a filter matches",
		Subcommands: []*ucli.Command{
			{
				Name:   "list",
				Usage:  "list the newest jobs matching the filter flags, over the whole history",
				Flags:  append(filterFlags(), &ucli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many jobs"}, &ucli.Int64Flag{Name: "before", Usage: "only jobs with an id below this (the next page)"}),
				Action: jobsList,
			},
			{Name: "show", Usage: "show one job, its errors, its lease events and the operator actions that named it", ArgsUsage: "ID", Action: jobsShow},
			bulkCommand("retry", "run a finished, retryable or scheduled job again now", fenceq.RetryJob, fenceq.RetryJobs),
			bulkCommand("cancel", "cancel an unfinished job (a running job's lease is revoked)",
				func(ctx context.Context, db queue.DBTX, id int64) (*queue.JobRow, error) {
					return fenceq.CancelJob(ctx, db, id, "")
				}, func(ctx context.Context, db queue.Beginner, f queue.JobFilter, o *fenceq.BulkOptions) (*fenceq.BulkResult, error) {
					return fenceq.CancelJobs(ctx, db, f, o)
				}),
			bulkCommand("requeue", "force a job of any state back to available; a running job's lease is revoked "+
				"(its generation bumped) so its holder can write nothing more", fenceq.RequeueJob, fenceq.RequeueJobs),
			bulkCommand("delete", "delete a job that is not running", fenceq.DeleteJob, fenceq.DeleteJobs),
			{Name: "signal", Usage: "send the signal NAME to a job: it wakes the job's wait for it, once, or is kept " +
				"for the job's next wait", ArgsUsage: "ID NAME",
				Flags:  []ucli.Flag{&ucli.StringFlag{Name: "payload", Usage: "the signal's payload, JSON"}},
				Action: jobsSignal},
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

func parseJobID(c *ucli.Context) (int64, error) { return parseID(c, "job id") }

// parseID reads the command's one argument, ID, as the positive integer what names.
func parseID(c *ucli.Context, what string) (int64, error) {
	if err := needArgs(c, 1, 1, "ID"); err != nil {
		return 0, err
	}
	id, err := strconv.ParseInt(c.Args().First(), 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError{Err: fmt.Errorf("invalid %s %q: want a positive integer", what, c.Args().First())}
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
	if err := needArgs(c, 0, 0, "[filter flags] [--limit N] [--before ID]"); err != nil {
		return err
	}
	f, err := parseFilter(c)
	if err != nil {
		return err
	}
	limit, err := listLimit(c)
	if err != nil {
		return err
	}
	if c.Int64("before") < 0 {
		return usageError{Err: fmt.Errorf("invalid --before %d: want a job id", c.Int64("before"))}
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	page, err := fenceq.ListJobs(c.Context, pool, queue.ListParams{JobFilter: f, BeforeID: c.Int64("before"), Limit: limit})
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
			last := ""
			if len(j.Errors) > 0 {
				last = j.Errors[len(j.Errors)-1].Error
			}
			rows = append(rows, []string{strconv.FormatInt(j.ID, 10), j.Kind, j.Queue, string(j.State),
				fmt.Sprintf("%d/%d", j.Attempt, j.MaxAttempts), strconv.FormatInt(j.LeaseGen, 10),
				fmtTime(&j.RunAt), fmtStr(j.LeasedBy), truncate(string(j.EncodedArgs), 40), orDash(truncate(oneLine(last), 50))})
		}
		if err := table(w, []string{"ID", "KIND", "QUEUE", "STATE", "ATTEMPT", "GEN", "RUN_AT", "LEASED_BY", "ARGS", "LAST_ERROR"}, rows); err != nil {
			return err
		}
		if page.Next != 0 {
			_, err := fmt.Fprintf(w, "older jobs: --before %d\n", page.Next)
			return err
		}
		return nil
	})
}

type jobDetail struct {
	*queue.JobRow
	LeaseEvents []queue.LeaseEvent  `json:"lease_events"`
	Audit       []queue.AuditRecord `json:"audit"`
	// Flow is the state of the job's flow partition (its FlowKey), when it has one that
	// still exists.
	Flow *queue.FlowPartition `json:"flow,omitempty"`
	// FlowLimit is the limit of that partition.
	FlowLimit *queue.FlowLimit `json:"flow_limit,omitempty"`
}

// jobFlow reads the partition of a job's flow key and its limit: nil, nil for a job
// under no limit, or whose limit was deleted since.
func jobFlow(ctx context.Context, db queue.DBTX, j *queue.JobRow) (*queue.FlowPartition, *queue.FlowLimit, error) {
	if j.FlowKey == nil {
		return nil, nil, nil
	}
	p, err := fenceq.FlowPartitionOf(ctx, db, *j.FlowKey)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	ls, err := fenceq.ListFlowLimits(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	for _, l := range ls {
		if l.Name == p.Limit {
			return p, &l, nil
		}
	}
	return p, nil, nil
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
	audit, err := fenceq.ListAudit(c.Context, pool, queue.AuditParams{JobID: id, Limit: 50})
	if err != nil {
		return err
	}
	if audit == nil {
		audit = []queue.AuditRecord{}
	}
	flow, flowLimit, err := jobFlow(c.Context, pool, j)
	if err != nil {
		return err
	}
	d := jobDetail{JobRow: j, LeaseEvents: events, Audit: audit, Flow: flow, FlowLimit: flowLimit}
	return output(c, d, func(w io.Writer) error {
		printJob(w, j)
		if flow != nil {
			fmt.Fprintln(w, "\nflow partition:")
			printFlowPartition(w, flow, flowLimit)
		}
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
			if err := table(w, []string{"AT", "EVENT", "GEN", "WORKER", "DETAIL"}, rows); err != nil {
				return err
			}
		}
		if len(audit) > 0 {
			fmt.Fprintln(w, "\noperator actions:")
			rows := make([][]string, 0, len(audit))
			for _, a := range audit {
				at := a.At
				scope := "this job"
				if a.Filter != nil {
					scope = fmt.Sprintf("bulk: %d changed of %d", len(a.JobIDs), a.Matched)
				}
				rows = append(rows, []string{fmtTime(&at), a.Actor, string(a.Action), scope, orDash(truncate(a.Detail, 60))})
			}
			return table(w, []string{"AT", "WHO", "ACTION", "SCOPE", "DETAIL"}, rows)
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
		{"flow_key", fmtStr(j.FlowKey)},
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
			past := pastTense[op]
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
