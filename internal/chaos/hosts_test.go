package chaos

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/netns"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/jobs/order"
)

// requireHosts skips a test that needs network namespaces and a throwaway cluster
// when this machine cannot give them (not root, no iproute2, no PostgreSQL binaries).
func requireHosts(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds network namespaces and a throwaway PostgreSQL cluster; skipped with -short")
	}
	if err := netns.Available(); err != nil {
		netns.SkipUnlessCI(t, err)
	}
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
}

// hostsWorkload keeps every host busy with leases: invoices with a tax tail past the
// lease, an order storm, sleep jobs and sleep jobs that ignore cancellation.
var hostsWorkload = WorkloadConfig{WaveEvery: 4 * time.Second, Customers: 15, SleepJobs: 3, StubbornJobs: 3,
	OrderKeys: 4, OrderClients: 3, OrderJobs: 2}

func recordOf(t *testing.T, rep *Report, f FaultType) FaultRecord {
	t.Helper()
	for _, r := range rep.FaultLog {
		if r.Type == f && r.Fired {
			return r
		}
	}
	t.Fatalf("no fired %s in the fault log", f)
	return FaultRecord{}
}

// TestHostsFaults runs workers on three hosts of their own and cuts links: a worker
// host's link past the lease (the worker must then record the leases it lost), a link
// cut at a COMMIT's reply, and a partition of the database host from every worker. Each
// fault must prove it fired (the link read back DOWN, connections from the host failed)
// and the run must end with nothing duplicated or lost.
func TestHostsFaults(t *testing.T) {
	t.Parallel()
	requireHosts(t)
	lease := 2 * time.Second
	rep := runChaos(t, Config{
		Env:      EnvConfig{Hosts: 3, Concurrency: 3, Lease: lease},
		Workload: hostsWorkload,
		Seed:     11, Duration: 24 * time.Second,
		Schedule: []PlannedFault{
			{Type: FaultLinkDown, At: 3 * time.Second, Worker: 0, For: lease * 3 / 2},
			{Type: FaultCommitCut, At: 11 * time.Second, Worker: 1, For: lease / 2},
			{Type: FaultDBPartition, At: 16 * time.Second, For: lease * 3 / 2},
		},
	})
	for _, f := range hostFaults {
		requireFired(t, rep, f)
		if r := recordOf(t, rep, f); !strings.Contains(r.Proof, "read back DOWN") {
			t.Fatalf("%s proof %q does not show the link read back DOWN", f, r.Proof)
		}
	}
	// The cut-off host kept running and found its leases revoked: a lease event it
	// recorded itself after the heal.
	if r := recordOf(t, rep, FaultLinkDown); !strings.Contains(r.Effect, "recorded heartbeat_lost") &&
		!strings.Contains(r.Effect, "recorded stale_write_rejected") && !strings.Contains(r.Effect, "recorded expired_holder_alive") {
		t.Fatalf("link-down: the cut-off worker recorded no lost lease: %s", r.Effect)
	}
	if rep.Revocations == 0 {
		t.Fatal("no lease was revoked although a worker host was cut off past its lease")
	}
	requirePass(t, rep)
}

// TestCommitCutSettledByLooking cuts the link of the only worker host the moment the
// reply to its order.place job's fenced COMMIT comes back. The outcome is unknown on
// that host; once the link is back it must look (the landed check), find its commit landed
// and complete nothing twice: one order, the job completed on its first attempt, no
// rejected write.
func TestCommitCutSettledByLooking(t *testing.T) {
	t.Parallel()
	requireHosts(t)
	// No scheduling passes and no counter roll-ups: the only fenced COMMIT whose reply
	// comes back is the order's.
	env := newTestEnv(t, EnvConfig{Hosts: 1, WorkerArgs: []string{"--no-periodic", "--no-counters"}})
	startWorkers(t, env)
	w := env.Workers[0]
	ctx := context.Background()
	const key = "commit-cut-1"
	req := order.Request{CustomerEmail: "buyer@example.com", Currency: "EUR",
		Items: []order.Item{{SKU: "book", Quantity: 1, UnitPriceCents: 990}}}
	got := make(chan FaultRecord, 1)
	go func() { got <- env.Inject(ctx, PlannedFault{Type: FaultCommitCut, For: time.Second}) }()
	res, err := fenceq.Enqueue(ctx, env.Pool, order.PlaceArgs{IdempotencyKey: key, Request: req}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := <-got
	if !rec.Fired {
		t.Fatalf("commit-cut did not fire: %s", rec.Err)
	}
	t.Logf("proof: %s; effect: %s", rec.Proof, rec.Effect)
	if !strings.Contains(rec.Proof, `reply "COMMIT"`) || !strings.Contains(rec.Proof, "read back DOWN") {
		t.Fatalf("proof %q shows no COMMIT reply swallowed with the link down", rec.Proof)
	}
	jobID := res.Job.ID
	fenceqtest.WaitFor(t, "the order.place job to finish", 30*time.Second, func() bool {
		return count(t, env.Pool, `SELECT count(*) FROM fenceq_jobs WHERE id = $1
			AND state IN ('completed', 'discarded', 'cancelled')`, jobID) == 1
	})
	if n := count(t, env.Pool, `SELECT count(*) FROM fenceq_jobs WHERE id = $1 AND state = 'completed'
		AND attempt = 1 AND lease_gen = 1`, jobID); n != 1 {
		t.Fatalf("job %d is not completed on its first attempt under its first lease", jobID)
	}
	if n := count(t, env.Pool, `SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1`, jobID); n != 0 {
		t.Fatalf("job %d has %d lease events (a write repeated?); want none", jobID, n)
	}
	if n := count(t, env.Pool, `SELECT count(*) FROM orders WHERE idempotency_key = $1`, key); n != 1 {
		t.Fatalf("%d orders with key %s; want 1", n, key)
	}
	landed := regexp.MustCompile(`fenced commit landed although its reply was lost.*job_id=` + strconv.FormatInt(jobID, 10) + `\b`)
	fenceqtest.WaitFor(t, "the worker to log the reconciliation", 15*time.Second, func() bool {
		log, err := os.ReadFile(w.LogPath())
		return err == nil && landed.Match(log)
	})
}

// TestNaiveHostsReportsDuplicates runs the naive baseline on hosts of their own under
// the same link cut: the verifier must find duplicates there too.
func TestNaiveHostsReportsDuplicates(t *testing.T) {
	t.Parallel()
	requireHosts(t)
	lease := 2 * time.Second
	rep := runChaos(t, Config{
		Env:      EnvConfig{Hosts: 3, Concurrency: 3, Naive: true, Lease: lease},
		Workload: hostsWorkload,
		Seed:     11, Duration: 8 * time.Second,
		Schedule: []PlannedFault{{Type: FaultLinkDown, At: 2 * time.Second, Worker: 0, For: lease * 3 / 2}},
	})
	requireFired(t, rep, FaultLinkDown)
	if rep.Pass || rep.Duplicates == 0 {
		t.Fatalf("the naive baseline passed on hosts with %d duplicates", rep.Duplicates)
	}
}
