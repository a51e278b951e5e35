package queue

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// FlowOpts puts a job under a flow limit (FlowLimit), which the database enforces across
// every worker process. The zero value is no limit.
type FlowOpts struct {
	// Limit names the FlowLimit the job runs under; it must be set (fenceq.SetFlowLimit,
	// fenceq.Config.FlowLimits, `fenceq flow set`) before the job is enqueued.
	Limit string
	// Partition is the part of the limit the job counts in, e.g. a customer id: the
	// limit's numbers hold per partition. Empty: the whole limit is one partition.
	Partition string
	// PartitionBy names top-level fields of the job's args whose values make the
	// partition (joined with ","), instead of Partition; a missing field counts as null.
	PartitionBy []string
}

// IsZero reports whether o puts the job under no limit.
func (o FlowOpts) IsZero() bool { return o.Limit == "" && o.Partition == "" && len(o.PartitionBy) == 0 }

// MaxFlowPartitionLen is the longest partition, in bytes.
const MaxFlowPartitionLen = 256

// Key returns the flow key of a job under o with partition p: the limit's name, ":",
// the partition.
func (o FlowOpts) Key(partition string) string { return o.Limit + ":" + partition }

// Validate checks o and the partition a job would get (p), naming what is wrong.
func (o FlowOpts) Validate(partition string) error {
	if o.Limit == "" {
		return &ValidationError{Field: "flow.limit", Reason: "empty; a partition needs the limit it belongs to"}
	}
	if err := ValidateFlowLimitName(o.Limit); err != nil {
		return err
	}
	if o.Partition != "" && len(o.PartitionBy) > 0 {
		return &ValidationError{Field: "flow.partition", Reason: "set both Partition and PartitionBy; give one"}
	}
	if len(partition) > MaxFlowPartitionLen || !utf8.ValidString(partition) {
		return &ValidationError{Field: "flow.partition",
			Reason: fmt.Sprintf("must be valid UTF-8 of at most %d bytes, got %d bytes", MaxFlowPartitionLen, len(partition))}
	}
	return nil
}

// ValidateFlowLimitName checks a flow limit's name: 1–128 characters, no ":" (it ends
// the name in a flow key) and no control characters.
func ValidateFlowLimitName(name string) error {
	switch {
	case name == "" || utf8.RuneCountInString(name) > 128:
		return &ValidationError{Field: "flow.limit", Reason: fmt.Sprintf("%q must be 1-128 characters", name)}
	case strings.Contains(name, ":"):
		return &ValidationError{Field: "flow.limit", Reason: fmt.Sprintf("%q must not contain ':'", name)}
	case strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) || !utf8.ValidString(name):
		return &ValidationError{Field: "flow.limit", Reason: fmt.Sprintf("%q must be printable UTF-8", name)}
	}
	return nil
}

// FlowLimit is a named limit on the jobs enqueued under it (FlowOpts), per partition:
// a concurrency limit, a rate limit, a sequence, or several of them. The database
// enforces it across every worker process: a job over its limit stays available but is
// not claimed, and is claimed the moment its partition has room.
type FlowLimit struct {
	// Name is what FlowOpts.Limit names: 1–128 characters, no ":".
	Name string `json:"name"`
	// MaxRunning is the most jobs running at once per partition (0: no concurrency
	// limit). A lease counts from its claim until the database ends it: a completion, a
	// failure, or a revocation (the reaper's or an operator's), whichever comes first.
	MaxRunning int `json:"max_running,omitempty"`
	// Rate is the most starts per Per per partition (0: no rate limit). Every claim of a
	// job is a start, retries included.
	Rate int `json:"rate,omitempty"`
	// Per is the rate's period (at least a millisecond), set exactly when Rate is.
	Per time.Duration `json:"per,omitempty"`
	// Sequence runs the jobs of a partition one at a time in enqueue order: a job holds
	// its partition from its first start until it finishes, its retries included.
	Sequence bool `json:"sequence,omitempty"`
	// HoldOnDiscard (sequences only): a discarded job keeps holding its partition, so
	// the jobs after it wait until an operator retries or deletes it. Without it, the
	// next job goes on.
	HoldOnDiscard bool `json:"hold_on_discard,omitempty"`
}

// MaxFlowRate is the largest FlowLimit.Rate: each partition keeps the start times of its
// last period.
const MaxFlowRate = 10000

// Validate checks l, naming the field that is wrong.
func (l FlowLimit) Validate() error {
	if err := ValidateFlowLimitName(l.Name); err != nil {
		return err
	}
	switch {
	case l.MaxRunning < 0:
		return &ValidationError{Field: "max_running", Reason: fmt.Sprintf("%d is negative", l.MaxRunning)}
	case l.Rate < 0 || l.Rate > MaxFlowRate:
		return &ValidationError{Field: "rate", Reason: fmt.Sprintf("%d must be 0 (none) to %d", l.Rate, MaxFlowRate)}
	case (l.Rate == 0) != (l.Per == 0):
		return &ValidationError{Field: "per", Reason: "a rate needs its period and a period its rate"}
	case l.Per != 0 && l.Per < time.Millisecond:
		return &ValidationError{Field: "per", Reason: fmt.Sprintf("%s is shorter than a millisecond", l.Per)}
	case l.MaxRunning == 0 && l.Rate == 0 && !l.Sequence:
		return &ValidationError{Field: "flow limit", Reason: fmt.Sprintf("%q limits nothing: set MaxRunning, Rate or Sequence", l.Name)}
	case l.HoldOnDiscard && !l.Sequence:
		return &ValidationError{Field: "hold_on_discard", Reason: "applies to sequences only"}
	}
	return nil
}

// FlowPartition is the state of one partition of a flow limit, as the database keeps it.
type FlowPartition struct {
	// Key is the flow key: the limit's name, ":", the partition.
	Key   string `json:"key"`
	Limit string `json:"limit"`
	// Running is how many leases are held under the key now.
	Running int `json:"running"`
	// Holder is the job holding a sequence, if any.
	Holder *int64 `json:"holder,omitempty"`
	// StartsInPeriod is how many starts fall in the rate's current period.
	StartsInPeriod int `json:"starts_in_period"`
	// NextStart is the earliest time the partition may start a job, given its
	// limit's rate (now when it has room). Nil without a rate limit.
	NextStart *time.Time `json:"next_start,omitempty"`
	// Waiting is how many available jobs wait under the key.
	Waiting int64 `json:"waiting"`
}
