package cli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

func statsCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "stats",
		Usage: "jobs per queue and state (finished: the last 24 hours), lease events in the last hour, outbox backlog, workers, periodic schedules",
		Flags: []ucli.Flag{
			&ucli.DurationFlag{Name: "window", Value: time.Hour, Usage: "count lease events over this window"},
		},
		Action: stats,
	}
}

type statsReport struct {
	Queues      []queue.QueueInfo              `json:"queues"`
	Window      string                         `json:"lease_event_window"`
	LeaseEvents map[queue.LeaseEventKind]int64 `json:"lease_events"`
	Workers     int                            `json:"workers"`
	// UnknownKinds counts the waiting jobs that no live worker of their queue has a
	// handler for (`fenceq jobs list --unknown-kinds` lists them).
	UnknownKinds int64                `json:"unknown_kind_jobs"`
	Outbox       *outbox.Backlog      `json:"outbox"`
	Snapshot     *fenceqprom.Snapshot `json:"database"`
	Periodic     periodicSummary      `json:"periodic"`
}

func stats(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	if err := positiveDurations(c, "window"); err != nil {
		return err
	}
	pool, err := openSchema(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	ctx := c.Context
	rep := statsReport{Window: c.Duration("window").String()}
	if rep.Queues, err = listQueues(c, pool); err != nil {
		return err
	}
	if rep.LeaseEvents, err = fenceq.CountLeaseEvents(ctx, pool, c.Duration("window")); err != nil {
		return err
	}
	ws, err := fenceq.ListWorkers(ctx, pool)
	if err != nil {
		return err
	}
	rep.Workers = len(ws)
	if rep.UnknownKinds, err = fenceq.CountUnknownKinds(ctx, pool, 0); err != nil {
		return err
	}
	if rep.Snapshot, err = fenceqprom.TakeSnapshot(ctx, pool); err != nil {
		return err
	}
	rep.Periodic = summarizePeriodic(rep.Snapshot.Periodic)
	ob, err := outbox.Stats(ctx, pool)
	if err != nil {
		return err
	}
	rep.Outbox = &ob
	return output(c, rep, func(w io.Writer) error {
		headers := append([]string{"QUEUE"}, stateHeaders()...)
		total := map[queue.State]int64{}
		rows := make([][]string, 0, len(rep.Queues)+1)
		for _, q := range rep.Queues {
			name := q.Name
			if q.Paused {
				name += " (paused)"
			}
			r := []string{name}
			for _, st := range queue.JobStates() {
				r = append(r, strconv.FormatInt(q.Counts[st], 10))
				total[st] += q.Counts[st]
			}
			rows = append(rows, r)
		}
		r := []string{"total"}
		for _, st := range queue.JobStates() {
			r = append(r, strconv.FormatInt(total[st], 10))
		}
		rows = append(rows, r)
		if err := table(w, headers, rows); err != nil {
			return err
		}
		fmt.Fprintf(w, "\nlease events in the last %s:\n", fmtAge(c.Duration("window")))
		er := make([][]string, 0, len(queue.LeaseEventKinds()))
		for _, k := range queue.LeaseEventKinds() {
			er = append(er, []string{string(k), strconv.FormatInt(rep.LeaseEvents[k], 10)})
		}
		if err := table(w, []string{"EVENT", "COUNT"}, er); err != nil {
			return err
		}
		fmt.Fprintln(w)
		s := rep.Snapshot
		kv := [][2]string{{"live workers", strconv.Itoa(rep.Workers)},
			{"jobs no live worker can run", fmt.Sprintf("%d (fenceq jobs list --unknown-kinds)", rep.UnknownKinds)}}
		kv = append(kv, [2]string{"outbox pending", fmt.Sprintf("%d (oldest pending for %s)", s.OutboxPending, fmtAge(s.OutboxOldestPendingAge))},
			[2]string{"outbox failed", strconv.FormatInt(rep.Outbox.Failed, 10)},
			[2]string{"outbox orphaned", strconv.FormatInt(rep.Outbox.Orphaned, 10)})
		kv = append(kv, [2]string{"oldest open transaction", fmtAge(s.OldestTransactionAge)},
			[2]string{"idle in transaction", strconv.FormatInt(s.IdleInTransaction, 10)},
			[2]string{"periodic schedules", rep.Periodic.line()})
		return keyValues(w, kv)
	})
}
