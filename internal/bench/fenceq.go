package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

type noopArgs benchArgs

func (noopArgs) Kind() string { return kindNoop }

type fencedArgs benchArgs

func (fencedArgs) Kind() string { return kindFenced }

// fenceqSystem runs the workloads through fenceq's public API: Worker, Enqueue,
// EnqueueMany (COPY) and Job.Commit.
type fenceqSystem struct{ cfg Config }

func newFenceqSystem(cfg Config) *fenceqSystem { return &fenceqSystem{cfg: cfg} }

func (s *fenceqSystem) name() string     { return SystemFenceq }
func (s *fenceqSystem) jobTable() string { return "fenceq_jobs_hot" }

func (s *fenceqSystem) workerConfig(hs *fenceq.Handlers, hooks ...fenceq.Hook) fenceq.Config {
	queues := make(map[string]fenceq.QueueConfig, len(s.cfg.queueNames))
	for _, q := range s.cfg.queueNames {
		queues[q] = fenceq.QueueConfig{MaxWorkers: s.cfg.slotsPerQueue()}
	}
	return fenceq.Config{
		Handlers:       hs,
		Queues:         queues,
		ClaimBatchSize: s.cfg.ClaimBatch,
		Logger:         s.cfg.Logger,
		Hooks:          hooks,
	}
}

func (s *fenceqSystem) describe() string {
	c := s.effectiveConfig()
	var b strings.Builder
	fmt.Fprintf(&b, "fenceq worker, %s MaxWorkers=%d, ClaimBatchSize=%d, CompleteBatchSize=%d, ",
		queuesPhrase(s.cfg), s.cfg.slotsPerQueue(), c.ClaimBatchSize, c.CompleteBatchSize)
	fmt.Fprintf(&b, "LeaseDuration=%s, HeartbeatInterval=%s, PollInterval=%s, LISTEN/NOTIFY on; ",
		c.LeaseDuration, c.HeartbeatInterval, c.PollInterval)
	commit := "Job.Commit"
	if s.cfg.CommitWrites {
		commit = "Job.CommitWrites (one pipeline)"
	}
	fmt.Fprintf(&b, "pool of %d conns; inserts via EnqueueMany (COPY) and Enqueue; fenced jobs via %s", s.cfg.Conns, commit)
	if s.cfg.NoSearchIndexes {
		b.WriteString("; history's search indexes dropped (" + strings.Join(searchIndexes, ", ") + ")")
	}
	return b.String()
}

// effectiveConfig is the worker config with the engine's defaults applied, as a worker
// reports it. The pool is never used: it connects lazily, and the worker never starts.
func (s *fenceqSystem) effectiveConfig() fenceq.Config {
	pool, err := pgxpool.New(context.Background(), s.cfg.DatabaseURL)
	if err != nil {
		return s.workerConfig(nil)
	}
	defer pool.Close()
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[noopArgs]) error { return nil }, nil)
	w, err := fenceq.NewWorker(pool, s.workerConfig(hs))
	if err != nil {
		return s.workerConfig(nil)
	}
	return w.Config()
}

func (s *fenceqSystem) setup(ctx context.Context, e *env) error {
	if err := migrations.Up(ctx, e.pool); err != nil {
		return err
	}
	if s.cfg.NoSearchIndexes {
		for _, ix := range searchIndexes {
			if _, err := e.admin.Exec(ctx, "DROP INDEX "+ix); err != nil {
				return fmt.Errorf("drop search index %s: %w", ix, err)
			}
		}
	}
	if s.cfg.FlowPartitions > 0 {
		return fenceq.SetFlowLimit(ctx, e.pool, queue.FlowLimit{Name: benchFlowLimit, MaxRunning: 1})
	}
	return nil
}

// searchIndexes are fenceq_jobs_history's indexes that serve searches only.
var searchIndexes = []string{
	"fenceq_jobs_history_queue_idx", "fenceq_jobs_history_kind_idx", "fenceq_jobs_history_args_idx",
	"fenceq_jobs_history_metadata_idx", "fenceq_jobs_history_tags_idx", "fenceq_jobs_history_error_idx",
	"fenceq_jobs_history_failed_idx", "fenceq_jobs_history_created_brin",
}

// benchFlowLimit is the flow limit of --compare-flow's limited side.
const benchFlowLimit = "bench"

// opts are the insert options of the job with this sequence number: its queue, and its
// flow partition when the run puts jobs under a limit (nil for neither).
func (s *fenceqSystem) opts(seq int64) *fenceq.InsertOpts {
	var o *fenceq.InsertOpts
	if q := s.cfg.queueOf(seq); q != "default" {
		o = &fenceq.InsertOpts{Queue: q}
	}
	if n := int64(s.cfg.FlowPartitions); n > 0 {
		if o == nil {
			o = &fenceq.InsertOpts{}
		}
		o.Flow = queue.FlowOpts{Limit: benchFlowLimit, Partition: strconv.FormatInt(seq%n, 10)}
	}
	return o
}

