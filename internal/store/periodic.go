package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fenceq/fenceq/queue"
	"github.com/jackc/pgx/v5"
)

// periodicArgs are the parameters of sqlUpsertPeriodic and sqlInsertPeriodic for p
// (normalized): its definition, and the unique key, tags and metadata its jobs get,
// checked and derived as an enqueue of its kind, args and queue would.
func periodicArgs(p *queue.PeriodicParams) ([]any, error) {
	ip := InsertParams{Queue: p.Queue, Kind: p.Kind, Args: p.Args, Priority: p.Priority, MaxAttempts: p.MaxAttempts,
		UniqueKey: p.UniqueKey, Unique: p.Unique, Tags: p.Tags, Metadata: p.Metadata}
	if err := ip.normalize(); err != nil {
		return nil, err
	}
	return []any{p.Name, p.Spec, p.Timezone, p.Kind, p.Args, p.Queue, *p.Priority, p.MaxAttempts,
		string(p.Missed), p.RunOnStart, string(p.Source), p.NoOverlap, ip.unique.keyParam(), ip.unique.maskParam(),
		ip.unique.periodUS, ip.tagsParam(), ip.Metadata}, nil
}

// PeriodicJobOptions returns the unique key (its fixed part; nil for none), the states
// in which it is held, its period, the tags and the metadata that the jobs of p
// (normalized) get, as its row stores them.
func PeriodicJobOptions(p queue.PeriodicParams) (key *string, states []queue.State, period time.Duration,
	tags []string, meta []byte, err error) {
	ip := InsertParams{Queue: p.Queue, Kind: p.Kind, Args: p.Args, Priority: p.Priority, MaxAttempts: p.MaxAttempts,
		UniqueKey: p.UniqueKey, Unique: p.Unique, Tags: p.Tags, Metadata: p.Metadata}
	if err := ip.normalize(); err != nil {
		return nil, nil, 0, nil, nil, err
	}
	if ip.unique.key != "" {
		states = ip.unique.mask.States()
	}
	return ip.unique.keyParam(), states, time.Duration(ip.unique.periodUS) * time.Microsecond, ip.Tags, ip.Metadata, nil
}

// ValidatePeriodicJobs checks the options the jobs of p (normalized) get, as an enqueue
// of its kind, args and queue would: its unique key and options, tags and metadata.
// Errors match ErrInvalid and name the field.
func ValidatePeriodicJobs(p queue.PeriodicParams) error {
	_, err := periodicArgs(&p)
	return err
}

func scanPeriodic(row pgx.Row, readAt bool) (*queue.PeriodicRow, error) {
	var r queue.PeriodicRow
	var prio int16
	var missed, source string
	var mask *int16
	var periodUS int64
	dest := []any{&r.Name, &r.Spec, &r.Timezone, &r.Kind, &r.EncodedArgs, &r.Queue, &prio, &r.MaxAttempts,
		&missed, &r.RunOnStart, &r.Paused, &r.LastSlot, &r.LastEnqueuedSlot, &source, &r.CreatedAt, &r.UpdatedAt,
		&r.NoOverlap, &r.LastSkippedSlot, &r.SkippedSlots, &r.UniqueKey, &mask, &periodUS, &r.Tags, &r.Metadata}
	if readAt {
		dest = append(dest, &r.ReadAt)
	}
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	r.Priority, r.Missed, r.Source = int(prio), queue.MissedPolicy(missed), queue.PeriodicSource(source)
	if mask != nil {
		r.UniqueStates = StateMask(*mask).States()
	}
	r.UniquePeriod = time.Duration(periodUS) * time.Microsecond
	return &r, nil
}

