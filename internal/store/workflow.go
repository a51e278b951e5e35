package store

// Dependencies, workflows, batches, signals and waits (migration 000016). The decisions —
// releasing a job whose dependencies are done, cancelling the dependents of a failed
// job, bringing them back on its retry, waking a wait — are taken by the database, in
// the SQL functions and triggers of that migration, in the transaction of the write that
// ends a job; the statements here call them and read their tables.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceq/fenceq/queue"
)

// flowErr translates the errors of the flow functions: QF001 invalid input, QF002 lease
// lost, QF003 wrong state, QF004 not found; others are returned as they are.
func flowErr(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "QF001":
		field := pe.ColumnName
		reason, _ := strings.CutPrefix(pe.Message, "invalid "+field+": ")
		return &queue.ValidationError{Field: field, Reason: reason}
	case "QF002":
		return fmt.Errorf("%s: %w", pe.Message, queue.ErrLeaseLost)
	case "QF003":
		return fmt.Errorf("%s: %w", pe.Message, queue.ErrWrongState)
	case "QF004":
		return fmt.Errorf("%s: %w", pe.Message, queue.ErrNotFound)
	}
	return err
}

// CreateWorkflow inserts a workflow (or batch, by kind) and returns its id.
func CreateWorkflow(ctx context.Context, db queue.DBTX, name, kind string) (int64, error) {
	if err := queue.ValidateName("name", name, 128); err != nil {
		return 0, err
	}
	var id int64
	if err := db.QueryRow(ctx, `INSERT INTO fenceq_workflows (name, kind) VALUES ($1, $2) RETURNING id`,
		name, kind).Scan(&id); err != nil {
		return 0, fmt.Errorf("create %s %q: %w", kind, name, err)
	}
	return id, nil
}

// Link describes a job's dependencies and its place in a workflow, for LinkJob.
type Link struct {
	// Deps are the jobs it runs after; Tolerate those of them whose discard or cancel
	// counts as done.
	Deps, Tolerate []int64
	// Workflow and Task place it in a workflow (0 and "" for none).
	Workflow int64
	Task     string
	// DepCounts records the dependencies' final states in its metadata when it is
	// released (a batch's callback).
	DepCounts bool
}

// LinkJob gives job id, just inserted and not yet started, its dependencies and its
// place in a workflow (fenceq_flow_link), and returns its state afterwards: pending while
// a dependency is not done, cancelled when one already failed without being tolerated.
func LinkJob(ctx context.Context, db queue.DBTX, id int64, l Link) (queue.State, error) {
	var wf *int64
	if l.Workflow != 0 {
		wf = &l.Workflow
	}
	deps, tol := l.Deps, l.Tolerate
	if deps == nil {
		deps = []int64{}
	}
	if tol == nil {
		tol = []int64{}
	}
	var st string
	err := db.QueryRow(ctx, `SELECT fenceq_flow_link($1, $2, $3, $4, $5, $6)`,
		id, deps, tol, wf, nullString(l.Task), l.DepCounts).Scan(&st)
	if err != nil {
		return "", fmt.Errorf("link job %d to its dependencies: %w", id, flowErr(err))
	}
	return queue.State(st), nil
}

// SendSignal sends signal name with payload (JSON, nil for none) to job id in db's
// transaction (fenceq_flow_send).
func SendSignal(ctx context.Context, db queue.DBTX, id int64, name string, payload []byte) (queue.SignalResult, error) {
	if err := queue.ValidateName("name", name, 64); err != nil {
		return "", err
	}
	var p any
	if payload != nil {
		p = string(payload)
	}
	var res string
	if err := db.QueryRow(ctx, `SELECT fenceq_flow_send($1, $2, $3::jsonb)`, id, name, p).Scan(&res); err != nil {
		return "", fmt.Errorf("send signal %s to job %d: %w", name, id, flowErr(err))
	}
	return queue.SignalResult(res), nil
}

// WaitParams say what an attempt waits for.
type WaitParams struct {
	// Signal is the name of the signal waited for; empty for a timer.
	Signal string
	// Timeout ends the wait that long after the database's now() (0: no timeout, for a
	// signal only). Until, when set, is the end instead.
	Timeout time.Duration
	Until   time.Time
}