func (s *fenceqSystem) insertBatch(ctx context.Context, e *env, kind string, seqs []int64) error {
	items := make([]fenceq.EnqueueItem, len(seqs))
	for i, seq := range seqs {
		items[i].Args = s.args(kind, seq)
		items[i].Opts = s.opts(seq)
	}
	n, err := fenceq.EnqueueMany(ctx, e.pool, items)
	if err != nil {
		return err
	}
	if n != int64(len(seqs)) {
		return fmt.Errorf("inserted %d of %d jobs", n, len(seqs))
	}
	return nil
}

func (s *fenceqSystem) insertOne(ctx context.Context, e *env, kind string, seq int64) error {
	_, err := fenceq.Enqueue(ctx, e.pool, s.args(kind, seq), s.opts(seq))
	return err
}

// args are the args of the job with this kind and sequence number.
func (s *fenceqSystem) args(kind string, seq int64) fenceq.JobArgs {
	if kind == kindFenced {
		return fencedArgs{Seq: seq, Pad: s.cfg.padding}
	}
	return noopArgs{Seq: seq, Pad: s.cfg.padding}
}

// retain inserts finished jobs from and to into history, after making the partitions
// that will hold their ids, as a worker does ahead of the jobs it runs: without them the
// rows would all land in the default partition. Then it counts them in the job
// counters, as the workers that finished them would have: otherwise the run's first
// roll-up would count every retained job, inside the measured run.
func (s *fenceqSystem) retain(ctx context.Context, e *env, from, to int64) error {
	if _, _, err := store.ExtendHistory(ctx, e.admin, to-from+1); err != nil {
		return err
	}
	if _, err := e.admin.Exec(ctx, sqlRetainFenceq, from, to); err != nil {
		return err
	}
	return rollUpCounters(ctx, e.pool)
}

// rollUpCounters rolls the job counters up until a roll-up counts nothing more.
func rollUpCounters(ctx context.Context, pool *pgxpool.Pool) error {
	for {
		r, err := fenceq.RollupJobCounts(ctx, pool)
		if err != nil {
			return fmt.Errorf("roll up the job counters: %w", err)
		}
		if !r.Skipped && r.Jobs == 0 {
			return nil
		}
	}
}

// completionCounter is a hook that reports each completed attempt.
type completionCounter struct {
	done func(n int)
}

func (c completionCounter) JobFinished(_ context.Context, _ *queue.JobRow, res fenceq.AttemptResult) {
	if res.Outcome == fenceq.OutcomeCompleted {
		c.done(1)
	}
}

func (s *fenceqSystem) start(ctx context.Context, e *env, h hooks) (func(context.Context) error, error) {
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(ctx context.Context, j *fenceq.Job[noopArgs]) error {
		h.started(j.Args.Seq)
		defer h.handlerReturned()
		pause(ctx, s.cfg.JobSleep)
		return nil
	}, nil)
	fenceq.AddHandler(hs, func(ctx context.Context, j *fenceq.Job[fencedArgs]) error {
		h.started(j.Args.Seq)
		defer h.handlerReturned()
		pause(ctx, s.cfg.JobSleep)
		if s.cfg.CommitWrites {
			return j.CommitWrites(ctx, resultWrites(j.ID))
		}
		return j.Commit(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return writeResult(ctx, tx, j.ID)
		})
	}, nil)
	w, err := fenceq.NewWorker(e.pool, s.workerConfig(hs, completionCounter{done: h.done}))
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	return w.Stop, nil
}

// writeResult writes the fenced workload's result row and outbox row in tx.
func writeResult(ctx context.Context, tx pgx.Tx, jobID int64) error {
	if _, err := tx.Exec(ctx, sqlInsertResult, jobID, "ok"); err != nil {
		return fmt.Errorf("insert result of job %d: %w", jobID, err)
	}
	key := fmt.Sprintf("bench-result:%d", jobID)
	if _, err := tx.Exec(ctx, sqlInsertOutbox, key, fmt.Sprintf(`{"job_id": %d}`, jobID)); err != nil {
		return fmt.Errorf("insert outbox row of job %d: %w", jobID, err)
	}
	return nil
}

// resultWrites are writeResult's statements, for Job.CommitWrites.
func resultWrites(jobID int64) *fenceq.Writes {
	w := &fenceq.Writes{}
	w.Exec(sqlInsertResult, jobID, "ok")
	w.Exec(sqlInsertOutbox, fmt.Sprintf("bench-result:%d", jobID), fmt.Sprintf(`{"job_id": %d}`, jobID))
	return w
}

func (s *fenceqSystem) verify(ctx context.Context, e *env) (total, completed, once int64, err error) {
	err = e.admin.QueryRow(ctx, sqlVerifyFenceq).Scan(&total, &completed, &once)
	return total, completed, once, err
}
