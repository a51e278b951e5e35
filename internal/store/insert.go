package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/queue"
)

// InsertParams describes one job to enqueue. Zero values take the defaults above.
type InsertParams struct {
	Queue string
	Kind  string
	// Args is a JSON object.
	Args []byte
	// Priority: lower runs first, 0–100. Nil means DefaultPriority.
	Priority *int
	// RunAt schedules the job at an absolute time. It wins over RunIn.
	RunAt time.Time
	// RunIn schedules the job this long after the database's now().
	RunIn       time.Duration
	MaxAttempts int
	// UniqueKey, when set, makes a second insert with the same key return the existing
	// job while the first is not finished (available, scheduled, running, retryable).
	// With Unique set too, it is one part of the computed key.
	UniqueKey string
	// Unique makes the job unique by its args, period, queue and a chosen set of states
	// (see UniqueOpts).
	Unique queue.UniqueOpts
	// Tags label the job for operators (ListParams.Tag): at most MaxTags, each like a
	// queue name of at most MaxTagLen characters. Duplicates are dropped.
	Tags []string
	// MaxArgsBytes bounds the size of Args; 0 means DefaultMaxArgsBytes.
	MaxArgsBytes int
	// Metadata is a JSON object stored with the job (nil for none), at most
	// MaxMetadataBytes long.
	Metadata []byte
	// FlowKey puts the job under a flow limit: the limit's name, ":", the partition
	// (queue.FlowOpts.Key). The limit must be set.
	FlowKey string
	// Debounce, when its key is set, makes the insert replace the waiting job of the same
	// kind and key (see queue.DebounceOpts): the job runs Window after the database's now().
	Debounce queue.DebounceOpts

	unique uniqueness // derived by normalize
}

func (p *InsertParams) normalize() error {
	if p.Queue == "" {
		p.Queue = queue.DefaultQueue
	}
	if p.Priority == nil {
		p.Priority = new(queue.DefaultPriority)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = queue.DefaultMaxAttempts
	}
	if len(p.Args) == 0 {
		p.Args = []byte("{}")
	}
	if len(p.Metadata) == 0 {
		p.Metadata = emptyObject
	} else if err := queue.ValidateMetadata(p.Metadata); err != nil {
		return err
	}
	if err := queue.ValidateQueue(p.Queue); err != nil {
		return err
	}
	if p.FlowKey != "" {
		if err := validateFlowKey(p.FlowKey); err != nil {
			return err
		}
	}
	if err := queue.ValidateKind(p.Kind); err != nil {
		return err
	}
	if err := queue.ValidateArgs(p.Args, p.MaxArgsBytes); err != nil {
		return err
	}
	if err := queue.ValidatePriority(*p.Priority); err != nil {
		return err
	}
	if err := queue.ValidateMaxAttempts(p.MaxAttempts); err != nil {
		return err
	}
	if p.RunIn < 0 {
		return invalid("run_in", "%s is negative", p.RunIn)
	}
	// A run_at outside years 1–9999 (UTC) would be stored, but no JSON or RFC 3339 text
	// of the job could show it.
	if y := p.RunAt.UTC().Year(); !p.RunAt.IsZero() && (y < 1 || y > 9999) {
		return invalid("run_at", "%s is outside the years 1–9999 (UTC)", p.RunAt.Format(time.RFC3339))
	}
	tags, err := queue.ValidateTags(p.Tags)
	if err != nil {
		return err
	}
	p.Tags = tags
	if err := p.normalizeUnique(); err != nil {
		return err
	}
	return p.normalizeDebounce()
}

// normalizeDebounce checks p's debounce options: a key and a positive window together,
// and neither a unique key nor a run time beside them (the window decides run_at).
func (p *InsertParams) normalizeDebounce() error {
	d := p.Debounce
	if d.IsZero() {
		return nil
	}
	if d.Key == "" {
		return invalid("debounce.key", "must not be empty (a window of %s was given without a key)", d.Window)
	}
	if err := queue.ValidateUniqueKey("debounce.key", d.Key); err != nil {
		return err
	}
	if d.Window <= 0 {
		return invalid("debounce.window", "%s: want more than 0 (the job waits this long after the latest enqueue)", d.Window)
	}
	if d.MaxWait != 0 && d.MaxWait < d.Window {
		return invalid("debounce.max_wait", "%s: want 0 (no cap) or at least the window, %s", d.MaxWait, d.Window)
	}
	if p.unique.key != "" {
		return invalid("debounce", "cannot be combined with a unique key (unique_key or unique): a debounced job replaces the waiting one instead")
	}
	if !p.RunAt.IsZero() || p.RunIn != 0 {
		return invalid("debounce", "cannot be combined with run_at or run_in: the job runs debounce.window after the latest enqueue")
	}
	return nil
}

// ValidateInsert checks p as Insert would, without touching the database, so that a
// caller can reject bad input before it connects. Errors match ErrInvalid.
func ValidateInsert(p InsertParams) error {
	return p.normalize()
}

