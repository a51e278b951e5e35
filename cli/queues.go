package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func queuesCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "queues",
		Usage: "list, pause, resume or limit queues",
		Subcommands: []*ucli.Command{
			{Name: "list", Usage: "list queues with their unfinished jobs by state and the jobs finished in the last 24 hours",
				Action: queuesList},
			{Name: "pause", Usage: "stop workers claiming from a queue (running jobs continue)", ArgsUsage: "QUEUE",
				Action: queuesPause(true)},
			{Name: "resume", Usage: "let workers claim from a paused queue again", ArgsUsage: "QUEUE",
				Action: queuesPause(false)},
			{Name: "limit", Usage: "run at most N of a queue's jobs at once across every worker (0 removes the limit)",
				ArgsUsage: "QUEUE N", Action: queuesLimit},
		},
	}
}

func queuesList(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	qs, err := listQueues(c, pool)
	if err != nil {
		return err
	}
	return output(c, qs, func(w io.Writer) error {
		if len(qs) == 0 {
			_, err := fmt.Fprintln(w, "no queues")
			return err
		}
		headers := append([]string{"QUEUE", "PAUSED"}, stateHeaders()...)
		rows := make([][]string, 0, len(qs))
		for _, q := range qs {
			r := []string{q.Name, yesNo(q.Paused)}
			for _, st := range queue.JobStates() {
				r = append(r, strconv.FormatInt(q.Counts[st], 10))
			}
			rows = append(rows, r)
		}
		return table(w, headers, rows)
	})
}

// countersStale is how old the job counters may be before a command that shows finished
// counts rolls them up itself (no worker running, or none up to date), as the dashboard
// does.
const countersStale = 15 * time.Second

// listQueues returns fenceq.ListQueues, after rolling the job counters up when no
// roll-up ran within countersStale. A roll-up that fails (a role that may not write
// fenceq's tables) is reported on stderr and the counts are shown as they are.
func listQueues(c *ucli.Context, pool *pgxpool.Pool) ([]queue.QueueInfo, error) {
	ctx := c.Context
	if _, err := fenceq.RollupJobCountsIfStale(ctx, pool, countersStale); err != nil {
		fmt.Fprintf(c.App.ErrWriter, "%s: warning: the finished counts may be behind: %v\n", c.App.Name, err)
	}
	qs, err := fenceq.ListQueues(ctx, pool)
	if err != nil {
		return nil, err
	}
	if qs == nil {
		qs = []queue.QueueInfo{}
	}
	return qs, nil
}

// stateHeaders are the column headers of the job states, the final ones marked as
// counting the last 24 hours.
func stateHeaders() []string {
	var out []string
	for _, st := range queue.JobStates() {
		h := strings.ToUpper(string(st))
		if st.Final() {
			h += " (24H)"
		}
		out = append(out, h)
	}
	return out
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

type pauseResult struct {
	Queue  string `json:"queue"`
	Paused bool   `json:"paused"`
}

// limitResult is the JSON output of `queues limit`.
type limitResult struct {
	Queue      string `json:"queue"`
	MaxRunning int    `json:"max_running"`
}

func queuesLimit(c *ucli.Context) error {
	if err := needArgs(c, 2, 2, "QUEUE N"); err != nil {
		return err
	}
	name := c.Args().Get(0)
	if err := queue.ValidateQueue(name); err != nil {
		return usageError{Err: err}
	}
	n, err := strconv.Atoi(c.Args().Get(1))
	if err != nil || n < 0 {
		return usageError{Err: fmt.Errorf("invalid N %q: want the most running jobs, a whole number (0 removes the limit)", c.Args().Get(1))}
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := fenceq.SetQueueLimit(c.Context, pool, name, n); err != nil {
		return err
	}
	return output(c, limitResult{Queue: name, MaxRunning: n}, func(w io.Writer) error {
		if n == 0 {
			_, err := fmt.Fprintf(w, "queue %s: no limit\n", name)
			return err
		}
		_, err := fmt.Fprintf(w, "queue %s: at most %d jobs running at once, across every worker\n", name, n)
		return err
	})
}

func queuesPause(paused bool) ucli.ActionFunc {
	return func(c *ucli.Context) error {
		if err := needArgs(c, 1, 1, "QUEUE"); err != nil {
			return err
		}
		name := c.Args().First()
		if err := queue.ValidateQueue(name); err != nil {
			return usageError{Err: err}
		}
		pool, err := openSchema(c, 2)
		if err != nil {
			return err
		}
		defer pool.Close()
		setPaused := fenceq.ResumeQueue
		if paused {
			setPaused = fenceq.PauseQueue
		}
		if err := setPaused(c.Context, pool, name); err != nil {
			return err
		}
		return output(c, pauseResult{Queue: name, Paused: paused}, func(w io.Writer) error {
			verb := "resumed"
			if paused {
				verb = "paused: workers claim nothing from it until `fenceq queues resume " + name + "`"
			}
			_, err := fmt.Fprintf(w, "queue %s %s\n", name, verb)
			return err
		})
	}
}

func workersCommand() *ucli.Command {
	return &ucli.Command{
		Name:   "workers",
		Usage:  "list live worker processes, their heartbeats and running jobs",
		Action: workersList,
	}
}

func workersList(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	ws, err := fenceq.ListWorkers(c.Context, pool)
	if err != nil {
		return err
	}
	if ws == nil {
		ws = []queue.WorkerInfo{}
	}
	return output(c, ws, func(w io.Writer) error {
		if len(ws) == 0 {
			_, err := fmt.Fprintln(w, "no live workers")
			return err
		}
		rows := make([][]string, 0, len(ws))
		for _, wk := range ws {
			started := wk.StartedAt
			rows = append(rows, []string{wk.ID, wk.Host, strconv.Itoa(wk.PID), strings.Join(wk.Queues, ","),
				fmtTime(&started), fmtAge(wk.HeartbeatAge) + " ago", strconv.FormatInt(wk.RunningJobs, 10)})
		}
		return table(w, []string{"ID", "HOST", "PID", "QUEUES", "STARTED", "HEARTBEAT", "RUNNING"}, rows)
	})
}
