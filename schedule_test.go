package fenceq_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load zone %s: %v", name, err)
	}
	return loc
}

// TestScheduleNext checks the slot arithmetic: each case starts at an instant and lists
// the slots that follow, in order.
func TestScheduleNext(t *testing.T) {
	t.Parallel()
	berlin := mustZone(t, "Europe/Berlin")
	ny := mustZone(t, "America/New_York")
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	in := func(loc *time.Location, s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		name, spec, zone string
		from             time.Time
		want             []time.Time
	}{
		{"five fields, every 15 minutes", "*/15 * * * *", "", utc("2026-01-01T10:07:00Z"),
			[]time.Time{utc("2026-01-01T10:15:00Z"), utc("2026-01-01T10:30:00Z"), utc("2026-01-01T10:45:00Z"), utc("2026-01-01T11:00:00Z")}},
		{"an exact slot is not after itself", "0 * * * *", "UTC", utc("2026-01-01T10:00:00Z"),
			[]time.Time{utc("2026-01-01T11:00:00Z")}},
		{"fractions of a second", "* * * * *", "", utc("2026-01-01T10:00:59.999Z"),
			[]time.Time{utc("2026-01-01T10:01:00Z")}},
		{"seconds field", "*/20 * * * * *", "", utc("2026-01-01T10:00:05Z"),
			[]time.Time{utc("2026-01-01T10:00:20Z"), utc("2026-01-01T10:00:40Z"), utc("2026-01-01T10:01:00Z")}},
		{"seconds field in a zone", "30 0 9 * * *", "Europe/Berlin", in(berlin, "2026-06-01 09:00:31"),
			[]time.Time{in(berlin, "2026-06-02 09:00:30")}},
		{"@hourly", "@hourly", "", utc("2026-01-01T10:59:59Z"),
			[]time.Time{utc("2026-01-01T11:00:00Z"), utc("2026-01-01T12:00:00Z")}},
		{"@daily in UTC", "@daily", "", utc("2026-01-01T10:00:00Z"),
			[]time.Time{utc("2026-01-02T00:00:00Z"), utc("2026-01-03T00:00:00Z")}},
		{"@daily is local midnight", "@daily", "Europe/Berlin", utc("2026-01-01T10:00:00Z"),
			[]time.Time{utc("2026-01-01T23:00:00Z"), utc("2026-01-02T23:00:00Z")}},
		{"@daily in summer time", "@daily", "Europe/Berlin", utc("2026-07-01T10:00:00Z"),
			[]time.Time{utc("2026-07-01T22:00:00Z")}},
		{"weekday 9:00 in New York", "0 9 * * 1-5", "America/New_York", in(ny, "2026-01-02 10:00:00"), // a Friday
			[]time.Time{in(ny, "2026-01-05 09:00:00"), in(ny, "2026-01-06 09:00:00")}},
		{"@every 30s is aligned to the epoch", "@every 30s", "", utc("2026-01-01T10:00:07Z"),
			[]time.Time{utc("2026-01-01T10:00:30Z"), utc("2026-01-01T10:01:00Z"), utc("2026-01-01T10:01:30Z")}},
		{"@every ignores the zone", "@every 1h", "Asia/Kolkata", utc("2026-01-01T10:20:00Z"),
			[]time.Time{utc("2026-01-01T11:00:00Z"), utc("2026-01-01T12:00:00Z")}},
		{"@every 7s from the epoch", "@every 7s", "", time.Unix(1_000_000_000, 0),
			[]time.Time{time.Unix(1_000_000_001, 0), time.Unix(1_000_000_008, 0)}},

		// Europe/Berlin, spring forward on 2026-03-29: 02:00 CET becomes 03:00 CEST, so
		// 02:30 does not exist that day. It fires once, at 03:00 CEST (01:00 UTC).
		{"Berlin 02:30 daily, spring forward", "30 2 * * *", "Europe/Berlin", in(berlin, "2026-03-28 12:00:00"),
			[]time.Time{utc("2026-03-29T01:00:00Z"), in(berlin, "2026-03-30 02:30:00"), in(berlin, "2026-03-31 02:30:00")}},
		{"Berlin 02:30 daily, spring forward, from the day before", "30 2 * * *", "Europe/Berlin", in(berlin, "2026-03-27 02:30:00"),
			[]time.Time{utc("2026-03-28T01:30:00Z"), utc("2026-03-29T01:00:00Z"), utc("2026-03-30T00:30:00Z")}},
		// Fall back on 2026-10-25: 03:00 CEST becomes 02:00 CET, so 02:30 occurs twice.
		// It fires once, at its first occurrence (02:30 CEST, 00:30 UTC).
		{"Berlin 02:30 daily, fall back", "30 2 * * *", "Europe/Berlin", in(berlin, "2026-10-24 12:00:00"),
			[]time.Time{utc("2026-10-25T00:30:00Z"), utc("2026-10-26T01:30:00Z")}},
		{"Berlin 02:30 daily, fall back, from inside the repeated hour", "30 2 * * *", "Europe/Berlin",
			utc("2026-10-25T01:15:00Z"), // 02:15 CET, after the first 02:30
			[]time.Time{utc("2026-10-26T01:30:00Z")}},
		{"Berlin hourly across fall back", "0 * * * *", "Europe/Berlin", utc("2026-10-24T23:30:00Z"),
			[]time.Time{utc("2026-10-25T00:00:00Z"), utc("2026-10-25T02:00:00Z"), utc("2026-10-25T03:00:00Z")}},
		{"Berlin 01:59 daily, the night of spring forward", "59 1 * * *", "Europe/Berlin", in(berlin, "2026-03-29 00:00:00"),
			[]time.Time{utc("2026-03-29T00:59:00Z"), utc("2026-03-29T23:59:00Z")}}, // 01:59 CET, then 01:59 CEST
		{"Berlin every 30 minutes through the gap", "*/30 * * * *", "Europe/Berlin", utc("2026-03-29T00:15:00Z"),
			[]time.Time{utc("2026-03-29T00:30:00Z"), utc("2026-03-29T01:00:00Z"), utc("2026-03-29T01:30:00Z")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := fenceq.ParseSchedule(c.spec, c.zone)
			if err != nil {
				t.Fatalf("parse %q in %q: %v", c.spec, c.zone, err)
			}
			at := c.from
			for i, want := range c.want {
				got := s.Next(at)
				if !got.Equal(want) {
					t.Fatalf("slot %d after %s: got %s, want %s", i+1, at.UTC().Format(time.RFC3339), got.UTC().Format(time.RFC3339), want.UTC().Format(time.RFC3339))
				}
				if !got.After(at) {
					t.Fatalf("slot %d = %s is not after %s", i+1, got, at)
				}
				at = got
			}
		})
	}
}

