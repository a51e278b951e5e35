package cli

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseRange reads fuzzed latency ranges (--tax-latency, --tax-tail). A bad range
// is a usage error naming the flag; a good one has 0 ≤ MIN ≤ MAX and reads back the
// same from its own MIN-MAX text.
func FuzzParseRange(f *testing.F) {
	for _, s := range []string{
		"20ms-200ms", "2m-5m", "1s", "0s", "0s-0s", " 1s - 2s ", "1h2m3.5s-1h2m4s", "+1s-+2s",
		"2562047h47m16.854775807s", "1ns-2562047h47m16.854775807s",
		"", "-", "-1s", "1s-", "2s-1s", "1s--2s", "1s-2s-3s", "soon", "1s-later", "9999999999h",
		"1s-2562047h47m16.854775808s", "\x00", "1µs-1μs",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		lo, hi, err := parseRange("tax-latency", s)
		if err != nil {
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--tax-latency") {
				t.Fatalf("parseRange(%q) = %v, want a usage error naming --tax-latency", s, err)
			}
			return
		}
		if lo < 0 || hi < lo {
			t.Fatalf("parseRange(%q) = %s, %s: want 0 ≤ MIN ≤ MAX", s, lo, hi)
		}
		for _, text := range []string{lo.String() + "-" + hi.String(), lo.String() + " - " + hi.String()} {
			if lo2, hi2, err := parseRange("tax-latency", text); err != nil || lo2 != lo || hi2 != hi {
				t.Fatalf("parseRange(%q) = %s, %s but its text %q reads %s, %s, %v", s, lo, hi, text, lo2, hi2, err)
			}
		}
		if !strings.Contains(s, "-") && lo != hi {
			t.Fatalf("parseRange(%q), a single duration, = %s-%s", s, lo, hi)
		}
	})
}
