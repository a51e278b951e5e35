package fenceq

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// PeriodicMaxCatchUp bounds the jobs one scheduling pass enqueues for one schedule
// while catching up slots that fell due during a short hiccup. Slots past the bound
// are treated as missed (the schedule's queue.MissedPolicy), so no schedule can flood its
// queue.
const PeriodicMaxCatchUp = 100

// PeriodicJob is a schedule defined in code: a name, a spec, and the job each slot
// enqueues. Put it in Config.Periodic; the worker upserts it into fenceq_periodic at
// Start, keeping its paused state and last slot.
type PeriodicJob struct {
	name string
	spec string
	args JobArgs
	opts PeriodicOpts
}

// PeriodicOpts tunes a PeriodicJob. Every field is optional.
type PeriodicOpts struct {
	// Timezone is the IANA zone whose wall clock the cron fields are read on. Defaults
	// to UTC.
	Timezone string
	// Queue, Priority and MaxAttempts of every job the schedule enqueues. They default
	// to the args' InsertOpts (JobArgsWithInsertOpts), then to the queue package's
	// defaults.
	Queue       string
	Priority    *int
	MaxAttempts int
	// Missed is the policy for slots that fell due while every worker was down.
	// Defaults to queue.MissedSkip.
	Missed queue.MissedPolicy
	// RunOnStart enqueues one job when a scheduling pass finds that every worker was
	// down (no pass completed within PeriodicGrace): at the first start, and after every
	// outage. Its metadata says run_on_start instead of a slot.
	RunOnStart bool
	// NoOverlap skips a slot while the previous run is unfinished: while any job the
	// schedule enqueued (for a slot, a trigger or a run on start) is not completed,
	// discarded or cancelled. A skipped slot is decided like any other (it is never
	// enqueued later), counted in the schedule's row (PeriodicRow.SkippedSlots,
	// LastSkippedSlot), logged and told to PeriodicSkippedHook. The database decides, in
	// the statement that moves the schedule's last slot.
	NoOverlap bool
}

// NewPeriodicJob returns a schedule named name (1–64 letters, digits and _ . : -) that
// enqueues a job with args at every slot of spec (see Schedule for the forms). The
// args are encoded once and stored with the schedule, so every worker enqueues the same
// job, whichever defined it. opts may be nil. Errors in any of them are reported by
// NewWorker, naming the field.
func NewPeriodicJob(name, spec string, args JobArgs, opts *PeriodicOpts) *PeriodicJob {
	pj := &PeriodicJob{name: name, spec: spec, args: args}
	if opts != nil {
		pj.opts = *opts
	}
	return pj
}

// Name returns the schedule's name.
func (pj *PeriodicJob) Name() string { return pj.name }

// Params returns the schedule as stored, checked: errors name the field.
func (pj *PeriodicJob) Params() (queue.PeriodicParams, error) {
	if pj.args == nil {
		return queue.PeriodicParams{}, invalidField("args", "schedule %q has no job args", pj.name)
	}
	// The kind's InsertOpts, as an Enqueue of the args would apply them: queue,
	// priority, attempts, unique key, tags and metadata. The origin of each job is added
	// to the metadata when it is enqueued.
	o := mergeOpts(pj.args, nil, false)
	if !o.Debounce.IsZero() {
		return queue.PeriodicParams{}, invalidField("debounce",
			"kind %s's InsertOpts set Debounce, which periodic jobs cannot apply (each slot is its own job)", pj.args.Kind())
	}
	ip, err := insertParams(pj.args, o)
	if err != nil {
		if errors.Is(err, queue.ErrInvalid) {
			return queue.PeriodicParams{}, err
		}
		return queue.PeriodicParams{}, invalidField("args", "%v", err)
	}
	p := queue.PeriodicParams{Name: pj.name, Spec: pj.spec, Timezone: pj.opts.Timezone, Kind: pj.args.Kind(),
		Args: ip.Args, Queue: o.Queue, Priority: o.Priority, MaxAttempts: o.MaxAttempts, Missed: pj.opts.Missed,
		RunOnStart: pj.opts.RunOnStart, Source: queue.SourceCode, NoOverlap: pj.opts.NoOverlap,
		UniqueKey: ip.UniqueKey, Unique: ip.Unique, Tags: ip.Tags, Metadata: ip.Metadata}
	if pj.opts.Queue != "" {
		p.Queue = pj.opts.Queue
	}
	if pj.opts.Priority != nil {
		p.Priority = pj.opts.Priority
	}
	if pj.opts.MaxAttempts != 0 {
		p.MaxAttempts = pj.opts.MaxAttempts
	}
	if _, err := ValidatePeriodic(&p); err != nil {
		return queue.PeriodicParams{}, err
	}
	return p, nil
}

