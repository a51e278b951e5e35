package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func workflowsCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "workflows",
		Usage: "enqueue, list or show workflows and batches",
		Subcommands: []*ucli.Command{
			{
				Name:  "list",
				Usage: "list the newest workflows and batches, with their tasks' counts by state",
				Flags: []ucli.Flag{
					&ucli.StringFlag{Name: "kind", Usage: "only workflows or only batches: workflow, batch"},
					&ucli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many"},
				},
				Action: workflowsList,
			},
			{Name: "show", Usage: "show one workflow: its tasks, their states and dependencies", ArgsUsage: "ID",
				Action: workflowsShow},
			{
				Name: "enqueue",
				Usage: "enqueue a workflow described in a JSON file: " +
					`{"name": N, "tasks": [{"name", "kind", "args", "queue", "priority", "max_attempts", ` +
					`"after": [tasks], "tolerate": [tasks], "after_jobs": [ids], "tolerate_jobs": [ids]}]}`,
				Flags: []ucli.Flag{
					&ucli.StringFlag{Name: "file", Usage: "the workflow's JSON file (- for standard input)", Required: true},
					&ucli.BoolFlag{Name: "allow-unknown-kind", Usage: "accept kinds neither this binary nor a live worker knows"},
				},
				Action: workflowsEnqueue,
			},
		},
	}
}

// workflowFile is the JSON form of a workflow for `workflows enqueue`.
type workflowFile struct {
	Name  string         `json:"name"`
	Tasks []workflowSpec `json:"tasks"`
}

type workflowSpec struct {
	Name         string          `json:"name"`
	Kind         string          `json:"kind"`
	Args         json.RawMessage `json:"args"`
	Queue        string          `json:"queue"`
	Priority     *int            `json:"priority"`
	MaxAttempts  int             `json:"max_attempts"`
	After        []string        `json:"after"`
	Tolerate     []string        `json:"tolerate"`
	AfterJobs    []int64         `json:"after_jobs"`
	TolerateJobs []int64         `json:"tolerate_jobs"`
}

func workflowsEnqueue(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "--file FILE"); err != nil {
		return err
	}
	e := envOf(c)
	var data []byte
	var err error
	if f := c.String("file"); f == "-" {
		data, err = io.ReadAll(c.App.Reader)
	} else {
		data, err = os.ReadFile(f)
	}
	if err != nil {
		return usageError{Err: fmt.Errorf("--file: %w", err)}
	}
	var wf workflowFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&wf); err != nil {
		return usageError{Err: fmt.Errorf("--file: not a workflow: %w", err)}
	}
	w := fenceq.NewWorkflow(wf.Name)
	var unknown []string
	for i, t := range wf.Tasks {
		if err := queue.ValidateKind(t.Kind); err != nil {
			return usageError{Err: fmt.Errorf("--file: task %d (%s): %w", i+1, t.Name, err)}
		}
		k, known := e.lookupKind(t.Kind)
		if known && k.ValidateArgs != nil && len(t.Args) > 0 {
			if err := k.ValidateArgs(t.Args); err != nil {
				return usageError{Err: fmt.Errorf("--file: task %s: invalid args for kind %s: %w", t.Name, t.Kind, err)}
			}
		}
		q := t.Queue
		if q == "" && known {
			q = k.Queue
		}
		if !known {
			unknown = append(unknown, t.Kind)
		}
		w.Add(t.Name, fenceq.RawArgs{KindName: t.Kind, JSON: t.Args}, &fenceq.TaskOpts{
			InsertOpts: fenceq.InsertOpts{Queue: q, Priority: t.Priority, MaxAttempts: t.MaxAttempts},
			After:      t.After, Tolerate: t.Tolerate, AfterJobs: t.AfterJobs, TolerateJobs: t.TolerateJobs})
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, kind := range unknown {
		if _, _, err := e.checkKind(c.Context, pool, kind, "--file: ", c.Bool("allow-unknown-kind")); err != nil {
			return err
		}
	}
	res, err := w.Enqueue(c.Context, pool)
	if errors.Is(err, queue.ErrInvalid) {
		return usageError{Err: fmt.Errorf("--file: %w", err)}
	}
	if err != nil {
		return err
	}
	return output(c, res, func(out io.Writer) error {
		fmt.Fprintf(out, "enqueued workflow %d (%s): %d tasks\n", res.ID, wf.Name, len(res.Jobs))
		rows := make([][]string, 0, len(wf.Tasks))
		for _, t := range wf.Tasks {
			rows = append(rows, []string{t.Name, strconv.FormatInt(res.Jobs[t.Name], 10)})
		}
		return table(out, []string{"TASK", "JOB"}, rows)
	})
}

