package fenceqweb

import (
	"slices"
	"strings"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// The lease timeline of one job, derived from what the database keeps: the job's row
// (its current generation, holder, claim time, last heartbeat and expiry), its errors
// (each failed attempt, lease expiry and cancellation records the generation and the
// worker) and its fenceq_lease_events (revocations, rejected stale writes, leases that
// expired while the holder lived, heartbeats that found the lease gone).
//
// A claim bumps the generation and so does every revocation (reaper, operator cancel
// or requeue of a running job), which records a revoked event for the generation it
// ends. So generation g+1 after a revocation of g was never held: it only fences g's
// holder out. The next claim makes g+2.

// generation is one lease generation of a job.
type generation struct {
	Gen int64
	// Fence is true for a generation made by a revocation: nobody held it.
	Fence bool
	// Holder is the worker that held it, when known.
	Holder string
	// Attempt is the attempt number it ran, when known.
	Attempt int
	// ClaimedAt, Heartbeat and Expires are known for the latest claim only: the row
	// keeps them for its current lease.
	ClaimedAt *time.Time
	Heartbeat *time.Time
	Expires   *time.Time
	// Current is true for the generation the job holds now: it is running under it.
	Current bool
	// Outcome says how the generation ended, or that it holds.
	Outcome outcome
	// Entries are what happened under it, in time order.
	Entries []timelineEntry
	// StaleWrites counts its rejected stale writes; HolderAlive is true when its lease
	// expired while the holder lived.
	StaleWrites int
	HolderAlive bool
}

// outcome is how a generation ended.
type outcome struct {
	// Class is one of held, completed, failed, revoked, cancelled, released, unknown.
	Class string
	Text  string
	At    *time.Time
}

// timelineEntry is one thing that happened under a generation.
type timelineEntry struct {
	At time.Time
	// Class: claimed, heartbeat, failed, revoked, stale, alive, lost, cancelled, finished.
	Class  string
	Title  string
	Worker string
	Detail string
	Trace  string
}

// timeline is a job's generations, oldest first.
type timeline struct {
	Generations []generation
	// Revocations and StaleWrites count over the whole job.
	Revocations, StaleWrites int
	// Truncated is true when the job has more lease events than were read.
	Truncated bool
}

// Held counts the generations somebody held.
func (t *timeline) Held() int {
	n := 0
	for _, g := range t.Generations {
		if !g.Fence {
			n++
		}
	}
	return n
}

// buildTimeline derives the generations of job j from its row and its lease events
// (any order).
func buildTimeline(j *queue.JobRow, events []queue.LeaseEvent) *timeline {
	t := &timeline{}
	if j.LeaseGen <= 0 {
		return t
	}
	byGen := map[int64][]queue.LeaseEvent{}
	fence := map[int64]bool{}
	for _, e := range events {
		byGen[e.LeaseGen] = append(byGen[e.LeaseGen], e)
		if e.Kind == queue.EventRevoked {
			fence[e.LeaseGen+1] = true
			t.Revocations++
		}
		if e.Kind == queue.EventStaleWriteRejected {
			t.StaleWrites++
		}
	}
	errsByGen := map[int64][]queue.AttemptError{}
	for _, e := range j.Errors {
		errsByGen[e.LeaseGen] = append(errsByGen[e.LeaseGen], e)
	}
	// The latest claim: the highest generation that is not a fence. The row's
	// attempted_at and heartbeat_at belong to it.
	latest := j.LeaseGen
	for latest > 0 && fence[latest] {
		latest--
	}
	for g := int64(1); g <= j.LeaseGen; g++ {
		gen := generation{Gen: g, Fence: fence[g]}
		for _, e := range byGen[g] {
			if gen.Holder == "" && e.WorkerID != nil {
				gen.Holder = *e.WorkerID
			}
		}
		for _, e := range errsByGen[g] {
			if gen.Holder == "" && e.Worker != "" {
				gen.Holder = e.Worker
			}
			if gen.Attempt == 0 {
				gen.Attempt = e.Attempt
			}
		}
		if g == latest && !gen.Fence {
			if gen.Holder == "" && j.LeasedBy != nil {
				gen.Holder = *j.LeasedBy
			}
			if gen.Attempt == 0 {
				gen.Attempt = j.Attempt
			}
			gen.ClaimedAt, gen.Heartbeat = j.AttemptedAt, j.HeartbeatAt
			gen.Current = g == j.LeaseGen && j.State == queue.StateRunning
			if gen.Current {
				gen.Expires = j.LeaseExpiresAt
			}
			if j.AttemptedAt != nil {
				gen.Entries = append(gen.Entries, timelineEntry{At: *j.AttemptedAt, Class: "claimed",
					Title: "claimed", Worker: gen.Holder})
			}
			if j.HeartbeatAt != nil && j.AttemptedAt != nil && j.HeartbeatAt.After(*j.AttemptedAt) {
				gen.Entries = append(gen.Entries, timelineEntry{At: *j.HeartbeatAt, Class: "heartbeat",
					Title: "last heartbeat", Worker: gen.Holder})
			}
		}
		for _, e := range errsByGen[g] {
			gen.Entries = append(gen.Entries, errorEntry(e))
			if hb := reapedHeartbeat(e.Error); hb != nil && gen.Heartbeat == nil {
				gen.Heartbeat = hb
			}
		}
		for _, e := range byGen[g] {
			en := eventEntry(e)
			gen.Entries = append(gen.Entries, en)
			switch e.Kind {
			case queue.EventStaleWriteRejected:
				gen.StaleWrites++
			case queue.EventExpiredHolderAlive:
				gen.HolderAlive = true
			}
		}
		slices.SortStableFunc(gen.Entries, func(a, b timelineEntry) int { return a.At.Compare(b.At) })
		gen.Outcome = outcomeOf(j, gen, g == latest, byGen[g], errsByGen[g])
		t.Generations = append(t.Generations, gen)
	}
	return t
}

// outcomeOf says how generation gen ended.
func outcomeOf(j *queue.JobRow, gen generation, latest bool, events []queue.LeaseEvent, errs []queue.AttemptError) outcome {
	if gen.Fence {
		return outcome{Class: "fence", Text: "made by the revocation of generation " + itoa(gen.Gen-1) +
			": never held, it fences that holder out"}
	}
	for _, e := range events {
		if e.Kind == queue.EventRevoked {
			at := e.At
			text := "revoked"
			if d := deref(e.Detail); d != "" {
				text += ": " + d
			}
			return outcome{Class: "revoked", Text: text, At: &at}
		}
	}
	if latest {
		switch j.State {
		case queue.StateRunning:
			return outcome{Class: "held", Text: "holds the lease now"}
		case queue.StateCompleted:
			return outcome{Class: "completed", Text: "completed", At: j.FinishedAt}
		}
	}
	// The last error recorded under the generation by its holder ends it: a failure,
	// or a cancellation by the handler.
	for i := len(errs) - 1; i >= 0; i-- {
		e := errs[i]
		if e.Worker == "" {
			continue
		}
		at := e.At
		last := len(j.Errors) > 0 && sameError(j.Errors[len(j.Errors)-1], e)
		if latest && last && j.State == queue.StateCancelled {
			return outcome{Class: "cancelled", Text: "cancelled by the handler: " + shorten(200, e.Error), At: &at}
		}
		text := "failed: " + shorten(200, e.Error)
		if latest && last && j.State == queue.StateDiscarded {
			text += " (discarded: no attempts left)"
		}
		return outcome{Class: "failed", Text: text, At: &at}
	}
	if latest {
		switch j.State {
		case queue.StateScheduled:
			return outcome{Class: "released", Text: "snoozed or given back: runs again at its run_at"}
		case queue.StateAvailable:
			return outcome{Class: "released", Text: "given back (released at shutdown, snoozed or requeued): waits for a worker"}
		case queue.StateCancelled:
			return outcome{Class: "cancelled", Text: "cancelled", At: j.FinishedAt}
		case queue.StateDiscarded:
			return outcome{Class: "failed", Text: "discarded", At: j.FinishedAt}
		}
	}
	return outcome{Class: "unknown", Text: "ended without a record: a snooze or a release at shutdown leaves none"}
}

func errorEntry(e queue.AttemptError) timelineEntry {
	en := timelineEntry{At: e.At, Class: "failed", Title: "attempt " + itoa(int64(e.Attempt)) + " failed",
		Worker: e.Worker, Detail: e.Error, Trace: e.Trace}
	switch {
	case e.Worker == "":
		en.Class, en.Title = "cancelled", "operator action"
	case strings.HasPrefix(e.Error, "lease expired"):
		en.Class, en.Title = "revoked", "lease expired (recorded by the reaper)"
	}
	return en
}

func eventEntry(e queue.LeaseEvent) timelineEntry {
	en := timelineEntry{At: e.At, Worker: deref(e.WorkerID), Detail: deref(e.Detail)}
	switch e.Kind {
	case queue.EventRevoked:
		en.Class, en.Title = "revoked", "lease revoked"
	case queue.EventStaleWriteRejected:
		en.Class, en.Title = "stale", "stale write rejected by the database"
	case queue.EventExpiredHolderAlive:
		en.Class, en.Title = "alive", "lease expired while its holder lived"
	case queue.EventHeartbeatLost:
		en.Class, en.Title = "lost", "heartbeat found the lease gone"
	default:
		en.Class, en.Title = "event", string(e.Kind)
	}
	return en
}

// reapedHeartbeat reads the last heartbeat of a lease from the error the reaper
// records when it revokes an expired lease ("lease expired (last heartbeat T)", T as
// PostgreSQL prints a timestamptz), or nil.
func reapedHeartbeat(msg string) *time.Time {
	rest, ok := strings.CutPrefix(msg, "lease expired (last heartbeat ")
	if !ok {
		return nil
	}
	ts, _, ok := strings.Cut(rest, ")")
	if !ok {
		return nil
	}
	for _, layout := range []string{"2006-01-02 15:04:05.999999-07", "2006-01-02 15:04:05.999999-07:00"} {
		if t, err := time.Parse(layout, ts); err == nil {
			return &t
		}
	}
	return nil
}

func sameError(a, b queue.AttemptError) bool {
	return a.At.Equal(b.At) && a.LeaseGen == b.LeaseGen && a.Attempt == b.Attempt && a.Error == b.Error
}

func itoa(n int64) string { return formatInt(n) }