// ValidatePeriodic applies the defaults to p and checks every field, the spec and the
// zone included, without touching the database, and returns the parsed schedule.
// Errors are *queue.ValidationError naming the field (they match queue.ErrInvalid).
func ValidatePeriodic(p *queue.PeriodicParams) (*Schedule, error) {
	if err := p.Normalize(); err != nil {
		return nil, err
	}
	if err := store.ValidatePeriodicJobs(*p); err != nil {
		return nil, err
	}
	return ParseSchedule(p.Spec, p.Timezone)
}

// AddPeriodic adds a schedule (source cli unless p.Source says otherwise); a schedule
// of the same name existing already is an error matching queue.ErrExists. Its first
// slot is the first after the database's now(). Nothing is written when p is invalid.
func AddPeriodic(ctx context.Context, db queue.DBTX, p queue.PeriodicParams) (*PeriodicInfo, error) {
	if p.Source == "" {
		p.Source = queue.SourceCLI
	}
	if _, err := ValidatePeriodic(&p); err != nil {
		return nil, err
	}
	r, err := store.InsertPeriodic(ctx, db, p)
	if err != nil {
		return nil, err
	}
	r.ReadAt = r.CreatedAt
	info := describePeriodic(r)
	return &info, nil
}

// PeriodicInfo is a schedule with what its row implies at the database's time ReadAt.
type PeriodicInfo struct {
	*queue.PeriodicRow
	// Next is the next slot to enqueue: the first after LastSlot, which is in the past
	// when the schedule lags. For a paused schedule, the first slot after ReadAt. Nil
	// when the spec has no further slot or cannot be parsed.
	Next *time.Time `json:"next_slot"`
	// Lag is how long the next slot has been due (ReadAt - Next), 0 when it is not due
	// yet or the schedule is paused.
	Lag time.Duration `json:"-"`
	// LagSeconds is Lag in seconds, for JSON.
	LagSeconds float64 `json:"lag_seconds"`
	// Error says why the spec or zone stored in the row cannot be used (a row written by
	// hand or by a newer version); the schedule enqueues nothing while it is set.
	Error string `json:"error,omitempty"`
}

func describePeriodic(r *queue.PeriodicRow) PeriodicInfo {
	info := PeriodicInfo{PeriodicRow: r}
	s, err := ParseSchedule(r.Spec, r.Timezone)
	if err != nil {
		info.Error = err.Error()
		return info
	}
	from := r.LastSlot
	if r.Paused && r.ReadAt.After(from) {
		from = r.ReadAt
	}
	if next := s.Next(from); !next.IsZero() {
		info.Next = &next
		if !r.Paused && r.ReadAt.After(next) {
			info.Lag = r.ReadAt.Sub(next)
		}
	}
	info.LagSeconds = info.Lag.Seconds()
	return info
}

// ListPeriodic returns every schedule with its next slot and lag, by the database's
// clock.
func ListPeriodic(ctx context.Context, db queue.DBTX) ([]PeriodicInfo, error) {
	rows, err := store.ListPeriodic(ctx, db)
	if err != nil {
		return nil, err
	}
	out := make([]PeriodicInfo, len(rows))
	for i, r := range rows {
		out[i] = describePeriodic(r)
	}
	return out, nil
}

