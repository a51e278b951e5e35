package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// dims reports whether the key is computed from parts (rather than being UniqueKey as
// given).
func uniqueDims(u queue.UniqueOpts) bool { return u.ByArgs || u.ByPeriod > 0 || u.ByQueue }

// uniqueness is what normalize derives from UniqueKey and Unique: the key's fixed part
// (the period's start is added by the database), the state mask, and the period.
type uniqueness struct {
	key      string
	mask     StateMask
	periodUS int64
}

func (u uniqueness) keyParam() *string { return nullString(u.key) }

func (u uniqueness) maskParam() *int16 {
	if u.key == "" {
		return nil
	}
	m := int16(u.mask)
	return &m
}

// normalizeUnique validates the uniqueness of p (normalized otherwise) and derives it.
func (p *InsertParams) normalizeUnique() error {
	u := p.Unique
	p.unique = uniqueness{}
	if p.UniqueKey != "" {
		if err := queue.ValidateUniqueKey("unique_key", p.UniqueKey); err != nil {
			return err
		}
	}
	if u.ByPeriod < 0 || (u.ByPeriod > 0 && u.ByPeriod < time.Second) {
		return invalid("unique.by_period", "%s: want at least 1s (or 0 for none)", u.ByPeriod)
	}
	if len(u.ArgsFields) > 0 && !u.ByArgs {
		return invalid("unique.args_fields", "set without unique.by_args")
	}
	for _, f := range u.ArgsFields {
		if f == "" {
			return invalid("unique.args_fields", "contains an empty field name")
		}
	}
	mask := unfinishedMask
	if u.ByState != nil {
		for _, s := range u.ByState {
			if !s.Valid() {
				return invalid("unique.by_state", "%q is not a job state (want some of %v)", s, jobStates)
			}
		}
		mask = MaskOf(u.ByState...)
		var missing []queue.State
		for _, s := range unfinishedStates {
			if !mask.Has(s) {
				missing = append(missing, s)
			}
		}
		if len(missing) > 0 {
			// A job moves among the unfinished states without its own say (the scheduler,
			// the reaper): leaving one out would let such a move collide with another job.
			return invalid("unique.by_state", "must include every unfinished state %v; missing %v",
				unfinishedStates, missing)
		}
	}
	if p.UniqueKey == "" && !uniqueDims(u) && u.ByState == nil {
		return nil
	}
	p.unique.mask = mask
	p.unique.periodUS = micros(u.ByPeriod)
	if !uniqueDims(u) && p.UniqueKey != "" {
		p.unique.key = p.UniqueKey // as given, so that applications can look it up
		return nil
	}
	key, err := computeUniqueKey(p)
	if err != nil {
		return err
	}
	p.unique.key = key
	return nil
}

// uniqueParts are what a computed key is the hash of; json.Marshal writes the fields in
// this order and leaves out the unset ones.
type uniqueParts struct {
	Kind     string          `json:"kind"`
	Key      string          `json:"key,omitempty"`
	Queue    string          `json:"queue,omitempty"`
	Args     json.RawMessage `json:"args,omitempty"`
	PeriodUS int64           `json:"period_us,omitempty"`
}

// computeUniqueKey returns "KIND:" and the hex SHA-256 of the canonical JSON of the
// chosen parts. The kind stays readable so operators can tell whose key it is.
func computeUniqueKey(p *InsertParams) (string, error) {
	u := p.Unique
	parts := uniqueParts{Kind: p.Kind, Key: p.UniqueKey, PeriodUS: micros(u.ByPeriod)}
	if u.ByQueue {
		parts.Queue = p.Queue
	}
	if u.ByArgs {
		args, err := canonicalArgs(p.Args, u.ArgsFields)
		if err != nil {
			return "", err
		}
		parts.Args = args
	}
	b, err := json.Marshal(parts)
	if err != nil {
		return "", fmt.Errorf("unique key of %s job: %w", p.Kind, err)
	}
	sum := sha256.Sum256(b)
	return p.Kind + ":" + hex.EncodeToString(sum[:]), nil
}

// canonicalArgs returns the args (all, or the named top-level fields) as canonical JSON:
// object keys sorted at every level, numbers as written.
func canonicalArgs(args []byte, fields []string) (json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(args, &top); err != nil {
		return nil, invalid("args", "malformed JSON: %v", err)
	}
	if len(fields) > 0 {
		picked := make(map[string]json.RawMessage, len(fields))
		for _, f := range slices.Compact(slices.Sorted(slices.Values(fields))) {
			if v, ok := top[f]; ok {
				picked[f] = v
			}
		}
		top = picked
	}
	canon := make(map[string]any, len(top))
	for k, raw := range top {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, invalid("args", "field %q: %v", k, err)
		}
		canon[k] = v
	}
	return json.Marshal(canon) // map keys come out sorted
}

// uniqueKeySQL is the unique key a job stores: key, followed, for keys unique per
// period, by ":" and the UTC start of the period holding at, truncated by the database.
// key, period (µs) and at are SQL expressions.
func uniqueKeySQL(key, period, at string) string {
	// GREATEST keeps date_bin's stride positive in the branch not taken too: Citus
	// evaluates an INSERT's column-free expressions on the coordinator, both branches
	// of a CASE included.
	return `CASE WHEN ` + period + ` > 0 THEN ` + key + ` || ':' || to_char(date_bin(GREATEST(` + period +
		`, 1) * interval '1 microsecond', ` + at + `, timestamptz '1970-01-01 00:00:00+00') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') ELSE ` + key + ` END`
}

// uniqueHeld is the predicate of the unique index: the row holds its key in its state.
// Every ON CONFLICT and every read of the holder names it exactly so.
const uniqueHeld = `unique_key IS NOT NULL AND fenceq_state_in_mask(state, unique_states)`
