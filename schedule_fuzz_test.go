package fenceq_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// fuzzInstant maps fuzzed Unix seconds and nanoseconds to an instant between 1900 and 2400, the range in
// which the schedule's slots are asserted (a schedule is not expected to compute slots
// near the ends of time.Time's range).
func fuzzInstant(sec int64, nsec uint32) time.Time {
	const lo, span = -2208988800, 15778800000 // 1900-01-01, about 500 years
	s := (sec - lo) % span                    // Unix seconds within the range map to themselves
	if s < 0 {
		s += span
	}
	return time.Unix(lo+s, int64(nsec%1e9)).UTC()
}

// wantValidationError fails unless err is a *queue.ValidationError matching
// queue.ErrInvalid whose Field is one of fields.
func wantValidationError(t *testing.T, err error, fields ...string) *queue.ValidationError {
	t.Helper()
	var ve *queue.ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("error %v (%T) is not a *queue.ValidationError matching queue.ErrInvalid", err, err)
	}
	for _, f := range fields {
		if ve.Field == f {
			return ve
		}
	}
	t.Fatalf("error %v names the field %q, want one of %q", err, ve.Field, fields)
	return nil
}

// FuzzParseSchedule parses fuzzed specs and zones. A bad one is a ValidationError naming
// "spec" or "timezone"; a good one yields slots strictly after their input time, each of
// them the first after any instant before it, and Last agrees with Next.
func FuzzParseSchedule(f *testing.F) {
	for _, s := range []struct {
		spec, zone string
		sec        int64
	}{
		// valid
		{"*/5 * * * *", "", 1767225600},
		{"0 9 * * 1-5", "Europe/Berlin", 1774746000}, // the last Sunday of March 2026
		{"30 2 * * *", "Europe/Berlin", 1774743000},  // 02:30 does not exist that day
		{"30 2 * * *", "Europe/Berlin", 1792371600},  // 02:30 occurs twice in October
		{"*/10 * * * * *", "America/New_York", 1762063200},
		{"@hourly", "Asia/Kolkata", 0},
		{"@daily", "Australia/Lord_Howe", 1775318400}, // a half-hour DST shift
		{"@yearly", "UTC", -2208988800},
		{"@every 30s", "", 1},
		{"@every 1h30m", "Pacific/Chatham", -1},
		{"  @weekly  ", "UTC", 1767225600},
		{"0 0 29 2 *", "", 1767225600}, // leap days only
		// boundary
		{"@every 1s", "", 0},
		{"@every 2562047h", "", 1767225600},  // the longest interval time.Duration holds
		{"@every 1300000h", "", 7258118400},  // 2*interval overflows int64 nanoseconds
		{"@every 1h30m", "UTC", 13569465599}, // after 2262, out of UnixNano's range
		{"59 23 31 12 *", "Pacific/Kiritimati", 1767225600},
		{strings.Repeat(" ", 300) + "@hourly", "", 0},
		// invalid
		{"", "", 0},
		{"   ", "UTC", 0},
		{"* * * *", "", 0},
		{"61 * * * *", "", 0},
		{"0 0 30 2 *", "", 0}, // February 30th never comes
		{"@every 0s", "", 0},
		{"@every 1500ms", "", 0},
		{"@every -1h", "", 0},
		{"@every", "", 0},
		{"@every forever", "", 0},
		{"@fortnightly", "", 0},
		{"TZ=Europe/Berlin 0 9 * * *", "", 0},
		{"CRON_TZ=UTC @daily", "", 0},
		{"* * * * * * *", "", 0},
		{strings.Repeat("1,", 200) + "1 * * * *", "", 0},
		{"@hourly", "Local", 0},
		{"@hourly", "Mars/Olympus_Mons", 0},
		{"@hourly", "../../etc/passwd", 0},
		{"@hourly", "Europe/Berlin\x00", 0},
		{"@hourly", "\xff\xfe", 0},
		{"\x00", "", 0},
	} {
		f.Add(s.spec, s.zone, s.sec, uint32(0))
	}
	f.Fuzz(func(t *testing.T, spec, zone string, sec int64, nsec uint32) {
		s, err := fenceq.ParseSchedule(spec, zone)
		if err != nil {
			if s != nil {
				t.Fatalf("ParseSchedule(%q, %q) returned a schedule and the error %v", spec, zone, err)
			}
			wantValidationError(t, err, "spec", "timezone")
			return
		}
		if s.Spec() != strings.TrimSpace(spec) {
			t.Fatalf("Spec() = %q, want the trimmed input %q", s.Spec(), strings.TrimSpace(spec))
		}
		wantZone := zone
		if wantZone == "" {
			wantZone = "UTC"
		}
		if s.Zone() != wantZone {
			t.Fatalf("Zone() = %q, want %q", s.Zone(), wantZone)
		}
		// The schedule round-trips through its own spec and zone.
		if again, err := fenceq.ParseSchedule(s.Spec(), s.Zone()); err != nil {
			t.Fatalf("ParseSchedule(%q, %q) again: %v", s.Spec(), s.Zone(), err)
		} else if again.Spec() != s.Spec() || again.Zone() != s.Zone() {
			t.Fatalf("re-parsed schedule is %q in %q, want %q in %q", again.Spec(), again.Zone(), s.Spec(), s.Zone())
		}
		at := fuzzInstant(sec, nsec)
		next := s.Next(at)
		if next.IsZero() {
			return // no slot within the horizon (a rare date late in the range)
		}
		if !next.After(at) {
			t.Fatalf("%q in %q: Next(%s) = %s, not after its input", spec, zone, at, next)
		}
		// next is the first slot after any instant in [at, next): in particular just
		// before it.
		if again := s.Next(next.Add(-time.Nanosecond)); !again.Equal(next) {
			t.Fatalf("%q in %q: Next(%s) = %s but Next(%s) = %s", spec, zone, at, next, next.Add(-time.Nanosecond), again)
		}
		following := s.Next(next)
		if !following.IsZero() && !following.After(next) {
			t.Fatalf("%q in %q: slots not increasing: Next(%s) = %s", spec, zone, next, following)
		}
		// Last over (at, next] is next itself; over (at, next) there is none.
		if last := s.Last(at, next); !last.Equal(next) {
			t.Fatalf("%q in %q: Last(%s, %s) = %s, want %s", spec, zone, at, next, last, next)
		}
		if last := s.Last(at, next.Add(-time.Nanosecond)); !last.IsZero() {
			t.Fatalf("%q in %q: Last(%s, %s) = %s, want none (the first slot is %s)", spec, zone, at,
				next.Add(-time.Nanosecond), last, next)
		}
	})
}

