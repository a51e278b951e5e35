package fenceq

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fenceq/fenceq/queue"
)

// Schedule is a parsed periodic spec in a time zone: the instants (slots) at which it
// fires. Every worker computes the same slots from the same spec, zone and starting
// instant; nothing depends on the worker's clock or local zone.
//
// Spec forms:
//
//   - cron: five fields (minute hour day-of-month month day-of-week), or six with a
//     seconds field first, read on the wall clock of the schedule's zone;
//   - descriptors: @yearly (@annually), @monthly, @weekly, @daily (@midnight), @hourly,
//     also on the zone's wall clock;
//   - "@every D" with D a whole number of seconds, at least 1s (e.g. "@every 30s",
//     "@every 1h30m"): the instants that are multiples of D since the Unix epoch, so
//     that every worker computes the same ones whatever its start time. The zone does
//     not move them.
//
// Daylight saving time: a wall-clock time that does not exist on a day (spring
// forward: 02:30 in Europe/Berlin on the last Sunday of March) fires once, at the
// first instant after the gap (03:00 CEST); a wall-clock time that occurs twice (fall
// back) fires once, at its first occurrence. Slots are strictly increasing.
type Schedule struct {
	spec  string
	loc   *time.Location
	every time.Duration      // "@every D"; zero for cron specs
	cron  *cron.SpecSchedule // evaluated on wall-clock fields carried in a UTC time
	zone  string             // the zone's name as given
	_     [0]func()          // not comparable: compare Spec and Zone instead
}

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom |
	cron.Month | cron.Dow | cron.Descriptor)

// MaxSpecLen bounds a periodic spec.
const MaxSpecLen = 256

// ParseSchedule parses spec in the IANA time zone zone ("" means UTC). Errors are
// *queue.ValidationError naming the field, "spec" or "timezone".
func ParseSchedule(spec, zone string) (*Schedule, error) {
	loc, err := loadZone(zone)
	if err != nil {
		return nil, err
	}
	if zone == "" {
		zone = "UTC"
	}
	s := strings.TrimSpace(spec)
	switch {
	case s == "":
		return nil, invalidField("spec", "must not be empty; want a cron expression such as \"*/5 * * * *\", @hourly, @daily or \"@every 30s\"")
	case len(s) > MaxSpecLen:
		return nil, invalidField("spec", "is %d characters, longer than %d", len(s), MaxSpecLen)
	case strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ="):
		return nil, invalidField("spec", "%q: give the time zone as the schedule's timezone, not in the spec", s)
	}
	out := &Schedule{spec: s, loc: loc, zone: zone}
	if rest, ok := strings.CutPrefix(s, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, invalidField("spec", "%q: %q is not a duration such as 30s or 1h30m", s, strings.TrimSpace(rest))
		}
		if d < time.Second || d%time.Second != 0 {
			return nil, invalidField("spec", "%q: the interval must be a whole number of seconds, at least 1s", s)
		}
		out.every = d
		return out, nil
	}
	parsed, err := cronParser.Parse(s)
	if err != nil {
		return nil, invalidField("spec", "%q: %v", s, err)
	}
	cs, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, invalidField("spec", "%q is not a cron expression or descriptor", s)
	}
	cs.Location = time.UTC // the fields are matched against wall-clock times carried in UTC
	out.cron = cs
	if out.Next(time.Unix(0, 0)).IsZero() && out.Next(time.Now()).IsZero() {
		return nil, invalidField("spec", "%q never fires (no matching date)", s)
	}
	return out, nil
}