// Wait ends the attempt of lease l with a wait (fenceq_flow_wait): the job releases its
// lease without using up an attempt and becomes pending (a signal without timeout) or
// scheduled at the wait's end; a signal already sent ends the wait at once. A lease no
// longer held writes nothing, records a stale_write_rejected event and returns an error
// matching ErrLeaseLost. It returns the job's new state.
func Wait(ctx context.Context, db queue.DBTX, l queue.Lease, p WaitParams) (queue.State, error) {
	if p.Signal != "" {
		if err := queue.ValidateName("signal", p.Signal, 64); err != nil {
			return "", err
		}
	} else if p.Timeout <= 0 && p.Until.IsZero() {
		return "", invalid("timeout", "a timer needs a positive duration or an instant")
	}
	if p.Timeout < 0 {
		return "", invalid("timeout", "%s is negative", p.Timeout)
	}
	var until *time.Time
	if !p.Until.IsZero() {
		until = &p.Until
	}
	var timeout *int64
	if p.Timeout > 0 {
		us := micros(p.Timeout)
		timeout = &us
	}
	var st string
	err := db.QueryRow(ctx, `
SELECT fenceq_flow_wait($1, $2, $3, COALESCE($4::timestamptz, now() + $5::bigint * interval '1 microsecond'))`,
		l.JobID, l.Gen, nullString(p.Signal), until, timeout).Scan(&st)
	if err != nil {
		err = flowErr(err)
		if errors.Is(err, queue.ErrLeaseLost) {
			if rerr := RecordStaleWrite(ctx, db, l, "wait"); rerr != nil {
				return "", errors.Join(err, rerr)
			}
		}
		return "", fmt.Errorf("wait of job %d: %w", l.JobID, err)
	}
	return queue.State(st), nil
}

// SignalStatus is what a job has of a signal (JobSignal).
type SignalStatus struct {
	// Signal is the signal sent, if any.
	Signal *queue.Signal
	// Wait is the job's latest wait, if any.
	Wait *queue.Wait
}

// JobSignal reads signal name of job id, and the job's latest wait.
func JobSignal(ctx context.Context, db queue.DBTX, id int64, name string) (*SignalStatus, error) {
	var st SignalStatus
	var s queue.Signal
	var sent *time.Time
	var w queue.Wait
	var wsig *string
	var wgen *int64
	var waited *time.Time
	err := db.QueryRow(ctx, `
SELECT s.payload, s.sent_at, s.delivered_at, s.delivered_gen, w.signal, w.gen, w.waited_at, w.deadline
FROM (SELECT $1::bigint AS id) x
LEFT JOIN fenceq_signals s ON s.job_id = x.id AND s.name = $2
LEFT JOIN fenceq_job_waits w ON w.job_id = x.id`, id, name).Scan(&s.Payload, &sent, &s.DeliveredAt, &s.DeliveredGen,
		&wsig, &wgen, &waited, &w.Deadline)
	if err != nil {
		return nil, fmt.Errorf("read signal %s of job %d: %w", name, id, err)
	}
	if sent != nil {
		s.JobID, s.Name, s.SentAt = id, name, *sent
		st.Signal = &s
	}
	if wgen != nil {
		if wsig != nil {
			w.Signal = *wsig
		}
		w.Gen, w.WaitedAt = *wgen, *waited
		st.Wait = &w
	}
	return &st, nil
}

// ListSignals returns the signals sent to job id, by name.
func ListSignals(ctx context.Context, db queue.DBTX, id int64) ([]queue.Signal, error) {
	rows, err := db.Query(ctx, `
SELECT job_id, name, payload, sent_at, delivered_at, delivered_gen FROM fenceq_signals
WHERE job_id = $1 ORDER BY name`, id)
	if err != nil {
		return nil, fmt.Errorf("list signals of job %d: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queue.Signal, error) {
		var s queue.Signal
		return s, r.Scan(&s.JobID, &s.Name, &s.Payload, &s.SentAt, &s.DeliveredAt, &s.DeliveredGen)
	})
	if err != nil {
		return nil, fmt.Errorf("list signals of job %d: %w", id, err)
	}
	return out, nil
}

// DependencyOutput reads the state and recorded output of task of the workflow job id
// belongs to. It returns ErrNotFound when job id is in no workflow or its workflow has
// no such task.
func DependencyOutput(ctx context.Context, db queue.DBTX, id int64, task string) (queue.State, json.RawMessage, error) {
	var st string
	var out []byte
	err := db.QueryRow(ctx, `
SELECT j.state, j.output
FROM fenceq_flow_jobs me
JOIN fenceq_flow_jobs t ON t.workflow_id = me.workflow_id AND t.task = $2
JOIN fenceq_jobs j ON j.id = t.job_id
WHERE me.job_id = $1`, id, task).Scan(&st, &out)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, fmt.Errorf("task %q in the workflow of job %d: %w", task, id, queue.ErrNotFound)
	}
	if err != nil {
		return "", nil, fmt.Errorf("read output of task %q in the workflow of job %d: %w", task, id, err)
	}
	return queue.State(st), out, nil
}

// WorkflowOf returns the workflow (and its kind) job id belongs to, or 0.
func WorkflowOf(ctx context.Context, db queue.DBTX, id int64) (int64, error) {
	var wf *int64
	err := db.QueryRow(ctx, `SELECT workflow_id FROM fenceq_flow_jobs WHERE job_id = $1`, id).Scan(&wf)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && wf == nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the workflow of job %d: %w", id, err)
	}
	return *wf, nil
}

