package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// RiverVersion is the River release the benchmark compares with.
const RiverVersion = "v0.51.2"

// River's own benchmark (cmd/river bench) tunes its client with these; they are the
// best settings its authors found for throughput, so River is measured at its best.
const (
	riverFetchCooldown     = 2 * time.Millisecond
	riverFetchPollInterval = 20 * time.Millisecond
)

type riverNoopArgs benchArgs

func (riverNoopArgs) Kind() string { return kindNoop }

type riverFencedArgs benchArgs

func (riverFencedArgs) Kind() string { return kindFenced }

type riverNoopWorker struct {
	river.WorkerDefaults[riverNoopArgs]
	h     hooks
	sleep time.Duration
}

func (w *riverNoopWorker) Work(ctx context.Context, j *river.Job[riverNoopArgs]) error {
	w.h.started(j.Args.Seq)
	defer w.h.handlerReturned()
	pause(ctx, w.sleep)
	return nil
}

type riverFencedWorker struct {
	river.WorkerDefaults[riverFencedArgs]
	h     hooks
	sleep time.Duration
	pool  interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}
}

// Work commits the result and outbox rows with the job's completion in one
// transaction, River's transactional completion (JobCompleteTx).
func (w *riverFencedWorker) Work(ctx context.Context, j *river.Job[riverFencedArgs]) error {
	w.h.started(j.Args.Seq)
	defer w.h.handlerReturned()
	pause(ctx, w.sleep)
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := writeResult(ctx, tx, j.ID); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, j); err != nil {
		return fmt.Errorf("complete job %d: %w", j.ID, err)
	}
	return tx.Commit(ctx)
}

// riverSystem runs the workloads through River's public API, in River's own tables
// (its migrations, in the run's schema).
type riverSystem struct {
	cfg Config
	mu  sync.Mutex
	// inserters holds each run's insert-only client, by schema.
	inserters map[string]riverInserter
}

// riverInserter is an insert-only client and the pool it was made for (the pool is
// replaced before the measured phase).
type riverInserter struct {
	c    *river.Client[pgx.Tx]
	pool *pgxpool.Pool
}

func newRiverSystem(cfg Config) *riverSystem {
	return &riverSystem{cfg: cfg, inserters: map[string]riverInserter{}}
}

func (s *riverSystem) name() string     { return SystemRiver }
func (s *riverSystem) jobTable() string { return "river_job" }

func (s *riverSystem) describe() string {
	return fmt.Sprintf("River %s client (riverpgxv5), %s MaxWorkers=%d, FetchCooldown=%s, "+
		"FetchPollInterval=%s (the settings of River's own benchmark), other settings default; "+
		"pool of %d conns; inserts via InsertManyFast (COPY) and Insert; fenced jobs via JobCompleteTx",
		RiverVersion, queuesPhrase(s.cfg), s.cfg.slotsPerQueue(), riverFetchCooldown, riverFetchPollInterval, s.cfg.Conns)
}

func (s *riverSystem) setup(ctx context.Context, e *env) error {
	drv := riverpgxv5.New(e.pool)
	m, err := rivermigrate.New(drv, &rivermigrate.Config{Logger: s.cfg.Logger})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate up: %w", err)
	}
	return nil
}

// inserter returns the run's insert-only client, bound to the env's current pool.
func (s *riverSystem) inserter(e *env) (*river.Client[pgx.Tx], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in, ok := s.inserters[e.schema]; ok && in.pool == e.pool {
		return in.c, nil
	}
	c, err := river.NewClient(riverpgxv5.New(e.pool), &river.Config{Logger: s.cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("river insert client: %w", err)
	}
	s.inserters[e.schema] = riverInserter{c: c, pool: e.pool}
	return c, nil
}

func (s *riverSystem) insertBatch(ctx context.Context, e *env, kind string, seqs []int64) error {
	c, err := s.inserter(e)
	if err != nil {
		return err
	}
	ps := make([]river.InsertManyParams, len(seqs))
	for i, seq := range seqs {
		ps[i].Args = s.args(kind, seq)
		ps[i].InsertOpts = s.insertOpts(seq)
	}
	n, err := c.InsertManyFast(ctx, ps)
	if err != nil {
		return err
	}
	if n != len(seqs) {
		return fmt.Errorf("inserted %d of %d jobs", n, len(seqs))
	}
	return nil
}

func (s *riverSystem) insertOne(ctx context.Context, e *env, kind string, seq int64) error {
	c, err := s.inserter(e)
	if err != nil {
		return err
	}
	_, err = c.Insert(ctx, s.args(kind, seq), s.insertOpts(seq))
	return err
}

// args are the args of the job with this kind and sequence number.
func (s *riverSystem) args(kind string, seq int64) river.JobArgs {
	if kind == kindFenced {
		return riverFencedArgs{Seq: seq, Pad: s.cfg.padding}
	}
	return riverNoopArgs{Seq: seq, Pad: s.cfg.padding}
}

// insertOpts name the queue of the job with this sequence number, unless it is the
// default queue.
func (s *riverSystem) insertOpts(seq int64) *river.InsertOpts {
	if q := s.cfg.queueOf(seq); q != river.QueueDefault {
		return &river.InsertOpts{Queue: q}
	}
	return nil
}

func (s *riverSystem) retain(ctx context.Context, e *env, from, to int64) error {
	_, err := e.admin.Exec(ctx, sqlRetainRiver, from, to)
	return err
}

func (s *riverSystem) start(ctx context.Context, e *env, h hooks) (func(context.Context) error, error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverNoopWorker{h: h, sleep: s.cfg.JobSleep})
	river.AddWorker(workers, &riverFencedWorker{h: h, sleep: s.cfg.JobSleep, pool: e.pool})
	queues := make(map[string]river.QueueConfig, len(s.cfg.queueNames))
	for _, q := range s.cfg.queueNames {
		queues[q] = river.QueueConfig{MaxWorkers: s.cfg.slotsPerQueue()}
	}
	c, err := river.NewClient(riverpgxv5.New(e.pool), &river.Config{
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: riverFetchPollInterval,
		Logger:            s.cfg.Logger,
		Queues:            queues,
		Workers:           workers,
	})
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	// Completions are counted from River's own completion events, which it emits once
	// the completer has written them (as River's benchmark counts).
	events, cancel := c.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: max(e.cfg.Jobs, 100_000),
		Kinds:    []river.EventKind{river.EventKindJobCompleted},
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ev := range events {
			if ev != nil && ev.Kind == river.EventKindJobCompleted {
				h.done(1)
			}
		}
	}()
	if err := c.Start(ctx); err != nil {
		cancel()
		wg.Wait()
		return nil, fmt.Errorf("start river client: %w", err)
	}
	return func(ctx context.Context) error {
		err := c.Stop(ctx)
		cancel()
		wg.Wait()
		s.mu.Lock()
		delete(s.inserters, e.schema)
		s.mu.Unlock()
		return err
	}, nil
}

func (s *riverSystem) verify(ctx context.Context, e *env) (total, completed, once int64, err error) {
	err = e.admin.QueryRow(ctx, sqlVerifyRiver).Scan(&total, &completed, &once)
	return total, completed, once, err
}