// TestScheduleSlotsStrictlyIncrease walks a year of a few specs in zones with daylight
// saving time and checks that every slot is after the one before, and that Last agrees
// with Next: the newest slot in (a, b] is the one whose Next is past b.
func TestScheduleSlotsStrictlyIncrease(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ spec, zone string }{
		{"30 2 * * *", "Europe/Berlin"}, {"0 * * * *", "Europe/Berlin"}, {"*/7 1-3 * * *", "America/New_York"},
		{"0 30 2 * * *", "Australia/Lord_Howe"}, {"@every 3h", "Europe/Berlin"}, {"@weekly", "America/Santiago"},
	} {
		s, err := fenceq.ParseSchedule(c.spec, c.zone)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		at := start
		n := 0
		for at.Before(start.AddDate(1, 0, 0)) {
			next := s.Next(at)
			if !next.After(at) {
				t.Fatalf("%s in %s: Next(%s) = %s, not after it", c.spec, c.zone, at, next)
			}
			if n%97 == 0 {
				if last := s.Last(start, next); !last.Equal(next) {
					t.Fatalf("%s in %s: Last(%s, %s) = %s, want %s", c.spec, c.zone, start, next, last, next)
				}
				if last := s.Last(start, next.Add(-time.Millisecond)); !last.Equal(at) && !(at.Equal(start)) {
					t.Fatalf("%s in %s: Last(…, %s - 1ms) = %s, want %s", c.spec, c.zone, next, last, at)
				}
			}
			at = next
			n++
		}
		if n < 50 {
			t.Fatalf("%s in %s: only %d slots in a year", c.spec, c.zone, n)
		}
	}
}

func TestScheduleLast(t *testing.T) {
	t.Parallel()
	utc := func(s string) time.Time { v, _ := time.Parse(time.RFC3339, s); return v }
	s, err := fenceq.ParseSchedule("* * 9 * 1 *", "") // every second from 09:00 to 09:59, in January
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Last(utc("2025-12-01T00:00:00Z"), utc("2026-03-01T00:00:00Z")); !got.Equal(utc("2026-01-31T09:59:59Z")) {
		t.Fatalf("Last over a sparse quarter = %s", got)
	}
	if got := s.Last(utc("2026-01-31T10:00:00Z"), utc("2026-03-01T00:00:00Z")); !got.IsZero() {
		t.Fatalf("Last with no slot = %s, want zero", got)
	}
	e, _ := fenceq.ParseSchedule("@every 1s", "")
	if got := e.Last(utc("2026-01-01T00:00:00Z"), utc("2026-01-08T00:00:00.5Z")); !got.Equal(utc("2026-01-08T00:00:00Z")) {
		t.Fatalf("@every Last = %s", got)
	}
}

// TestParseScheduleRefusesBadInput: every bad spec or zone is a validation error naming
// its field.
func TestParseScheduleRefusesBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ spec, zone, field, says string }{
		{"", "", "spec", "must not be empty"},
		{"* * * *", "", "spec", "expected 5 to 6 fields"},
		{"61 * * * *", "", "spec", "above maximum"},
		{"@sometimes", "", "spec", "unrecognized descriptor"},
		{"@every", "", "spec", "unrecognized descriptor"},
		{"@every 0s", "", "spec", "at least 1s"},
		{"@every 1500ms", "", "spec", "whole number of seconds"},
		{"@every soon", "", "spec", "not a duration"},
		{"0 0 30 2 *", "", "spec", "never fires"},
		{"TZ=Europe/Berlin 0 9 * * *", "", "spec", "timezone"},
		{strings.Repeat("*", 300), "", "spec", "longer than"},
		{"@daily", "Mars/Olympus", "timezone", "not an IANA time zone"},
		{"@daily", "Local", "timezone", "machine's zone"},
	} {
		_, err := fenceq.ParseSchedule(c.spec, c.zone)
		var ve *queue.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !strings.Contains(err.Error(), c.says) || !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("ParseSchedule(%q, %q) = %v; want an invalid %s error saying %q", c.spec, c.zone, err, c.field, c.says)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("error for %q is not one line: %q", c.spec, err)
		}
	}
}