func workflowsList(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--kind workflow|batch] [--limit N]"); err != nil {
		return err
	}
	kind := c.String("kind")
	if kind != "" && kind != queue.WorkflowKindWorkflow && kind != queue.WorkflowKindBatch {
		return usageError{Err: fmt.Errorf("invalid --kind %q: want workflow or batch", kind)}
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
	wfs, err := fenceq.ListWorkflows(c.Context, pool, queue.WorkflowListParams{Kind: kind, Limit: limit})
	if err != nil {
		return err
	}
	if wfs == nil {
		wfs = []*queue.Workflow{}
	}
	return output(c, wfs, func(w io.Writer) error {
		if len(wfs) == 0 {
			_, err := fmt.Fprintln(w, "no workflows")
			return err
		}
		rows := make([][]string, 0, len(wfs))
		for _, wf := range wfs {
			rows = append(rows, []string{strconv.FormatInt(wf.ID, 10), wf.Name, wf.Kind, fmtTime(&wf.CreatedAt),
				stateCounts(wf.States)})
		}
		return table(w, []string{"ID", "NAME", "KIND", "CREATED_AT", "TASKS"}, rows)
	})
}

// stateCounts shows counts by state in the order of queue.JobStates: "2 completed, 1 pending".
func stateCounts(m map[queue.State]int) string {
	var parts []string
	for _, s := range queue.JobStates() {
		if n := m[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	return orDash(strings.Join(parts, ", "))
}

func workflowsShow(c *ucli.Context) error {
	id, err := parseID(c, "workflow id")
	if err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	wf, err := fenceq.GetWorkflow(c.Context, pool, id)
	if errors.Is(err, queue.ErrNotFound) {
		return fmt.Errorf("workflow %d not found", id)
	}
	if err != nil {
		return err
	}
	return output(c, wf, func(w io.Writer) error {
		_ = keyValues(w, [][2]string{
			{"id", strconv.FormatInt(wf.ID, 10)},
			{"name", wf.Name},
			{"kind", wf.Kind},
			{"created_at", fmtTime(&wf.CreatedAt)},
			{"tasks", stateCounts(wf.States)},
		})
		fmt.Fprintln(w)
		rows := make([][]string, 0, len(wf.Tasks))
		for _, t := range wf.Tasks {
			deps := make([]string, len(t.DependsOn))
			for i, d := range t.DependsOn {
				s := d.Task
				if s == "" {
					s = "job " + strconv.FormatInt(d.JobID, 10)
				}
				if d.Tolerate {
					s += " (tolerated)"
				}
				if d.Done {
					s += " ✓"
				}
				deps[i] = s
			}
			blocked := "-"
			if t.BlockedBy != 0 {
				blocked = strconv.FormatInt(t.BlockedBy, 10)
			}
			rows = append(rows, []string{orDash(t.Name), strconv.FormatInt(t.JobID, 10), t.Kind, string(t.State),
				orDash(strings.Join(deps, ", ")), blocked, fmtTime(t.FinishedAt)})
		}
		return table(w, []string{"TASK", "JOB", "KIND", "STATE", "AFTER", "CANCELLED_BY", "FINISHED_AT"}, rows)
	})
}

// signalResult is the JSON of `jobs signal`.
type signalResult struct {
	JobID  int64              `json:"job_id"`
	Name   string             `json:"name"`
	Result queue.SignalResult `json:"result"`
}

func jobsSignal(c *ucli.Context) error {
	if err := needArgs(c, 2, 2, "ID NAME [--payload JSON]"); err != nil {
		return err
	}
	id, err := strconv.ParseInt(c.Args().Get(0), 10, 64)
	if err != nil || id <= 0 {
		return usageError{Err: fmt.Errorf("invalid job id %q: want a positive integer", c.Args().Get(0))}
	}
	name := c.Args().Get(1)
	if err := queue.ValidateName("NAME", name, 64); err != nil {
		return usageError{Err: err}
	}
	var payload any
	if p := c.String("payload"); p != "" {
		if !json.Valid([]byte(p)) {
			return usageError{Err: fmt.Errorf("invalid --payload: not JSON: %s", truncate(p, 60))}
		}
		payload = json.RawMessage(p)
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := fenceq.SendSignal(c.Context, pool, id, name, payload)
	if err != nil {
		return jobError("signal", id, err)
	}
	res := signalResult{JobID: id, Name: name, Result: r}
	return output(c, res, func(w io.Writer) error {
		msg := map[queue.SignalResult]string{
			queue.SignalDelivered: "delivered: the job was waiting for it and is woken",
			queue.SignalKept:      "kept: the job is not waiting for it now; its next wait for it ends at once",
			queue.SignalDuplicate: "already sent before: nothing changed",
		}[r]
		_, err := fmt.Fprintf(w, "signal %s to job %d %s\n", name, id, msg)
		return err
	})
}
