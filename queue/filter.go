package queue

import (
	"bytes"
	"encoding/json"
	"time"
	"unicode"
)

// JobFilter selects jobs for fenceq.ListJobs, fenceq.CountMatching and the bulk actions
// (fenceq.RetryJobs, CancelJobs, RequeueJobs, DeleteJobs). Every field that is set must
// hold (they are ANDed); an unset field matches every job. Each condition is served by an
// index on both the hot set and history, so a search costs what its matches cost,
// however long the history is.
type JobFilter struct {
	// IDs keeps only these jobs (at most MaxFilterIDs).
	IDs []int64 `json:"ids,omitempty"`
	// State keeps the jobs in this state.
	State State `json:"state,omitempty"`
	// Queue keeps the jobs of this queue.
	Queue string `json:"queue,omitempty"`
	// Kind keeps the jobs of this kind.
	Kind string `json:"kind,omitempty"`
	// Tag keeps the jobs carrying this tag.
	Tag string `json:"tag,omitempty"`
	// Args keeps the jobs whose args contain this JSON object (PostgreSQL's jsonb @>:
	// {"customer": 42} matches {"customer": 42, "period": "2026-01"}). It must be a
	// non-empty object of at most MaxFilterJSONLen bytes.
	Args json.RawMessage `json:"args,omitempty"`
	// Metadata keeps the jobs whose metadata contain this JSON object, as Args does.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// Error keeps the jobs whose last recorded error holds every word of this text
	// (whole words, case-insensitively; PostgreSQL full-text search with the "simple"
	// configuration: "connection refused" matches "dial: Connection refused (after
	// 3s)"). At most MaxErrorSearchLen bytes with at least one letter or digit.
	Error string `json:"error,omitempty"`
	// CreatedAfter keeps the jobs enqueued at or after this instant, and CreatedBefore
	// those enqueued before it (the database's created_at).
	CreatedAfter  time.Time `json:"created_after,omitzero"`
	CreatedBefore time.Time `json:"created_before,omitzero"`
	// UnknownKinds keeps the jobs waiting to run (available, scheduled, retryable) that
	// no live worker can run: none of the workers serving the job's queue that
	// heartbeated within LiveWithin has a handler for its kind.
	UnknownKinds bool `json:"unknown_kinds,omitempty"`
	// LiveWithin is how recent a worker's heartbeat must be for UnknownKinds to count it.
	// Defaults to DefaultLiveWithin.
	LiveWithin time.Duration `json:"live_within,omitempty"`
}

// Limits of a JobFilter.
const (
	// MaxFilterIDs bounds JobFilter.IDs.
	MaxFilterIDs = 10_000
	// MaxFilterJSONLen bounds JobFilter.Args and JobFilter.Metadata.
	MaxFilterJSONLen = 4096
	// MaxErrorSearchLen bounds JobFilter.Error.
	MaxErrorSearchLen = 200
)

// Empty reports whether the filter sets no condition: it matches every job.
func (f *JobFilter) Empty() bool {
	return len(f.IDs) == 0 && f.State == "" && f.Queue == "" && f.Kind == "" && f.Tag == "" &&
		len(f.Args) == 0 && len(f.Metadata) == 0 && f.Error == "" && f.CreatedAfter.IsZero() &&
		f.CreatedBefore.IsZero() && !f.UnknownKinds
}

// Validate checks the filter without touching the database. Errors are
// *ValidationError naming the field ("state", "args", ...); they match ErrInvalid.
func (f *JobFilter) Validate() error {
	if len(f.IDs) > MaxFilterIDs {
		return invalid("ids", "%d ids, more than %d", len(f.IDs), MaxFilterIDs)
	}
	for _, id := range f.IDs {
		if id <= 0 {
			return invalid("ids", "%d is not a job id (want a positive integer)", id)
		}
	}
	if f.State != "" && !f.State.Valid() {
		return invalid("state", "%q is not a job state (want one of %v)", StorableText(string(f.State), 40), JobStates())
	}
	if f.Queue != "" {
		if err := ValidateQueue(f.Queue); err != nil {
			return err
		}
	}
	if f.Kind != "" {
		if err := ValidateKind(f.Kind); err != nil {
			return err
		}
	}
	if f.Tag != "" {
		if err := ValidateName("tag", f.Tag, MaxTagLen); err != nil {
			return err
		}
	}
	if err := validateContains("args", f.Args); err != nil {
		return err
	}
	if err := validateContains("metadata", f.Metadata); err != nil {
		return err
	}
	if f.Error != "" {
		if len(f.Error) > MaxErrorSearchLen {
			return invalid("error", "search text is %d bytes, longer than %d", len(f.Error), MaxErrorSearchLen)
		}
		if f.Error != StorableText(f.Error, len(f.Error)) {
			return invalid("error", "search text must be valid UTF-8 without NUL bytes")
		}
		if !hasWord(f.Error) {
			return invalid("error", "%q has no word to search for (want at least one letter or digit)", f.Error)
		}
	}
	if !f.CreatedAfter.IsZero() && !f.CreatedBefore.IsZero() && !f.CreatedAfter.Before(f.CreatedBefore) {
		return invalid("created_before", "%s is not after created_after %s",
			f.CreatedBefore.Format(time.RFC3339), f.CreatedAfter.Format(time.RFC3339))
	}
	if f.LiveWithin < 0 {
		return invalid("live_within", "%s is negative", f.LiveWithin)
	}
	return nil
}

// validateContains checks a containment filter: a non-empty JSON object (an empty one
// would match every job).
func validateContains(field string, v json.RawMessage) error {
	if len(v) == 0 {
		return nil
	}
	if len(v) > MaxFilterJSONLen {
		return invalid(field, "%d bytes, longer than %d", len(v), MaxFilterJSONLen)
	}
	var obj map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(v))
	if err := dec.Decode(&obj); err != nil || obj == nil || dec.More() {
		return invalid(field, "%q is not a JSON object (want e.g. {\"customer\": 42})", StorableText(string(v), 60))
	}
	if len(obj) == 0 {
		return invalid(field, "{} matches every job; leave it unset instead")
	}
	if !bytes.Equal(v, bytes.ToValidUTF8(v, nil)) || bytes.Contains(v, []byte(`\u0000`)) {
		return invalid(field, "must be valid UTF-8 without NUL characters")
	}
	return nil
}

func hasWord(s string) bool {
	for _, r := range s {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			return true
		}
	}
	return false
}

// ListParams is one page of fenceq.ListJobs: the jobs its filter matches, newest first.
type ListParams struct {
	JobFilter
	// BeforeID pages backwards (keyset): only jobs with a smaller id.
	BeforeID int64
	// Limit defaults to 100.
	Limit int
}

// DefaultLiveWithin is the default of JobFilter.LiveWithin: a few heartbeat intervals of
// a worker with the default lease.
const DefaultLiveWithin = 2 * time.Minute

// JobPage is one page of fenceq.ListJobs, newest first.
type JobPage struct {
	Jobs []*JobRow `json:"jobs"`
	// Next is the BeforeID of the next, older page; 0 when no older job matches.
	Next int64 `json:"next"`
}