// GetPeriodic returns one schedule with its next slot and lag (queue.ErrNotFound when
// none has the name).
func GetPeriodic(ctx context.Context, db queue.DBTX, name string) (*PeriodicInfo, error) {
	r, err := store.GetPeriodic(ctx, db, name)
	if err != nil {
		return nil, err
	}
	info := describePeriodic(r)
	return &info, nil
}

// periodicMeta is the metadata of a job a schedule enqueued: {"periodic": {...}}.
type periodicMeta struct {
	Periodic periodicOrigin `json:"periodic"`
}

// periodicOrigin names the schedule and why the job was enqueued: a slot (Slot, and
// Missed when it is the newest slot of an outage, enqueued by queue.MissedOnce), or the
// start after an outage (RunOnStart, At).
type periodicOrigin struct {
	Name       string `json:"name"`
	Slot       string `json:"slot,omitempty"`
	Missed     bool   `json:"missed,omitempty"`
	RunOnStart bool   `json:"run_on_start,omitempty"`
	At         string `json:"at,omitempty"`
}

func (o periodicOrigin) encode() string {
	b, _ := json.Marshal(periodicMeta{Periodic: o}) // strings and booleans: cannot fail
	return string(b)
}

// slotString is how a slot is written in job metadata: RFC 3339 in UTC.
func slotString(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// passPlan is what one scheduling pass does: per schedule a compare-and-set of its
// last slot with the jobs to insert, the run-on-start jobs, and when the next slot is
// due.
type passPlan struct {
	enqueues []store.PeriodicEnqueue
	onStart  []onStartJob
	// passedOver: per schedule whose slots were passed over by the missed policy (or
	// the catch-up bound), the newest of them, for the log.
	passedOver map[string]passedOver
	// broken: schedules whose spec or zone cannot be parsed.
	broken map[string]error
	// nextDue is the earliest slot after this pass of any schedule; zero when none.
	nextDue time.Time
}

type onStartJob struct {
	name string
	meta string
}

type passedOver struct {
	newest time.Time
	capped bool
}

// planPass decides, from the database's time now, the clock's heartbeat hb (nil: no
// pass ever completed) and the time this worker started, what a pass does with each
// schedule's slots after its last_slot, up to now:
//
//   - a slot up to hb+grace, or in (started, started+grace], fell due while a worker was
//     running passes (a short hiccup at most) or starting: every such slot is
//     enqueued, in order, up to PeriodicMaxCatchUp;
//   - any other slot fell due while every worker was down (or past the bound):
//     queue.MissedSkip enqueues none of them, queue.MissedOnce the newest; last_slot moves past
//     them either way;
//   - when hb is nil or older than grace, every worker was down: run-on-start
//     schedules get one job.
//
// schedule parses a spec in a zone.
func planPass(now time.Time, hb *time.Time, started time.Time, grace time.Duration, due []store.DuePeriodic,
	schedule func(spec, zone string) (*Schedule, error)) passPlan {
	plan := passPlan{}
	allDown := hb == nil || now.Sub(*hb) > grace
	var live []window
	if hb != nil {
		live = append(live, window{from: time.Time{}, to: hb.Add(grace)})
	}
	if !started.IsZero() {
		live = append(live, window{from: started, to: started.Add(grace)})
	}
	for _, d := range due {
		s, err := schedule(d.Spec, d.Timezone)
		if err != nil {
			if plan.broken == nil {
				plan.broken = map[string]error{}
			}
			plan.broken[d.Name] = err
			continue
		}
		e, over := decideSlots(s, d, now, live)
		if over != nil {
			if plan.passedOver == nil {
				plan.passedOver = map[string]passedOver{}
			}
			plan.passedOver[d.Name] = *over
		}
		if !e.To.Equal(e.From) {
			plan.enqueues = append(plan.enqueues, e)
		}
		if d.RunOnStart && allDown {
			plan.onStart = append(plan.onStart, onStartJob{name: d.Name,
				meta: periodicOrigin{Name: d.Name, RunOnStart: true, At: now.UTC().Format(time.RFC3339Nano)}.encode()})
		}
		if next := s.Next(e.To); !next.IsZero() && (plan.nextDue.IsZero() || next.Before(plan.nextDue)) {
			plan.nextDue = next
		}
	}
	return plan
}

// window is the slots s with from < s <= to.
type window struct{ from, to time.Time }

// decideSlots walks one schedule's slots in (d.LastSlot, now]: those in a live window
// are enqueued, in order, up to PeriodicMaxCatchUp; the rest (and every slot after the
// bound is reached) are missed and follow d.Missed. It reports the newest slot passed
// over, if any.
func decideSlots(s *Schedule, d store.DuePeriodic, now time.Time, live []window) (store.PeriodicEnqueue, *passedOver) {
	e := store.PeriodicEnqueue{Name: d.Name, Spec: d.Spec, Timezone: d.Timezone, From: d.LastSlot, To: d.LastSlot,
		NoOverlap: d.NoOverlap}
	type decided struct {
		slot   time.Time
		missed bool
	}
	var out []decided
	var missed []time.Time // the newest slot of each missed stretch
	passed := false        // a missed stretch held more than its newest slot
	capped := false
	pos := d.LastSlot
	miss := func(upTo time.Time) {
		if n := s.Last(pos, upTo); !n.IsZero() {
			if s.Next(pos).Before(n) {
				passed = true
			}
			missed = append(missed, n)
			out = append(out, decided{slot: n, missed: true})
			pos = n
		}
		if upTo.After(pos) {
			pos = upTo
		}
	}
	enqueued := 0
	for _, w := range live {
		if !w.to.After(pos) {
			continue
		}
		if w.from.After(pos) {
			miss(minTime(w.from, now))
		}
		for pos.Before(now) {
			n := s.Next(pos)
			if n.IsZero() || n.After(w.to) || n.After(now) {
				break
			}
			if enqueued == PeriodicMaxCatchUp {
				capped = true
				break
			}
			out = append(out, decided{slot: n})
			enqueued++
			pos = n
		}
		if capped {
			break
		}
		if w.to.Before(now) && w.to.After(pos) {
			pos = maxTime(pos, minTime(w.to, now))
		}
	}
	miss(now)

	keep := ""
	if d.Missed == queue.MissedOnce && len(missed) > 0 {
		keep = slotString(missed[len(missed)-1])
	}
	for _, x := range out {
		if x.slot.After(e.To) {
			e.To = x.slot
		}
		if x.missed && slotString(x.slot) != keep {
			continue
		}
		e.Metadata = append(e.Metadata, periodicOrigin{Name: d.Name, Slot: slotString(x.slot), Missed: x.missed}.encode())
		e.Slots = append(e.Slots, x.slot)
	}
	var over *passedOver
	if len(missed) > 0 && (d.Missed != queue.MissedOnce || passed || len(missed) > 1) {
		over = &passedOver{newest: missed[len(missed)-1], capped: capped}
	}
	return e, over
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// scheduleCache keeps parsed schedules by spec and zone, so that a pass does not load
// a zone from disk for every schedule every second. Only the periodic goroutine uses it.
type scheduleCache struct {
	m map[[2]string]*Schedule
}

func (c *scheduleCache) parse(spec, zone string) (*Schedule, error) {
	k := [2]string{spec, zone}
	if s, ok := c.m[k]; ok {
		return s, nil
	}
	s, err := ParseSchedule(spec, zone)
	if err != nil {
		return nil, err
	}
	if c.m == nil || len(c.m) > 1000 {
		c.m = map[[2]string]*Schedule{}
	}
	c.m[k] = s
	return s, nil
}
