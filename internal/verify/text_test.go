package verify_test

import (
	"strings"
	"testing"

	"github.com/fenceq/fenceq/internal/verify"
)

func TestWriteText(t *testing.T) {
	t.Parallel()
	rep := &verify.Report{Violations: 2, Checks: []verify.Check{
		{Name: "a", Description: "one a per b"},
		{Name: "c", Description: "one c per d", Violations: 2, Examples: []string{"d 7 has 3 c"}},
		{Name: "e", Description: "no stray e", Skipped: "table e does not exist"},
	}}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := `STATUS   INVARIANT    VIOLATIONS
OK       one a per b  0
FAIL     one c per d  2
SKIPPED  no stray e   -

c:
  d 7 has 3 c

skipped e: table e does not exist

verify: 2 violation(s)
`
	if b.String() != want {
		t.Errorf("WriteText:\n%s\nwant:\n%s", b.String(), want)
	}
	rep = &verify.Report{Passed: true, Checks: []verify.Check{{Name: "a", Description: "one a per b"}}}
	b.Reset()
	if err := rep.WriteText(&b); err != nil || !strings.HasSuffix(b.String(), "\nverify: all invariants hold\n") {
		t.Errorf("WriteText of a passing report: %v\n%s", err, b.String())
	}
}