func loadZone(zone string) (*time.Location, error) {
	if zone == "" || zone == "UTC" {
		return time.UTC, nil
	}
	// time.LoadLocation accepts "Local", which would make the slots depend on each
	// worker's local zone.
	if zone == "Local" {
		return nil, invalidField("timezone", "%q is the machine's zone; name an IANA zone such as Europe/Berlin", zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, invalidField("timezone", "%q is not an IANA time zone such as Europe/Berlin or UTC", queue.StorableText(zone, 60))
	}
	return loc, nil
}

func invalidField(field, format string, args ...any) error {
	return &queue.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Spec returns the spec as parsed (trimmed).
func (s *Schedule) Spec() string { return s.spec }

// Zone returns the schedule's time zone name.
func (s *Schedule) Zone() string { return s.zone }

// Next returns the first slot strictly after t, or the zero time when there is none
// within five years.
func (s *Schedule) Next(t time.Time) time.Time {
	if s.every > 0 {
		// In whole seconds (the interval is one), which neither overflows for instants
		// after 2262 nor for intervals longer than half of time.Duration's range, as
		// nanoseconds would.
		d := int64(s.every / time.Second)
		n := t.Unix() // the floor: t is at or after this second
		k := n / d
		if n < 0 && n%d != 0 {
			k-- // floor for instants before the epoch
		}
		return time.Unix((k+1)*d, 0).UTC()
	}
	wall := wallClock(t, s.loc)
	for range maxWallSteps {
		wall = s.cron.Next(wall)
		if wall.IsZero() {
			return time.Time{}
		}
		if at := instantOf(wall, s.loc); at.After(t) {
			return at
		}
		// A wall-clock time of a repeated hour whose first occurrence is not after t:
		// it fired (or would have) at that first occurrence.
	}
	return time.Time{}
}

// maxWallSteps bounds the wall-clock times Next skips in a repeated hour: an hour of
// seconds, and then some.
const maxWallSteps = 4000

// Last returns the newest slot s with after < s <= upTo, or the zero time when there is
// none. It takes a number of steps logarithmic in upTo - after, whatever the density of
// the slots.
func (s *Schedule) Last(after, upTo time.Time) time.Time {
	if !upTo.After(after) {
		return time.Time{}
	}
	first := s.Next(after)
	if first.IsZero() || first.After(upTo) {
		return time.Time{}
	}
	// Next is non-decreasing in its argument. Find, by doubling back from upTo and then
	// bisecting, the latest p in [after, upTo] with Next(p) <= upTo: Next(p) is the answer.
	lo := after // Next(lo) <= upTo
	for d := time.Second; ; d *= 2 {
		p := upTo.Add(-d)
		if !p.After(after) {
			break
		}
		if n := s.Next(p); !n.IsZero() && !n.After(upTo) {
			lo = p
			break
		}
	}
	hi := upTo // Next(hi) > upTo
	for hi.Sub(lo) > time.Microsecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if n := s.Next(mid); !n.IsZero() && !n.After(upTo) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return s.Next(lo)
}

// wallClock returns the wall-clock time of t in loc, carried in a UTC time (which has
// no daylight saving gaps or repeats).
func wallClock(t time.Time, loc *time.Location) time.Time {
	w := t.In(loc)
	return time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), time.UTC)
}

// instantOf maps a wall-clock time (carried in UTC) of loc to an instant: the instant
// itself when it exists once, its first occurrence when it exists twice, and the first
// instant after the gap when it does not exist.
func instantOf(wall time.Time, loc *time.Location) time.Time {
	if loc == time.UTC {
		return wall
	}
	u := wall.Unix()
	var best time.Time
	maxOff := -1 << 31
	for _, probe := range []int64{u - 2*86400, u, u + 2*86400} {
		_, off := time.Unix(probe, 0).In(loc).Zone()
		maxOff = max(maxOff, off)
		c := time.Unix(u-int64(off), int64(wall.Nanosecond())).In(loc)
		if _, cOff := c.Zone(); cOff == off && (best.IsZero() || c.Before(best)) {
			best = c
		}
	}
	if !best.IsZero() {
		return best.UTC()
	}
	// In a gap: the wall clock jumps over wall. The instant read with the larger
	// (later) offset lies before the jump; the zone in effect there ends at the jump.
	before := time.Unix(u-int64(maxOff), 0).In(loc)
	if _, end := before.ZoneBounds(); !end.IsZero() {
		return end.UTC()
	}
	return before.UTC()
}