// UpsertPeriodic defines schedules from code in one transaction: new rows are
// inserted, changed definitions replaced; paused, last_slot and last_enqueued_slot are
// kept. Every schedule is checked (Normalize) before anything is written. It returns the
// database's now() of the transaction: a worker calls it at its start, and slots after
// that instant fell due while that worker was running.
func UpsertPeriodic(ctx context.Context, db queue.Beginner, ps []queue.PeriodicParams) (time.Time, error) {
	ps = slices.Clone(ps)
	args := make(map[string][]any, len(ps))
	for i := range ps {
		err := ps[i].Normalize()
		if err == nil {
			args[ps[i].Name], err = periodicArgs(&ps[i])
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("periodic schedule %q: %w", ps[i].Name, err)
		}
	}
	var now time.Time
	if len(ps) == 0 {
		if err := db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return time.Time{}, fmt.Errorf("upsert periodic schedules: read the time: %w", err)
		}
		return now, nil
	}
	// One order for every worker starting at once, so concurrent upserts cannot deadlock.
	slices.SortFunc(ps, func(a, b queue.PeriodicParams) int { return strings.Compare(a.Name, b.Name) })
	tx, err := db.Begin(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("upsert periodic schedules: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for i := range ps {
		if _, err := tx.Exec(ctx, sqlUpsertPeriodic, args[ps[i].Name]...); err != nil {
			return time.Time{}, fmt.Errorf("upsert periodic schedule %q: %w", ps[i].Name, err)
		}
	}
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("upsert periodic schedules: read the time: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, fmt.Errorf("upsert periodic schedules: commit: %w", err)
	}
	return now, nil
}

// InsertPeriodic adds one schedule; a schedule of that name existing already is
// ErrExists. Its first slot is the first after the database's now().
func InsertPeriodic(ctx context.Context, db queue.DBTX, p queue.PeriodicParams) (*queue.PeriodicRow, error) {
	if err := p.Normalize(); err != nil {
		return nil, err
	}
	args, err := periodicArgs(&p)
	if err != nil {
		return nil, err
	}
	r, err := scanPeriodic(db.QueryRow(ctx, sqlInsertPeriodic, args...), false)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("periodic schedule %q: %w", p.Name, queue.ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("insert periodic schedule %q: %w", p.Name, err)
	}
	return r, nil
}

// ListPeriodic returns every schedule, by name.
func ListPeriodic(ctx context.Context, db queue.DBTX) ([]*queue.PeriodicRow, error) {
	rows, err := db.Query(ctx, sqlListPeriodic)
	if err != nil {
		return nil, fmt.Errorf("list periodic schedules: %w", err)
	}
	defer rows.Close()
	var out []*queue.PeriodicRow
	for rows.Next() {
		r, err := scanPeriodic(rows, true)
		if err != nil {
			return nil, fmt.Errorf("list periodic schedules: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list periodic schedules: %w", err)
	}
	return out, nil
}

// periodicOne runs a statement returning one schedule row (and now()), ErrNotFound when
// no schedule has the name.
func periodicOne(ctx context.Context, db queue.DBTX, op, name, sql string, args ...any) (*queue.PeriodicRow, error) {
	r, err := scanPeriodic(db.QueryRow(ctx, sql, append([]any{name}, args...)...), true)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("periodic schedule %q: %w", name, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("%s periodic schedule %q: %w", op, name, err)
	}
	return r, nil
}

// GetPeriodic returns one schedule, or ErrNotFound.
func GetPeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.PeriodicRow, error) {
	return periodicOne(ctx, db, "get", name, sqlGetPeriodic)
}

// SetPeriodicPaused pauses or resumes a schedule (ErrNotFound when none has the name).
// A paused schedule enqueues nothing; resuming it passes over the slots that fell due
// meanwhile, so the next job is the next slot's. The state is a row, so it survives
// restarts of every worker.
func SetPeriodicPaused(ctx context.Context, db queue.DBTX, name string, paused bool) (*queue.PeriodicRow, error) {
	return periodicOne(ctx, db, "pause", name, sqlSetPeriodicPaused, paused)
}

// RemovePeriodic deletes a schedule and returns it (ErrNotFound when none has the
// name). Jobs it enqueued stay. A schedule defined in code comes back at the next start
// of a worker that defines it.
func RemovePeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.PeriodicRow, error) {
	return periodicOne(ctx, db, "remove", name, sqlRemovePeriodic)
}