// sqlWorkflowStates counts the tasks of the workflows in $1 by state.
const sqlWorkflowStates = `
SELECT f.workflow_id, j.state, count(*)::int
FROM fenceq_flow_jobs f JOIN fenceq_jobs j ON j.id = f.job_id
WHERE f.workflow_id = ANY($1::bigint[])
GROUP BY f.workflow_id, j.state`

// ListWorkflows returns the newest workflows (and batches), with their tasks' counts by
// state.
func ListWorkflows(ctx context.Context, db queue.DBTX, p queue.WorkflowListParams) ([]*queue.Workflow, error) {
	if p.Kind != "" && p.Kind != queue.WorkflowKindWorkflow && p.Kind != queue.WorkflowKindBatch {
		return nil, invalid("kind", "%q is not %s or %s", p.Kind, queue.WorkflowKindWorkflow, queue.WorkflowKindBatch)
	}
	if p.BeforeID < 0 {
		return nil, invalid("before_id", "%d is negative", p.BeforeID)
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	rows, err := db.Query(ctx, `
SELECT id, name, kind, created_at FROM fenceq_workflows
WHERE ($1::text = '' OR kind = $1) AND ($2::bigint = 0 OR id < $2)
ORDER BY id DESC LIMIT $3`, p.Kind, p.BeforeID, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list workflows: %w", err)
	}
	wfs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*queue.Workflow, error) {
		w := &queue.Workflow{States: map[queue.State]int{}}
		return w, r.Scan(&w.ID, &w.Name, &w.Kind, &w.CreatedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("list workflows: %w", err)
	}
	if err := workflowStates(ctx, db, wfs); err != nil {
		return nil, err
	}
	return wfs, nil
}

func workflowStates(ctx context.Context, db queue.DBTX, wfs []*queue.Workflow) error {
	if len(wfs) == 0 {
		return nil
	}
	ids := make([]int64, len(wfs))
	by := make(map[int64]*queue.Workflow, len(wfs))
	for i, w := range wfs {
		ids[i], by[w.ID] = w.ID, w
	}
	rows, err := db.Query(ctx, sqlWorkflowStates, ids)
	if err != nil {
		return fmt.Errorf("count workflow tasks: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var st string
		var n int
		if err := rows.Scan(&id, &st, &n); err != nil {
			return fmt.Errorf("count workflow tasks: %w", err)
		}
		by[id].States[queue.State(st)] = n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("count workflow tasks: %w", err)
	}
	return nil
}

// GetWorkflow returns workflow id with its tasks and their dependencies, or ErrNotFound.
func GetWorkflow(ctx context.Context, db queue.DBTX, id int64) (*queue.Workflow, error) {
	w := &queue.Workflow{ID: id, States: map[queue.State]int{}}
	err := db.QueryRow(ctx, `SELECT name, kind, created_at FROM fenceq_workflows WHERE id = $1`, id).
		Scan(&w.Name, &w.Kind, &w.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("workflow %d: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get workflow %d: %w", id, err)
	}
	rows, err := db.Query(ctx, `
SELECT f.job_id, COALESCE(f.task, ''), j.kind, j.queue, j.state, f.deps_left, COALESCE(f.blocked_by, 0),
       j.attempted_at, j.finished_at,
       COALESCE((SELECT jsonb_agg(jsonb_build_object('job_id', d.dep_id, 'task', COALESCE(t.task, ''),
                    'tolerate', d.tolerate, 'done', d.done) ORDER BY d.dep_id)
                 FROM fenceq_job_deps d LEFT JOIN fenceq_flow_jobs t ON t.job_id = d.dep_id AND t.workflow_id = f.workflow_id
                 WHERE d.job_id = f.job_id), '[]')
FROM fenceq_flow_jobs f JOIN fenceq_jobs j ON j.id = f.job_id
WHERE f.workflow_id = $1
ORDER BY f.job_id`, id)
	if err != nil {
		return nil, fmt.Errorf("get tasks of workflow %d: %w", id, err)
	}
	w.Tasks, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (queue.WorkflowTask, error) {
		var t queue.WorkflowTask
		var st string
		var deps []byte
		if err := r.Scan(&t.JobID, &t.Name, &t.Kind, &t.Queue, &st, &t.DepsLeft, &t.BlockedBy,
			&t.AttemptedAt, &t.FinishedAt, &deps); err != nil {
			return t, err
		}
		t.State = queue.State(st)
		return t, json.Unmarshal(deps, &t.DependsOn)
	})
	if err != nil {
		return nil, fmt.Errorf("get tasks of workflow %d: %w", id, err)
	}
	for _, t := range w.Tasks {
		w.States[t.State]++
	}
	return w, nil
}
