package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/jobs/builtin"
)

// TestPeriodicSlotsSurviveSIGKILL runs three `fenceq worker` processes that share an
// "@every 1s" schedule added from the CLI, and SIGKILLs one of them half-way (a real
// separate process, killed mid-pass or between passes). Over more than ten seconds
// every slot is enqueued exactly once, with no gap: the metadata slots of the
// schedule's jobs are unique and consecutive seconds.
func TestPeriodicSlotsSurviveSIGKILL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{Migrations: builtin.Migrations()})
	dir := t.TempDir()

	add := exec.CommandContext(ctx, TestBinary, "periodic", "add", "tick", "--schedule", "@every 1s", "--kind", "noop",
		"--queue", "ticks", "--database-url", db.URL)
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("fenceq periodic add: %v: %s", err, out)
	}
	procs := make([]*Process, 3)
	for i := range procs {
		name := fmt.Sprintf("p%d", i+1)
		procs[i] = NewProcess(name, filepath.Join(dir, name+".log"))
		args := []string{"worker", "--database-url", db.URL, "--id", name, "--queues", "ticks", "--max-conns", "3",
			"--periodic-interval", "200ms", "--shutdown-timeout", "2s", "--mailer", "file:" + filepath.Join(dir, "mail.jsonl")}
		if err := procs[i].Start(TestBinary, args, nil); err != nil {
			t.Fatal(err)
		}
		p := procs[i]
		t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	}
	slots := func() []time.Time {
		rows, err := db.Pool.Query(ctx, `SELECT metadata->'periodic'->>'slot' FROM fenceq_jobs
			WHERE metadata->'periodic'->>'name' = 'tick' ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []time.Time
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			at, err := time.Parse(time.RFC3339, s)
			if err != nil {
				t.Fatalf("slot %q: %v", s, err)
			}
			out = append(out, at)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	fenceqtest.WaitFor(t, "the first slot", 60*time.Second, func() bool { return len(slots()) > 0 })
	first := slots()[0]
	// Every process is up and running passes before the kill.
	fenceqtest.WaitFor(t, "three live workers", 60*time.Second, func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_workers`).Scan(&n)
		return n == 3
	})
	waitSlot := func(at time.Time) {
		t.Helper()
		fenceqtest.WaitFor(t, "slot "+at.Format(time.RFC3339), 60*time.Second, func() bool {
			s := slots()
			return len(s) > 0 && !s[len(s)-1].Before(at)
		})
	}
	waitSlot(first.Add(5 * time.Second))
	status, err := procs[1].Kill(ctx)
	if err != nil {
		t.Fatalf("SIGKILL p2: %v", err)
	}
	t.Logf("p2 after SIGKILL: %s", status)
	waitSlot(first.Add(11 * time.Second))
	for _, p := range []*Process{procs[0], procs[2]} {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}

	got := slots()
	if len(got) < 12 {
		t.Fatalf("%d slots, want at least 12", len(got))
	}
	for i := 1; i < len(got); i++ {
		if d := got[i].Sub(got[i-1]); d != time.Second {
			var b strings.Builder
			for _, s := range got {
				b.WriteString(s.Format("15:04:05 "))
			}
			t.Fatalf("slot %d is %s after the one before; want every second exactly once, in order: %s", i+1, d, b.String())
		}
	}
}