// TriggerPeriodic enqueues one job of a schedule now, with metadata
// {"periodic": {"name": …, "triggered": true, "at": …}}, and leaves its slots alone: the
// next slot is enqueued as usual. ErrNotFound when no schedule has the name.
func TriggerPeriodic(ctx context.Context, db queue.DBTX, name string) (*queue.JobRow, error) {
	var j *queue.JobRow
	var found bool
	err := withConn(ctx, db, func(db queue.DBTX) error {
		var err error
		if j, err = scanJob(db.QueryRow(ctx, sqlTriggerPeriodic, name)); err != nil {
			return err
		}
		return notifyQueues(ctx, db, []string{j.Queue})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		if err := db.QueryRow(ctx, `SELECT true FROM fenceq_periodic WHERE name = $1`, name).Scan(&found); err == nil {
			return nil, fmt.Errorf("trigger periodic schedule %q: nothing enqueued, the unique key of its jobs is held by another job (%w)",
				name, queue.ErrWrongState)
		}
		return nil, fmt.Errorf("periodic schedule %q: %w", name, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("trigger periodic schedule %q: %w", name, err)
	}
	return j, nil
}

// PeriodicClock is what fenceq_periodic_clock says: when a worker last completed a
// scheduling pass (nil: never), and the database's now() when it was read.
type PeriodicClock struct {
	HeartbeatAt *time.Time `json:"heartbeat_at"`
	ReadAt      time.Time  `json:"read_at"`
}

// ReadPeriodicClock reads the clock row without locking it.
func ReadPeriodicClock(ctx context.Context, db queue.DBTX) (PeriodicClock, error) {
	var c PeriodicClock
	err := db.QueryRow(ctx, sqlReadPeriodicClock).Scan(&c.HeartbeatAt, &c.ReadAt)
	if errors.Is(err, pgx.ErrNoRows) {
		err = db.QueryRow(ctx, `SELECT now()`).Scan(&c.ReadAt)
	}
	if err != nil {
		return c, fmt.Errorf("read periodic clock: %w", err)
	}
	return c, nil
}

// LockPeriodicClock starts a scheduling pass in tx: it waits for and locks the clock
// row (serializing passes across workers) and returns when a pass last completed (nil:
// never). idle bounds how long the session may then sit idle in tx before the server
// disconnects it, releasing the lock.
func LockPeriodicClock(ctx context.Context, tx pgx.Tx, idle time.Duration) (*time.Time, error) {
	ms := strconv.FormatInt(max(idle.Milliseconds(), 1), 10) + "ms"
	for try := 0; ; try++ {
		var hb *time.Time
		var setting string
		err := tx.QueryRow(ctx, sqlLockPeriodicClock, ms).Scan(&hb, &setting)
		if errors.Is(err, pgx.ErrNoRows) && try == 0 {
			// The migration inserts the row; put it back if someone deleted it.
			if _, err := tx.Exec(ctx, sqlEnsurePeriodicClock); err != nil {
				return nil, fmt.Errorf("lock periodic clock: insert its row: %w", err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lock periodic clock: %w", err)
		}
		return hb, nil
	}
}

// DuePeriodic is one schedule as a scheduling pass reads it.
type DuePeriodic struct {
	Name       string
	Spec       string
	Timezone   string
	Missed     queue.MissedPolicy
	RunOnStart bool
	LastSlot   time.Time
	// NoOverlap: the schedule skips slots while a job of it is unfinished.
	NoOverlap bool
}

// ReadDuePeriodic returns, in a pass holding the clock row, the database's time and
// every schedule that is not paused.
func ReadDuePeriodic(ctx context.Context, tx pgx.Tx) (time.Time, []DuePeriodic, error) {
	rows, err := tx.Query(ctx, sqlDuePeriodic)
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("read periodic schedules: %w", err)
	}
	defer rows.Close()
	var now time.Time
	var out []DuePeriodic
	for rows.Next() {
		var name, spec, tz, missed *string
		var ros, noOverlap *bool
		var last *time.Time
		if err := rows.Scan(&now, &name, &spec, &tz, &missed, &ros, &last, &noOverlap); err != nil {
			return time.Time{}, nil, fmt.Errorf("read periodic schedules: %w", err)
		}
		if name == nil {
			continue // no schedule: the row of the outer join carries only the time
		}
		out = append(out, DuePeriodic{Name: *name, Spec: *spec, Timezone: *tz, Missed: queue.MissedPolicy(*missed),
			RunOnStart: *ros, LastSlot: *last, NoOverlap: *noOverlap})
	}
	if err := rows.Err(); err != nil {
		return time.Time{}, nil, fmt.Errorf("read periodic schedules: %w", err)
	}
	return now, out, nil
}

// PeriodicEnqueue is what a pass decided for one schedule: last_slot moves from From
// to To, and one job is inserted per element of Metadata (JSON objects, in order), for
// the slot of the same index in Slots. NoOverlap is the schedule's as the pass read it:
// the statement then enqueues the first slot only if no job of the schedule is
// unfinished, and skips the rest.
type PeriodicEnqueue struct {
	Name, Spec, Timezone string
	From, To             time.Time
	Metadata             []string
	Slots                []time.Time
	NoOverlap            bool
}

// PeriodicOutcome is what EnqueuePeriodic did.
type PeriodicOutcome struct {
	// Matched: the compare-and-set matched (nothing else happened otherwise).
	Matched bool
	// Inserted jobs; fewer than planned when a unique key was held or slots were skipped.
	Inserted int64
	// Skipped slots: planned, and decided without a job because a job of the schedule was
	// unfinished (no overlap). SkippedSlot is the newest of them.
	Skipped     int64
	SkippedSlot time.Time
	// Unfinished is the id of an unfinished job of the schedule that made it skip (0
	// when it skipped only the slots after the one it enqueued).
	Unfinished int64
}

// EnqueuePeriodic applies one schedule's decision in tx: a compare-and-set of last_slot
// from From to To on the definition the slots were computed from (name, spec,
// timezone, no_overlap, not paused), and only if it matched, the jobs. A schedule
// removed, paused, redefined or advanced by someone else since it was read does not
// match, and nothing is inserted.
//
// With NoOverlap, whether a job of the schedule is unfinished is read in the same
// statement: if one is, every slot is skipped; otherwise the first is enqueued and the
// rest are skipped (they would overlap it). Passes are serialized by the clock row, and
// each statement reads the jobs committed before it, so a pass sees the job of the pass
// before it; a job that finishes while the statement runs counts as unfinished, and its
// slot is skipped.
func EnqueuePeriodic(ctx context.Context, tx pgx.Tx, e PeriodicEnqueue) (PeriodicOutcome, error) {
	var o PeriodicOutcome
	if len(e.Slots) != len(e.Metadata) {
		return o, fmt.Errorf("enqueue periodic schedule %q: %d slots for %d jobs", e.Name, len(e.Slots), len(e.Metadata))
	}
	metas, slots := e.Metadata, e.Slots
	if metas == nil {
		metas, slots = []string{}, []time.Time{}
	}
	var n int64
	var q *string
	var skippedSlot *time.Time
	var busy *int64
	if err := tx.QueryRow(ctx, sqlEnqueuePeriodic, e.Name, e.From, e.To, e.Spec, e.Timezone, metas, slots, e.NoOverlap).
		Scan(&n, &o.Inserted, &q, &o.Skipped, &skippedSlot, &busy); err != nil {
		return o, fmt.Errorf("enqueue periodic schedule %q: %w", e.Name, err)
	}
	o.Matched = n == 1
	if !o.Matched {
		return PeriodicOutcome{}, nil
	}
	if skippedSlot != nil {
		o.SkippedSlot = *skippedSlot
	}
	if busy != nil {
		o.Unfinished = *busy
	}
	if o.Inserted > 0 && q != nil {
		if err := notifyQueues(ctx, tx, []string{*q}); err != nil {
			return o, fmt.Errorf("enqueue periodic schedule %q: %w", e.Name, err)
		}
	}
	return o, nil
}

// EnqueueOnStart inserts the one job of a run-on-start schedule in tx, with metadata
// meta. It reports whether the schedule still existed unpaused.
func EnqueueOnStart(ctx context.Context, tx pgx.Tx, name string, meta []byte) (bool, error) {
	var id int64
	var q string
	err := tx.QueryRow(ctx, sqlEnqueueOnStart, name, meta).Scan(&id, &q)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err == nil {
		err = notifyQueues(ctx, tx, []string{q})
	}
	if err != nil {
		return false, fmt.Errorf("enqueue run-on-start job of periodic schedule %q: %w", name, err)
	}
	return true, nil
}

// TouchPeriodicClock ends a pass in tx: a pass completed at now (the time the pass read).
func TouchPeriodicClock(ctx context.Context, tx pgx.Tx, now time.Time) error {
	if _, err := tx.Exec(ctx, sqlTouchPeriodicClock, now); err != nil {
		return fmt.Errorf("touch periodic clock: %w", err)
	}
	return nil
}