func (p *InsertParams) runAt() *time.Time {
	if p.RunAt.IsZero() {
		return nil
	}
	return &p.RunAt
}

// tagsParam is the tags column's value: never NULL.
func (p *InsertParams) tagsParam() []string {
	if p.Tags == nil {
		return []string{}
	}
	return p.Tags
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Insert enqueues one job. With db a pgx.Tx the job is part of that transaction: invisible
// until it commits, gone if it rolls back. Validation errors are returned before the
// database is touched. When the job's unique key is held by another job, nothing is
// inserted and that job comes back with Existing set.
func Insert(ctx context.Context, db queue.DBTX, p InsertParams) (*queue.InsertResult, error) {
	if err := p.normalize(); err != nil {
		return nil, err
	}
	if p.Debounce.Key != "" {
		return insertDebounced(ctx, db, p)
	}
	var res *queue.InsertResult
	err := withConn(ctx, db, func(db queue.DBTX) error {
		var err error
		if res, err = insert(ctx, db, p); err != nil || res.Existing || res.Job.State != queue.StateAvailable {
			return err
		}
		return notifyQueues(ctx, db, []string{p.Queue})
	})
	return res, err
}

func insert(ctx context.Context, db queue.DBTX, p InsertParams) (*queue.InsertResult, error) {
	u := p.unique
	// The holder of the key can leave the states that hold it between our conflicting
	// insert and the read of it (or, for a key per period, the period can end); then the
	// insert is simply tried again.
	if p.FlowKey != "" {
		if err := ensureFlowKey(ctx, db, p.FlowKey); err != nil {
			return nil, err
		}
	}
	for try := 0; try < 5; try++ {
		row := db.QueryRow(ctx, sqlInsertJob, p.Queue, p.Kind, p.Args, *p.Priority, p.runAt(),
			p.MaxAttempts, u.keyParam(), micros(p.RunIn), p.Metadata, u.maskParam(), u.periodUS, p.tagsParam(),
			nullString(p.FlowKey))
		j, err := scanJob(row)
		if err == nil {
			return &queue.InsertResult{Job: j}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("insert %s job into queue %q: %w", p.Kind, p.Queue, err)
		}
		j, err = scanJob(db.QueryRow(ctx, sqlGetUniqueHolder, u.key, u.periodUS, p.runAt(), micros(p.RunIn)))
		if err == nil {
			return &queue.InsertResult{Job: j, Existing: true}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("read the job holding unique key %q: %w", u.key, err)
		}
	}
	return nil, fmt.Errorf("insert %s job with unique key %q: kept racing with the job holding it", p.Kind, u.key)
}

// insertDebounced inserts a debounced job (p normalized, its debounce key set), or gives
// its args and options to the waiting job of the same kind and key: one INSERT … ON
// CONFLICT … DO UPDATE on fenceq_jobs_hot_debounce_idx, which holds only the jobs that
// have not started. A claim that takes the waiting job first moves it out of that index,
// and the insert then adds a new job. The job is scheduled at the end of its window, so no
// queue is notified. With a maximum wait, a replaced job whose window now ends after its
// created_at plus that wait is moved back to that time in the same transaction
// (sqlCapDebounced), and made available if the time has come; a worker then takes it at
// its next poll.
func insertDebounced(ctx context.Context, db queue.DBTX, p InsertParams) (*queue.InsertResult, error) {
	var res *queue.InsertResult
	run := func(db queue.DBTX) error {
		var debounced bool
		j, err := scanJobWith(db.QueryRow(ctx, sqlInsertDebounced, p.Queue, p.Kind, p.Args, *p.Priority,
			micros(p.Debounce.Window), p.MaxAttempts, p.Metadata, p.tagsParam(), p.Debounce.Key), &debounced)
		if err != nil {
			return err
		}
		if deadline := j.CreatedAt.Add(p.Debounce.MaxWait); debounced && p.Debounce.MaxWait > 0 && deadline.Before(j.RunAt) {
			// Available at once when the deadline has come by the database's clock: the
			// replacement set run_at to its now() plus the window.
			id, state := j.ID, queue.StateScheduled
			if now := j.RunAt.Add(-p.Debounce.Window.Truncate(time.Microsecond)); !deadline.After(now) {
				state = queue.StateAvailable
			}
			if j, err = scanJob(db.QueryRow(ctx, sqlCapDebounced, id, deadline, string(state))); err != nil {
				return fmt.Errorf("cap job %d's wait at %s: %w", id, deadline.Format(time.RFC3339Nano), err)
			}
		}
		res = &queue.InsertResult{Job: j, Debounced: debounced}
		return nil
	}
	var err error
	if p.Debounce.MaxWait > 0 {
		err = inTx(ctx, db, run)
	} else {
		err = run(db)
	}
	if err != nil {
		return nil, fmt.Errorf("insert %s job with debounce key %q into queue %q: %w", p.Kind, p.Debounce.Key, p.Queue, err)
	}
	return res, nil
}

// InsertMany enqueues many jobs with COPY and returns how many rows were inserted. Jobs
// whose unique key is held by another job (or by an earlier job of the same batch) are
// skipped. Every job is validated before anything is sent; one invalid job fails the
// whole batch. With db a pgx.Tx the batch is part of that transaction.
func InsertMany(ctx context.Context, db queue.Beginner, ps []InsertParams) (int64, error) {
	simple := true
	for i := range ps {
		if err := ps[i].normalize(); err != nil {
			return 0, fmt.Errorf("job %d of %d: %w", i+1, len(ps), err)
		}
		if ps[i].Debounce.Key != "" {
			return 0, fmt.Errorf("job %d of %d: %w", i+1, len(ps), invalid("debounce",
				"not supported in a batch: enqueue a debounced job on its own (Enqueue)"))
		}
		if ps[i].unique.key != "" || ps[i].runAt() != nil || ps[i].RunIn > 0 || len(ps[i].Metadata) > 2 || len(ps[i].Tags) > 0 ||
			ps[i].FlowKey != "" {
			simple = false
		}
	}
	if len(ps) == 0 {
		return 0, nil
	}
	var n int64
	err := withConn(ctx, db, func(db queue.DBTX) error {
		var err error
		if n, err = insertMany(ctx, db.(queue.Beginner), ps, simple); err != nil || n == 0 {
			return err
		}
		var queues []string
		for i := range ps {
			if ps[i].runAt() == nil && ps[i].RunIn <= 0 {
				queues = append(queues, ps[i].Queue)
			}
		}
		return notifyQueues(ctx, db, queues)
	})
	return n, err
}

func insertMany(ctx context.Context, db queue.Beginner, ps []InsertParams, simple bool) (int64, error) {
	if simple {
		// Every job runs now and has no unique key, no metadata and no tags: COPY
		// straight into the table; the column defaults give run_at = now(), state =
		// available, metadata = '{}' and tags = '{}'.
		n, err := db.CopyFrom(ctx, pgx.Identifier{hotTable},
			[]string{"queue", "kind", "args", "priority", "max_attempts"},
			pgx.CopyFromSlice(len(ps), func(i int) ([]any, error) {
				p := &ps[i]
				return []any{p.Queue, p.Kind, p.Args, int16(*p.Priority), int32(p.MaxAttempts)}, nil
			}))
		if err != nil {
			return n, fmt.Errorf("copy %d jobs: %w", len(ps), err)
		}
		return n, nil
	}
	// Otherwise COPY into a staging table and let one INSERT … SELECT decide run_at,
	// state and the period part of unique keys with the database's clock, and skip the
	// jobs whose key is held (ON CONFLICT DO NOTHING also skips a duplicate of an
	// earlier row of the same statement).
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("copy %d jobs: begin: %w", len(ps), err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sqlCreateStaging); err != nil {
		return 0, fmt.Errorf("copy %d jobs: create staging table: %w", len(ps), err)
	}
	_, err = tx.CopyFrom(ctx, pgx.Identifier{"fenceq_jobs_staging"},
		[]string{"ord", "queue", "kind", "args", "priority", "run_at", "run_in_us", "max_attempts", "unique_key",
			"metadata", "unique_states", "unique_period_us", "tags", "flow_key"},
		pgx.CopyFromSlice(len(ps), func(i int) ([]any, error) {
			p := &ps[i]
			return []any{int32(i), p.Queue, p.Kind, p.Args, int16(*p.Priority), p.runAt(), micros(p.RunIn),
				int32(p.MaxAttempts), p.unique.keyParam(), p.Metadata, p.unique.maskParam(), p.unique.periodUS,
				p.tagsParam(), nullString(p.FlowKey)}, nil
		}))
	if err != nil {
		return 0, fmt.Errorf("copy %d jobs into staging: %w", len(ps), err)
	}
	if slices.ContainsFunc(ps, func(p InsertParams) bool { return p.FlowKey != "" }) {
		var missing *string
		if err := tx.QueryRow(ctx, sqlMissingStagedFlowLimit).Scan(&missing); err != nil {
			return 0, fmt.Errorf("copy %d jobs: look up their flow limits: %w", len(ps), err)
		}
		if missing != nil {
			return 0, limitNotSet(*missing)
		}
		if _, err := tx.Exec(ctx, sqlEnsureStagedFlowKeys); err != nil {
			return 0, fmt.Errorf("copy %d jobs: create their flow keys: %w", len(ps), err)
		}
	}
	var inserted int64
	if err := tx.QueryRow(ctx, sqlInsertFromStaging).Scan(&inserted); err != nil {
		return 0, fmt.Errorf("insert %d staged jobs: %w", len(ps), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("copy %d jobs: commit: %w", len(ps), err)
	}
	return inserted, nil
}
