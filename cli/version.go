package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/migrations"
)

func versionCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "version",
		Usage: "print the release, the commit and the schema version of this binary",
		Description: "The release is fenceq.Version (\"-dev\" between releases). The commit is the one\n" +
			"`go build` stamped from the git checkout, \"modified\" when the work tree had changes.\n" +
			"It is \"unknown\" when the go command stamped none: `go run`, `go test`, `go install\n" +
			"module@version`, -buildvcs=false, a build outside git or in a git worktree (the go\n" +
			"command looks for a .git directory). The schema is the highest core migration the\n" +
			"binary embeds: `fenceq migrate up` brings a database to it.",
		Flags:  []ucli.Flag{jsonFlag()},
		Action: versionAction,
	}
}

// versionInfo is what `fenceq version` prints.
type versionInfo struct {
	Version    string `json:"version"`
	Commit     string `json:"commit"`
	Modified   bool   `json:"modified"`
	CommitTime string `json:"commit_time,omitempty"`
	Schema     uint   `json:"schema"`
	Go         string `json:"go"`
}

// unknownCommit stands for a commit the build did not stamp.
const unknownCommit = "unknown"

// buildVersion reads the binary's version: the release, the commit the go command
// stamped into the build info (vcs.revision, vcs.modified, vcs.time) and the core
// schema version it embeds.
func buildVersion() versionInfo {
	bi, _ := debug.ReadBuildInfo()
	return versionFrom(bi)
}

// versionFrom reads the version out of build info, which is nil when the binary has none.
func versionFrom(bi *debug.BuildInfo) versionInfo {
	v := versionInfo{Version: fenceq.Version, Commit: unknownCommit, Schema: migrations.Latest(), Go: runtime.Version()}
	if bi == nil {
		return v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if s.Value != "" {
				v.Commit = s.Value
			}
		case "vcs.modified":
			v.Modified = s.Value == "true"
		case "vcs.time":
			v.CommitTime = s.Value
		}
	}
	return v
}

// String is the one line of `fenceq version`, e.g.
// "fenceq 0.2.0-dev (commit 0c6e575a1b2c, modified) schema 13".
func (v versionInfo) String() string {
	commit := v.Commit
	if len(commit) > 12 {
		commit = commit[:12]
	}
	if v.Modified {
		commit += ", modified"
	}
	return fmt.Sprintf("fenceq %s (commit %s) schema %d", v.Version, commit, v.Schema)
}

func versionAction(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	v := buildVersion()
	return output(c, v, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, v.String())
		return err
	})
}
