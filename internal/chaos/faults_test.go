package chaos

import (
	"strings"
	"testing"
	"time"
)

// faultWorkload keeps every worker busy with leases when a fault strikes: sleep jobs
// longer than the lease, invoices with a tax tail past it, an order storm.
var faultWorkload = WorkloadConfig{WaveEvery: 5 * time.Second, Customers: 25, SleepJobs: 6, OrderKeys: 4,
	OrderClients: 3, OrderJobs: 2}

// TestEachFault runs a short chaos run per fault type with a fixed seed and checks that
// the fault fired, that its effect on the leases shows in the lease events, and that
// nothing was duplicated or lost.
func TestEachFault(t *testing.T) {
	t.Parallel()
	cases := []struct {
		fault FaultType
		// effect checks the mechanism the fault must have set off.
		effect func(t *testing.T, rep *Report)
	}{
		{FaultPause, func(t *testing.T, rep *Report) {
			// The holder froze past its lease: the lease was revoked, and when it woke
			// it learnt so (expired_holder_alive) or its write was rejected.
			if rep.Revocations == 0 || rep.ExpiredHolderAlive+rep.StaleWritesRejected == 0 {
				t.Fatalf("pause: %d revocations, %d expired_holder_alive, %d stale writes; want the lease revoked and the holder told",
					rep.Revocations, rep.ExpiredHolderAlive, rep.StaleWritesRejected)
			}
		}},
		{FaultKill, func(t *testing.T, rep *Report) {
			// The dead holder's leases were reaped and their jobs ran again.
			if rep.Revocations == 0 || rep.RevokedReclaimed == 0 {
				t.Fatalf("kill: %d revocations, %d re-claimed; want the dead holder's jobs reaped and re-run",
					rep.Revocations, rep.RevokedReclaimed)
			}
		}},
		{FaultTerminate, nil},
		{FaultBlackhole, func(t *testing.T, rep *Report) {
			if rep.Revocations == 0 {
				t.Fatal("blackhole: no lease was revoked although the holder was cut off past its lease")
			}
		}},
		{FaultReset, nil},
		{FaultLatency, nil},
		{FaultCommitDrop, func(t *testing.T, rep *Report) {
			for _, r := range rep.FaultLog {
				if r.Type == FaultCommitDrop && r.Fired && !strings.Contains(r.Proof, `"COMMIT"`) && !strings.Contains(r.Proof, `"ROLLBACK"`) {
					t.Fatalf("commit-drop proof %q names no dropped COMMIT reply", r.Proof)
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(string(c.fault), func(t *testing.T) {
			t.Parallel()
			rep := runChaos(t, Config{
				Env:      EnvConfig{Workers: 3, Concurrency: 3},
				Workload: faultWorkload,
				Seed:     42, Duration: 10 * time.Second, Faults: []FaultType{c.fault},
			})
			requireFired(t, rep, c.fault)
			if c.effect != nil {
				c.effect(t, rep)
			}
			requirePass(t, rep)
		})
	}
}

// TestPostgresRestart restarts a throwaway PostgreSQL cluster in immediate mode (a
// crash) under load, together with the other faults.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a throwaway PostgreSQL cluster; skipped with -short")
	}
	rep := runChaosOwnCluster(t, Config{
		Env:      EnvConfig{Workers: 3, Concurrency: 3},
		Workload: faultWorkload,
		Seed:     7, Duration: 15 * time.Second, Faults: []FaultType{FaultPGRestart, FaultPause, FaultKill},
	})
	requireFired(t, rep, FaultPGRestart)
	requirePass(t, rep)
}

// TestNaiveRunReportsDuplicates runs the naive baseline under the same kind of run and
// the same faults: the verifier must find duplicates, or it proves nothing.
func TestNaiveRunReportsDuplicates(t *testing.T) {
	t.Parallel()
	rep := runChaos(t, Config{
		Env:      EnvConfig{Workers: 3, Concurrency: 3, Naive: true},
		Workload: faultWorkload,
		Seed:     42, Duration: 10 * time.Second, Faults: []FaultType{FaultPause},
	})
	requireFired(t, rep, FaultPause)
	if rep.Pass || rep.Duplicates == 0 {
		t.Fatalf("the naive baseline passed with %d duplicates; the verifier cannot tell it from fenceq", rep.Duplicates)
	}
	if rep.Verify.Duplicates() == 0 {
		t.Fatal("internal/verify found no duplicate although the report counts some")
	}
	// Sleep jobs outlast the naive lease, which nothing renews: others take them over.
	if rep.Takeovers == 0 {
		t.Fatal("no naive lease was taken over although sleep jobs outlast it")
	}
}
