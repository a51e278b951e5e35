package cli

import (
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
)

// The commit comes from the go command's vcs stamps, "unknown" without them.
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	const rev = "0c6e575a1b2c3d4e5f60718293a4b5c6d7e8f901"
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "-compiler", Value: "gc"},
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: rev},
		{Key: "vcs.time", Value: "2026-12-07T00:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		name     string
		bi       *debug.BuildInfo
		commit   string
		modified bool
		line     string
	}{
		{"stamped", stamped, rev, true, "fenceq " + fenceq.Version + " (commit 0c6e575a1b2c, modified) schema "},
		{"no vcs stamps", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "-compiler", Value: "gc"}}},
			"unknown", false, "fenceq " + fenceq.Version + " (commit unknown) schema "},
		{"no build info", nil, "unknown", false, "fenceq " + fenceq.Version + " (commit unknown) schema "},
	} {
		v := versionFrom(tc.bi)
		if v.Commit != tc.commit || v.Modified != tc.modified || v.Schema != migrations.Latest() {
			t.Errorf("%s: versionFrom = %+v, want commit %s, modified %v, schema %d",
				tc.name, v, tc.commit, tc.modified, migrations.Latest())
		}
		if want := tc.line + strconv.FormatUint(uint64(migrations.Latest()), 10); v.String() != want {
			t.Errorf("%s: line %q, want %q", tc.name, v.String(), want)
		}
	}
}
