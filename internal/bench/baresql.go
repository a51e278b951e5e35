package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/migrations"
)

// ceilingBatch is the claim and completion batch of the bare-SQL ceiling.
const ceilingBatch = 1000

// ceilingSystem is the bare-SQL ceiling: on fenceq's own table, with the full claim
// index of the reference protocol (see sqlCeilingIndex), a few claimers loop over the
// reference claim (from the start of the claim order, LIMIT 1000, FOR UPDATE SKIP
// LOCKED, lease generation bumped) and one batched fenced completion per claim (UPDATE
// … FROM unnest(ids, gens) WHERE lease_gen = gen). No handler, no bookkeeping: what the
// database alone can do for this protocol.
//
// In the fenced workload the claimers hand each claimed job to one of Conns committers,
// which sends the job's whole fenced transaction as one pipeline, in one round trip:
// BEGIN, the lock (FOR UPDATE, lease_gen), the result row, the outbox row, the fenced
// completion, COMMIT. That is the fewest round trips a transaction per job can take.
type ceilingSystem struct {
	cfg Config
	fq  *fenceqSystem // inserts and verification are fenceq's
}

func newCeilingSystem(cfg Config) *ceilingSystem {
	return &ceilingSystem{cfg: cfg, fq: newFenceqSystem(cfg)}
}

func (s *ceilingSystem) name() string     { return SystemCeiling }
func (s *ceilingSystem) jobTable() string { return "fenceq_jobs_hot" }

func (s *ceilingSystem) describe() string {
	if s.cfg.Workload == WorkloadFenced {
		return fmt.Sprintf("bare SQL on fenceq_jobs with the reference full claim index (state, queue, priority, run_at, id): "+
			"%d claimers looping the reference claim from the start (LIMIT %d, SKIP LOCKED, lease_gen + 1) feed %d committers, "+
			"each job one transaction in one pipelined round trip (BEGIN; lock FOR UPDATE on lease_gen; result row; outbox row; "+
			"fenced completion; COMMIT); pool of %d conns",
			s.cfg.CeilingClaimers, ceilingBatch, s.cfg.Conns, s.cfg.Conns)
	}
	return fmt.Sprintf("bare SQL on fenceq_jobs with the reference full claim index (state, queue, priority, run_at, id): "+
		"%d claimers, each looping the reference claim from the start (LIMIT %d, SKIP LOCKED, lease_gen + 1) then one batched fenced "+
		"completion (unnest(ids, gens), lease_gen = gen); pool of %d conns",
		s.cfg.CeilingClaimers, ceilingBatch, s.cfg.Conns)
}

func (s *ceilingSystem) setup(ctx context.Context, e *env) error {
	if err := migrations.Up(ctx, e.pool); err != nil {
		return err
	}
	for _, q := range sqlCeilingIndex {
		if _, err := e.admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("create the full claim index: %w", err)
		}
	}
	return nil
}

func (s *ceilingSystem) insertBatch(ctx context.Context, e *env, kind string, seqs []int64) error {
	return s.fq.insertBatch(ctx, e, kind, seqs)
}

func (s *ceilingSystem) insertOne(ctx context.Context, e *env, kind string, seq int64) error {
	return s.fq.insertOne(ctx, e, kind, seq)
}

func (s *ceilingSystem) retain(ctx context.Context, e *env, from, to int64) error {
	return s.fq.retain(ctx, e, from, to)
}

func (s *ceilingSystem) start(ctx context.Context, e *env, h hooks) (func(context.Context) error, error) {
	if s.cfg.Workload == WorkloadFenced {
		return s.startFenced(ctx, e, h)
	}
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, s.cfg.CeilingClaimers)
	for i := range s.cfg.CeilingClaimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.claimLoop(cctx, e, fmt.Sprintf("ceiling-%d", i), h); err != nil && cctx.Err() == nil {
				errs <- err
			}
		}()
	}
	return func(context.Context) error {
		cancel()
		wg.Wait()
		close(errs)
		return <-errs
	}, nil
}

