package netns

import (
	"os"
	"testing"
)

// SkipUnlessCI ends a test that needs network namespaces on a machine that cannot make
// them (err says why: not root, or no ip command): in CI (.ci/run sets FENCEQ_CI, runs
// as root and installs iproute2) it fails, so the test never goes unrun there; elsewhere
// it skips, saying what is missing.
func SkipUnlessCI(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("FENCEQ_CI") != "" {
		t.Fatalf("%v (CI must run these tests: run .ci/run as root)", err)
	}
	t.Skipf("%v: run as root with iproute2 installed to include this test", err)
}
