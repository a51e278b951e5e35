package cli_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/internal/connect"
	"github.com/fenceq/fenceq/migrations"
)

// `fenceq version` prints the release, the commit (a test binary has none stamped, a
// built one its revision) and the core schema version the binary embeds.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	// The schema is the highest numbered core migration embedded in the binary.
	core := migrations.Core()
	entries, err := fs.ReadDir(core.FS, core.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var highest uint64
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		if !ok || !strings.HasSuffix(e.Name(), ".up.sql") {
			continue
		}
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			t.Fatalf("core migration %s: %v", e.Name(), err)
		}
		highest = max(highest, n)
	}
	if highest == 0 || uint64(migrations.Latest()) != highest {
		t.Fatalf("migrations.Latest() = %d, the highest embedded core migration is %d", migrations.Latest(), highest)
	}

	r := runCLI(t.Context(), "version")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("fenceq version: exit %d, stderr %q", r.code, r.stderr)
	}
	line := regexp.MustCompile(fmt.Sprintf(`^fenceq %s \(commit (unknown|[0-9a-f]{12}(, modified)?)\) schema %d\n$`,
		regexp.QuoteMeta(fenceq.Version), migrations.Latest()))
	if !line.MatchString(r.stdout) {
		t.Errorf("fenceq version printed %q, want a line matching %s", r.stdout, line)
	}

	r = runCLI(t.Context(), "version", "--json")
	if r.code != 0 {
		t.Fatalf("fenceq version --json: exit %d, stderr %q", r.code, r.stderr)
	}
	var got struct {
		Version string `json:"version"`
		Commit  string `json:"commit"`
		Schema  uint   `json:"schema"`
		Go      string `json:"go"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("fenceq version --json: decode %q: %v", r.stdout, err)
	}
	if got.Version != fenceq.Version || got.Schema != migrations.Latest() || got.Go == "" ||
		!regexp.MustCompile(`^(unknown|[0-9a-f]{40,64})$`).MatchString(got.Commit) {
		t.Errorf("fenceq version --json = %+v, want version %s, schema %d, a commit and the Go version",
			got, fenceq.Version, migrations.Latest())
	}

	oneErrorLine(t, runCLI(t.Context(), "version", "extra"), "usage: fenceq version")
}

// The release is a semantic version, "-dev" between releases.
func TestVersionIsSemantic(t *testing.T) {
	t.Parallel()
	if !regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-dev)?$`).MatchString(fenceq.Version) {
		t.Errorf("fenceq.Version = %q, want MAJOR.MINOR.PATCH with an optional -dev suffix", fenceq.Version)
	}
}

// The CLI's default database is the one the internal connection helpers fall back to.
func TestDefaultDatabaseURL(t *testing.T) {
	if cli.DefaultDatabaseURL != connect.DefaultURL {
		t.Fatalf("cli.DefaultDatabaseURL %q, internal/connect.DefaultURL %q", cli.DefaultDatabaseURL, connect.DefaultURL)
	}
}