func (s *ceilingSystem) claimLoop(ctx context.Context, e *env, id string, h hooks) error {
	ids := make([]int64, 0, ceilingBatch)
	gens := make([]int64, 0, ceilingBatch)
	for ctx.Err() == nil {
		ids, gens = ids[:0], gens[:0]
		rows, err := e.pool.Query(ctx, sqlCeilingClaim, ceilingBatch, id)
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		for rows.Next() {
			var jid, gen int64
			if err := rows.Scan(&jid, &gen); err != nil {
				rows.Close()
				return fmt.Errorf("claim: %w", err)
			}
			ids, gens = append(ids, jid), append(gens, gen)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		if len(ids) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Millisecond):
			}
			continue
		}
		tag, err := e.pool.Exec(ctx, sqlCeilingComplete, ids, gens)
		if err != nil {
			return fmt.Errorf("complete: %w", err)
		}
		if tag.RowsAffected() != int64(len(ids)) {
			return errors.Join(errVerify, fmt.Errorf("completed %d of %d claimed jobs", tag.RowsAffected(), len(ids)))
		}
		h.done(len(ids))
	}
	return nil
}

func (s *ceilingSystem) verify(ctx context.Context, e *env) (total, completed, once int64, err error) {
	return s.fq.verify(ctx, e)
}

// ceilingIdleMax is the longest wait of the fenced ceiling's claimers between empty
// claims.
const ceilingIdleMax = 100 * time.Millisecond

// ceilingLease is one job claimed by the fenced ceiling.
type ceilingLease struct{ id, gen int64 }

func (s *ceilingSystem) startFenced(ctx context.Context, e *env, h hooks) (func(context.Context) error, error) {
	cctx, cancel := context.WithCancel(ctx)
	work := make(chan ceilingLease, ceilingBatch)
	var wg sync.WaitGroup
	errs := make(chan error, s.cfg.CeilingClaimers+s.cfg.Conns)
	for i := range s.cfg.CeilingClaimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.feedLoop(cctx, e, fmt.Sprintf("ceiling-%d", i), work); err != nil && cctx.Err() == nil {
				errs <- err
			}
		}()
	}
	for range s.cfg.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-cctx.Done():
					return
				case l := <-work:
					if err := commitFencedCeiling(cctx, e, l); err != nil {
						if cctx.Err() == nil {
							errs <- err
						}
						return
					}
					h.done(1)
				}
			}
		}()
	}
	return func(context.Context) error {
		cancel()
		wg.Wait()
		close(errs)
		return <-errs
	}, nil
}

// feedLoop claims jobs and hands them to the committers. The fenced workload's jobs
// are all inserted before it starts, so once they are claimed every claim comes back
// empty, and each walks the claim index from its start: the waits between empty claims
// double up to ceilingIdleMax, so that they do not take the server's CPU from the
// committers.
func (s *ceilingSystem) feedLoop(ctx context.Context, e *env, id string, work chan<- ceilingLease) error {
	claimed := make([]ceilingLease, 0, ceilingBatch)
	idle := time.Millisecond
	for ctx.Err() == nil {
		claimed = claimed[:0]
		rows, err := e.pool.Query(ctx, sqlCeilingClaim, ceilingBatch, id)
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		for rows.Next() {
			var l ceilingLease
			if err := rows.Scan(&l.id, &l.gen); err != nil {
				rows.Close()
				return fmt.Errorf("claim: %w", err)
			}
			claimed = append(claimed, l)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		if len(claimed) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(idle):
			}
			idle = min(2*idle, ceilingIdleMax)
			continue
		}
		idle = time.Millisecond
		for _, l := range claimed {
			select {
			case <-ctx.Done():
				return nil
			case work <- l:
			}
		}
	}
	return nil
}

// commitFencedCeiling sends one job's fenced transaction as one pipeline.
func commitFencedCeiling(ctx context.Context, e *env, l ceilingLease) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(sqlCeilingLock, l.id, l.gen)
	b.Queue(sqlInsertResult, l.id, "ok")
	b.Queue(sqlInsertOutbox, fmt.Sprintf("bench-result:%d", l.id), fmt.Sprintf(`{"job_id": %d}`, l.id))
	b.Queue(sqlCeilingCompleteOne, l.id, l.gen)
	b.Queue("COMMIT")
	br := e.pool.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("begin job %d: %w", l.id, err)
	}
	var state string
	if err := br.QueryRow().Scan(&state); err != nil {
		return errors.Join(errVerify, fmt.Errorf("lock job %d at generation %d: %w", l.id, l.gen, err))
	}
	for _, what := range []string{"insert result", "insert outbox row"} {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s of job %d: %w", what, l.id, err)
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return fmt.Errorf("complete job %d: %w", l.id, err)
	}
	if tag.RowsAffected() != 1 {
		return errors.Join(errVerify, fmt.Errorf("completion of job %d matched %d rows", l.id, tag.RowsAffected()))
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("commit job %d: %w", l.id, err)
	}
	return br.Close()
}
