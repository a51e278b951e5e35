package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
type ceilingSystem struct {
	cfg Config
	fq  *fenceqSystem // inserts and verification are fenceq's
}

func newCeilingSystem(cfg Config) *ceilingSystem {
	return &ceilingSystem{cfg: cfg, fq: newFenceqSystem(cfg)}
}

func (s *ceilingSystem) name() string     { return SystemCeiling }
func (s *ceilingSystem) jobTable() string { return "fenceq_jobs" }

func (s *ceilingSystem) describe() string {
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

func (s *ceilingSystem) retain(ctx context.Context, e *env, n int) error {
	return s.fq.retain(ctx, e, n)
}

func (s *ceilingSystem) start(ctx context.Context, e *env, h hooks) (func(context.Context) error, error) {
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
