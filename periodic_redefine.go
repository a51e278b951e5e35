package fenceq

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// upsertPeriodic writes the schedules this worker defines in code (Config.Periodic)
// and returns the database's time after it. A code definition replaces whatever
// definition is stored under its name, keeping the schedule's pause and last slot:
// a rolling deploy changes a schedule that way. Workers running different definitions
// of one schedule would also replace each other's at every start, so each
// replacement of a different stored definition is logged as a warning naming the
// schedule, the fields that changed and both definitions; the row's updated_at (the
// UPDATED column of `fenceq periodic list`) tells operators when it happened.
//
// The stored definitions are read before the upsert, outside its transaction: two
// workers starting at once with the same new definition may both report the one
// replacement.
func (w *Worker) upsertPeriodic(ctx context.Context) (time.Time, error) {
	var stored map[string]*queue.PeriodicRow
	if len(w.periodic) > 0 {
		rows, err := store.ListPeriodic(ctx, w.pool)
		if err != nil {
			return time.Time{}, fmt.Errorf("read the stored periodic schedules: %w", err)
		}
		stored = make(map[string]*queue.PeriodicRow, len(rows))
		for _, r := range rows {
			stored[r.Name] = r
		}
	}
	since, err := store.UpsertPeriodic(ctx, w.pool, w.periodic)
	if err != nil {
		return time.Time{}, err
	}
	for _, p := range w.periodic {
		old := stored[p.Name]
		if old == nil {
			continue
		}
		if changed := periodicChanges(old, p); len(changed) > 0 {
			w.log.Warn("periodic schedule redefined: this worker's code definition replaced a different stored one",
				"name", p.Name, "changed", strings.Join(changed, ","),
				"stored", describeStoredPeriodic(old), "code", describePeriodicParams(p))
		}
	}
	return since, nil
}

// periodicChanges returns the names of the fields in which the definition p (normalized,
// as Config.Periodic's are) differs from the stored row r; none when the upsert leaves
// the row alone.
func periodicChanges(r *queue.PeriodicRow, p queue.PeriodicParams) []string {
	var out []string
	add := func(differ bool, field string) {
		if differ {
			out = append(out, field)
		}
	}
	add(r.Spec != p.Spec, "spec")
	add(r.Timezone != p.Timezone, "timezone")
	add(r.Kind != p.Kind, "kind")
	add(!jsonEqual(r.EncodedArgs, p.Args), "args")
	add(r.Queue != p.Queue, "queue")
	add(p.Priority == nil || r.Priority != *p.Priority, "priority")
	add(r.MaxAttempts != p.MaxAttempts, "max_attempts")
	add(r.Missed != p.Missed, "missed")
	add(r.RunOnStart != p.RunOnStart, "run_on_start")
	add(r.Source != p.Source, "source")
	add(r.NoOverlap != p.NoOverlap, "no_overlap")
	key, states, period, tags, meta, err := store.PeriodicJobOptions(p)
	if err != nil {
		return append(out, "unique_key", "tags", "metadata")
	}
	add(!equalPtr(r.UniqueKey, key) || !slices.Equal(r.UniqueStates, states) || r.UniquePeriod != period, "unique_key")
	add(!slices.Equal(r.Tags, tags), "tags")
	add(!jsonEqual(r.Metadata, meta), "metadata")
	return out
}

func equalPtr[T comparable](a, b *T) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// describeStoredPeriodic and describePeriodicParams render a definition on one line,
// the same way for both, for the log.
func describeStoredPeriodic(r *queue.PeriodicRow) string {
	return describeDefinition(r.Spec, r.Timezone, r.Kind, r.EncodedArgs, r.Queue, r.Priority, r.MaxAttempts,
		r.Missed, r.RunOnStart, r.Source) + describeJobOptions(r.NoOverlap, r.UniqueKey, r.Tags, r.Metadata)
}

func describePeriodicParams(p queue.PeriodicParams) string {
	prio := queue.DefaultPriority
	if p.Priority != nil {
		prio = *p.Priority
	}
	key, _, _, tags, meta, _ := store.PeriodicJobOptions(p)
	return describeDefinition(p.Spec, p.Timezone, p.Kind, p.Args, p.Queue, prio, p.MaxAttempts, p.Missed,
		p.RunOnStart, p.Source) + describeJobOptions(p.NoOverlap, key, tags, meta)
}

// describeJobOptions renders the options added by migration 000017 that are set, so that
// the line of a definition without them reads as before.
func describeJobOptions(noOverlap bool, key *string, tags []string, meta []byte) string {
	out := ""
	if noOverlap {
		out += " no_overlap=true"
	}
	if key != nil {
		out += " unique_key=" + strconv.Quote(*key)
	}
	if len(tags) > 0 {
		out += " tags=" + strings.Join(tags, ",")
	}
	var compact bytes.Buffer
	if len(meta) > 0 && json.Compact(&compact, meta) == nil && compact.String() != "{}" {
		out += " metadata=" + compact.String()
	}
	return out
}

func describeDefinition(spec, tz, kind string, args []byte, q string, prio, maxAttempts int,
	missed queue.MissedPolicy, runOnStart bool, source queue.PeriodicSource) string {
	var compact bytes.Buffer
	if json.Compact(&compact, args) != nil {
		compact.Reset()
		compact.Write(args)
	}
	return fmt.Sprintf("spec=%q timezone=%s kind=%s args=%s queue=%s priority=%d max_attempts=%d missed=%s run_on_start=%t source=%s",
		spec, tz, kind, compact.String(), q, prio, maxAttempts, missed, runOnStart, source)
}

// jsonEqual reports whether two JSON documents are equal as the database's jsonb
// compares them: objects by their keys whatever their order, numbers by value (1.0 and
// 1, 1e3 and 1000 are equal).
func jsonEqual(a, b []byte) bool {
	va, errA := decodeJSONNumbers(a)
	vb, errB := decodeJSONNumbers(b)
	if errA != nil || errB != nil {
		return bytes.Equal(a, b)
	}
	return jsonValuesEqual(va, vb)
}

func decodeJSONNumbers(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func jsonValuesEqual(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !jsonValuesEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonValuesEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		fx, _, errX := big.ParseFloat(string(x), 10, 256, big.ToNearestEven)
		fy, _, errY := big.ParseFloat(string(y), 10, 256, big.ToNearestEven)
		if errX != nil || errY != nil {
			return x == y
		}
		return fx.Cmp(fy) == 0
	default: // string, bool, nil
		return a == b
	}
}
