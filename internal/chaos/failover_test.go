package chaos

import (
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/pgcluster"
)

// TestFailoverSync kills the primary half-way through a run, with COMMIT replies held
// in flight, and promotes its synchronous standby. Every write acknowledged before the
// kill must be on the promoted standby, the lease revoked before the kill must still be
// revoked there (a write under it rejected), the commits in flight must be settled by
// looking and none repeated, and the run must end with nothing duplicated or lost.
func TestFailoverSync(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a primary and a standby; skipped with -short")
	}
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
	rep := runChaos(t, Config{
		// No scheduling passes and no counter roll-ups: their COMMITs would be among those
		// held at the kill, and only commits that finish jobs are settled by looking.
		Env:      EnvConfig{Workers: 3, Concurrency: 3, Failover: true, WorkerArgs: []string{"--no-periodic", "--no-counters"}},
		Workload: WorkloadConfig{WaveEvery: 4 * time.Second, Customers: 20, SleepJobs: 3, OrderKeys: 6, OrderClients: 3, OrderJobs: 2},
		Seed:     3, Duration: 14 * time.Second, Faults: []FaultType{FaultFailover},
	})
	requireFired(t, rep, FaultFailover)
	f := rep.Failover
	if f == nil || !f.Done || f.Replication != "sync" {
		t.Fatalf("failover report %+v; want a synchronous failover that happened", f)
	}
	for _, k := range []string{"enqueues", "completions", "invoices", "orders_by_http", "deliveries"} {
		if f.Acked[k] == 0 {
			t.Fatalf("no acknowledged %s were kept: the check proves nothing", k)
		}
		if f.Missing[k] != 0 {
			t.Fatalf("%d of %d acknowledged %s missing on the promoted standby", f.Missing[k], f.Acked[k], k)
		}
	}
	if f.StaleJob == 0 || f.RevokedGen <= f.StaleGen || f.GenAfter != f.RevokedGen || !f.StaleRejected {
		t.Fatalf("revoked lease: job %d gen %d → %d, %d after the failover, write under it: %s; want the revocation kept and the write rejected",
			f.StaleJob, f.StaleGen, f.RevokedGen, f.GenAfter, f.StaleWriteSaid)
	}
	if f.InFlightCommits == 0 || len(f.Reconciled) == 0 || f.RepeatedWrites != 0 {
		t.Fatalf("in flight at the kill: %s; settled by looking %v; repeated %d — want commits in flight, settled by looking, none repeated",
			f.InFlight, f.Reconciled, f.RepeatedWrites)
	}
	if !rep.Asserted {
		t.Fatal("a synchronous failover run must assert")
	}
	requirePass(t, rep)
}