// FuzzValidatePeriodic checks fuzzed schedules as the CLI and the dashboard would store
// them. A bad field is a ValidationError naming that field; a good schedule comes back
// normalized, every field within its limits, and its parsed spec is the stored one.
func FuzzValidatePeriodic(f *testing.F) {
	for _, s := range []struct {
		name, spec, zone, kind, args, queue, missed string
		priority, maxAttempts                       int
	}{
		{"nightly-report", "0 3 * * *", "Europe/Berlin", "report", `{"day":"yesterday"}`, "reports", "skip", 10, 3},
		{"tick", "@every 30s", "", "noop", "", "", "", 0, 0},
		{"a", "@hourly", "UTC", "k", "{}", "default", "once", 100, 1000},
		{"x.y:z-1_2", "*/5 * * * * *", "Asia/Tokyo", "a.b", ` { } `, "q", "", 0, 1},
		{"", "@hourly", "", "noop", "{}", "", "", 0, 0},
		{"-leading-dash", "@hourly", "", "noop", "{}", "", "", 0, 0},
		{strings.Repeat("n", 65), "@hourly", "", "noop", "{}", "", "", 0, 0},
		{"ok", "", "", "noop", "{}", "", "", 0, 0},
		{"ok", "@hourly", "Nowhere/City", "noop", "{}", "", "", 0, 0},
		{"ok", "@hourly", "", "", "{}", "", "", 0, 0},
		{"ok", "@hourly", "", "noop", "[]", "", "", 0, 0},
		{"ok", "@hourly", "", "noop", `{"a":"\u0000"}`, "", "", 0, 0},
		{"ok", "@hourly", "", "noop", `{"a":`, "", "", 0, 0},
		{"ok", "@hourly", "", "noop", "{}", "bad queue", "", 0, 0},
		{"ok", "@hourly", "", "noop", "{}", "", "twice", 0, 0},
		{"ok", "@hourly", "", "noop", "{}", "", "", -1, 0},
		{"ok", "@hourly", "", "noop", "{}", "", "", 101, 0},
		{"ok", "@hourly", "", "noop", "{}", "", "", 0, -1},
		{"ok", "@hourly", "", "noop", "{}", "", "", 0, 1001},
	} {
		f.Add(s.name, s.spec, s.zone, s.kind, []byte(s.args), s.queue, s.missed, s.priority, s.maxAttempts)
	}
	fields := []string{"name", "spec", "timezone", "kind", "args", "queue", "priority", "max_attempts", "missed"}
	f.Fuzz(func(t *testing.T, name, spec, zone, kind string, args []byte, q, missed string, priority, maxAttempts int) {
		p := queue.PeriodicParams{Name: name, Spec: spec, Timezone: zone, Kind: kind, Args: args, Queue: q,
			Priority: &priority, MaxAttempts: maxAttempts, Missed: queue.MissedPolicy(missed), Source: queue.SourceCLI}
		s, err := fenceq.ValidatePeriodic(&p)
		if err != nil {
			wantValidationError(t, err, fields...)
			return
		}
		if s == nil || s.Spec() != p.Spec || s.Zone() != p.Timezone {
			t.Fatalf("schedule %v does not match the params' spec %q and zone %q", s, p.Spec, p.Timezone)
		}
		for _, check := range []error{
			queue.ValidateName("name", p.Name, queue.MaxPeriodicNameLen), queue.ValidateKind(p.Kind),
			queue.ValidateQueue(p.Queue), queue.ValidateArgs(p.Args, 0),
		} {
			if check != nil {
				t.Fatalf("ValidatePeriodic accepted %+v: %v", p, check)
			}
		}
		if *p.Priority < queue.MinPriority || *p.Priority > queue.MaxPriority ||
			p.MaxAttempts < 1 || p.MaxAttempts > queue.MaxMaxAttempts || !p.Missed.Valid() {
			t.Fatalf("ValidatePeriodic accepted out-of-range params %+v", p)
		}
		// Normalized params validate again unchanged.
		again := p
		if _, err := fenceq.ValidatePeriodic(&again); err != nil {
			t.Fatalf("normalized params fail validation: %v", err)
		}
	})
}
