package queue

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// MissedPolicy says what a periodic schedule does with the slots that fell due while
// every worker was down. The policies are the contract of fenceq_periodic.missed.
type MissedPolicy string

// Missed-slot policies.
const (
	// MissedSkip enqueues none of them: the schedule resumes at its next slot.
	MissedSkip MissedPolicy = "skip"
	// MissedOnce enqueues one job, for the newest of them.
	MissedOnce MissedPolicy = "once"
)

var missedPolicies = [...]MissedPolicy{MissedSkip, MissedOnce}

// MissedPolicies returns every missed-slot policy.
func MissedPolicies() []MissedPolicy { return slices.Clone(missedPolicies[:]) }

// Valid reports whether p names a policy.
func (p MissedPolicy) Valid() bool { return slices.Contains(missedPolicies[:], p) }

// PeriodicSource says where a periodic schedule was defined: the contract of
// fenceq_periodic.source.
type PeriodicSource string

// Periodic schedule sources.
const (
	// SourceCode: a worker's configuration defines it and upserts it at every start.
	SourceCode PeriodicSource = "code"
	// SourceCLI: an operator added it (fenceq periodic add).
	SourceCLI PeriodicSource = "cli"
)

var periodicSources = [...]PeriodicSource{SourceCode, SourceCLI}

// Valid reports whether s names a source.
func (s PeriodicSource) Valid() bool { return slices.Contains(periodicSources[:], s) }

// MaxPeriodicNameLen bounds a periodic schedule's name (the queue name charset).
const MaxPeriodicNameLen = 64

// PeriodicParams defines one periodic schedule as stored in fenceq_periodic. Zero
// values take defaults: Timezone UTC, Args {}, Queue DefaultQueue, Priority
// DefaultPriority, MaxAttempts DefaultMaxAttempts, Missed MissedSkip. The spec and the
// zone are checked by the caller that parses them (fenceq.ValidatePeriodic); this
// package checks the rest.
type PeriodicParams struct {
	Name        string
	Spec        string
	Timezone    string
	Kind        string
	Args        []byte
	Queue       string
	Priority    *int
	MaxAttempts int
	Missed      MissedPolicy
	RunOnStart  bool
	Source      PeriodicSource
	// NoOverlap skips a slot (decides it without enqueueing) while a job of the
	// schedule is unfinished: any job whose metadata names the schedule ({"periodic":
	// {"name": …}}), whether a slot, a trigger or a run on start enqueued it.
	NoOverlap bool
	// UniqueKey and Unique make every job of the schedule unique, as InsertOpts'
	// fields of those names do for an enqueue: the key is computed once, from the
	// schedule's kind, args and queue, and a period's start is added at each insert. A
	// slot whose job finds its key held enqueues nothing.
	UniqueKey string
	Unique    UniqueOpts
	// Tags label every job of the schedule.
	Tags []string
	// Metadata is a JSON object every job of the schedule carries; the origin of the
	// job ({"periodic": {...}}) is added to it, and replaces a "periodic" key of its own.
	Metadata []byte
}

// Normalize applies the defaults and checks every field but the spec's syntax and the
// zone's existence. Errors are *ValidationError naming the field.
func (p *PeriodicParams) Normalize() error {
	if err := ValidateName("name", p.Name, MaxPeriodicNameLen); err != nil {
		return err
	}
	p.Spec = strings.TrimSpace(p.Spec)
	if p.Timezone == "" {
		p.Timezone = "UTC"
	}
	if len(p.Args) == 0 {
		p.Args = []byte("{}")
	}
	if p.Queue == "" {
		p.Queue = DefaultQueue
	}
	if p.Priority == nil {
		p.Priority = new(DefaultPriority)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.Missed == "" {
		p.Missed = MissedSkip
	}
	if err := ValidateKind(p.Kind); err != nil {
		return err
	}
	if err := ValidateArgs(p.Args, 0); err != nil {
		return err
	}
	if err := ValidateQueue(p.Queue); err != nil {
		return err
	}
	if err := ValidatePriority(*p.Priority); err != nil {
		return err
	}
	if err := ValidateMaxAttempts(p.MaxAttempts); err != nil {
		return err
	}
	if !p.Missed.Valid() {
		return invalid("missed", "%q is not a policy (want %s)", StorableText(string(p.Missed), 40), joinWords(missedPolicies[:]))
	}
	if !p.Source.Valid() {
		return invalid("source", "%q is not a source (want %s)", StorableText(string(p.Source), 40), joinWords(periodicSources[:]))
	}
	tags, err := ValidateTags(p.Tags)
	if err != nil {
		return err
	}
	p.Tags = tags
	if len(p.Metadata) == 0 {
		p.Metadata = []byte("{}")
	}
	return ValidateMetadata(p.Metadata)
}

func joinWords[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, " or ")
}

// PeriodicRow is one row of fenceq_periodic, with the database's time when it was read.
type PeriodicRow struct {
	Name     string `json:"name"`
	Spec     string `json:"spec"`
	Timezone string `json:"timezone"`
	Kind     string `json:"kind"`
	// EncodedArgs are the args every job of the schedule gets: a JSON object.
	EncodedArgs json.RawMessage `json:"args"`
	Queue       string          `json:"queue"`
	Priority    int             `json:"priority"`
	MaxAttempts int             `json:"max_attempts"`
	Missed      MissedPolicy    `json:"missed"`
	RunOnStart  bool            `json:"run_on_start"`
	Paused      bool            `json:"paused"`
	// LastSlot: every slot up to it is decided (enqueued, or passed over by the missed
	// policy or a pause).
	LastSlot time.Time `json:"last_slot"`
	// LastEnqueuedSlot is the newest slot a job was enqueued for; nil when none was.
	LastEnqueuedSlot *time.Time     `json:"last_enqueued_slot"`
	Source           PeriodicSource `json:"source"`
	// NoOverlap: slots due while a job of the schedule is unfinished are skipped.
	NoOverlap bool `json:"no_overlap"`
	// LastSkippedSlot is the newest slot skipped because a job of the schedule was
	// unfinished; nil when none was. SkippedSlots counts them.
	LastSkippedSlot *time.Time `json:"last_skipped_slot"`
	SkippedSlots    int64      `json:"skipped_slots"`
	// UniqueKey is the fixed part of the unique key every job of the schedule gets (nil
	// for none); UniqueStates are the states in which it holds it and UniquePeriod the
	// period whose start is added at each insert (0 for none).
	UniqueKey    *string       `json:"unique_key,omitempty"`
	UniqueStates []State       `json:"unique_states,omitempty"`
	UniquePeriod time.Duration `json:"unique_period,omitempty"`
	// Tags and Metadata every job of the schedule gets (its origin is added to the
	// metadata).
	Tags      []string        `json:"tags,omitempty"`
	Metadata  json.RawMessage `json:"metadata"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	// ReadAt is the database's now() when the row was read.
	ReadAt time.Time `json:"read_at"`
}
