package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/faultproxy"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/queue"
)

// Queues of the harness's own jobs in a failover run; no worker process serves them.
const (
	// probeQueue: the probe enqueues a noop job, claims it and completes it, again and
	// again, keeping outside the database which enqueues and completions were
	// acknowledged.
	probeQueue = "chaos-probe"
	// fenceQueue: the job whose lease the harness revokes before the failover.
	fenceQueue = "chaos-fence"
)

// holdWindow is how long, from the first COMMIT reply held, every COMMIT reply is held
// before the primary is killed: the commits in flight at the kill.
const holdWindow = 300 * time.Millisecond

// heldCommit is a COMMIT whose reply a worker's proxy held when the primary died.
type heldCommit struct {
	w *Worker
	d faultproxy.CommitDrop
}

func describeHeld(hs []heldCommit) string {
	if len(hs) == 0 {
		return "no COMMIT crossed a proxy in time: none was in flight at the kill"
	}
	by := map[string]int{}
	var names []string
	for _, h := range hs {
		if by[h.w.Name] == 0 {
			names = append(names, h.w.Name)
		}
		by[h.w.Name]++
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %d", n, by[n])
	}
	return fmt.Sprintf("%d COMMIT replies held at the kill (%s)", len(hs), strings.Join(parts, ", "))
}

// failoverState is what a failover run keeps outside the database: the acknowledged
// writes, the revoked lease, the COMMIT in flight at the kill.
type failoverState struct {
	mu sync.Mutex
	// probe acknowledgements: enqueues and completions whose COMMIT was answered, each
	// job with the tag it carries in its metadata (ids alone are not enough: a promoted
	// standby that lost the end of the primary's WAL hands the same ids out again).
	enqueued  []ackedJob
	completed []ackedJob
	seq       int
	// stale is the lease revoked before the kill; revokedGen the generation after.
	stale      *queue.Lease
	revokedGen int64
	// staleAfter says what became of a write under the stale lease after the failover.
	staleWrite  string
	staleGenNow int64
	staleOK     bool
	// inflight are the COMMITs whose replies were held when the primary died.
	inflight   []heldCommit
	logBefore  map[*Worker]int
	killedAt   time.Time
	promotedIn time.Duration
	lagBytes   int64
	done       bool
}

// FailoverReport is what a failover run proves, measured on the promoted standby.
type FailoverReport struct {
	// Replication is "sync" or "async".
	Replication string `json:"replication"`
	// Done is false when the failover fault did not run.
	Done bool `json:"done"`
	// PromotedIn is the time from the kill of the primary to the end of promotion.
	PromotedIn Duration `json:"promoted_in"`
	// LagBytes is how far the standby's replay was behind the primary's WAL at the kill
	// (read on the primary just before it).
	LagBytes int64 `json:"lag_bytes"`
	// Acknowledged writes kept outside the database, and those missing on the promoted
	// standby, by kind: enqueues (the workload's and the probe's), completions (the
	// probe's), orders answered 201 by the HTTP API, and the outcomes the workers logged
	// after their commit returned (invoices, orders, deliveries).
	Acked   map[string]int64 `json:"acked"`
	Missing map[string]int64 `json:"missing"`
	// MissingExamples names up to 10 missing writes.
	MissingExamples []string `json:"missing_examples,omitempty"`
	// StaleLease is the lease revoked before the kill: its job and generations, and
	// whether a write under it was rejected after the failover.
	StaleJob       int64  `json:"stale_job"`
	StaleGen       int64  `json:"stale_gen"`
	RevokedGen     int64  `json:"revoked_gen"`
	GenAfter       int64  `json:"gen_after"`
	StaleRejected  bool   `json:"stale_rejected"`
	StaleWriteSaid string `json:"stale_write"`
	// InFlight describes the COMMIT whose reply died with the primary, and Reconciled
	// the jobs whose worker then found their commit landed instead of writing again.
	InFlight        string   `json:"in_flight"`
	InFlightCommits int      `json:"in_flight_commits"`
	Reconciled      []string `json:"reconciled,omitempty"`
	// RepeatedWrites counts stale writes rejected for the reconciled jobs' leases: a
	// worker that wrote again after its commit had landed.
	RepeatedWrites int64 `json:"repeated_writes"`
}

// runProbe enqueues, claims and completes one noop job in probeQueue every 20ms until
// stop (new enqueues end at until), recording each acknowledged COMMIT. Failed steps
// are left to the reaper: an unacknowledged claim's job becomes available again.
func (e *Env) runProbe(ctx context.Context, pool *pgxpool.Pool, until time.Time, stop <-chan struct{}) {
	id := "fenceq-" + e.Token + "-probe"
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Now().Before(until) {
			e.fo.mu.Lock()
			e.fo.seq++
			tag := fmt.Sprintf("%s-probe-%d", e.Token, e.fo.seq)
			e.fo.mu.Unlock()
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			res, err := fenceq.Enqueue(wctx, pool, diag.NoopArgs{},
				&fenceq.InsertOpts{Queue: probeQueue, Metadata: map[string]any{ackTag: tag}})
			cancel()
			if err == nil {
				e.fo.mu.Lock()
				e.fo.enqueued = append(e.fo.enqueued, ackedJob{res.Job.ID, tag})
				e.fo.mu.Unlock()
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		jobs, err := store.Claim(wctx, pool, store.ClaimParams{Queue: probeQueue, WorkerID: id, Limit: 4, Lease: e.cfg.Lease})
		for _, j := range jobs {
			if err == nil {
				if err = store.Complete(wctx, pool, store.LeaseOf(j)); err == nil {
					var m map[string]string
					_ = json.Unmarshal(j.Metadata, &m)
					e.fo.mu.Lock()
					e.fo.completed = append(e.fo.completed, ackedJob{j.ID, m[ackTag]})
					e.fo.mu.Unlock()
				}
			}
		}
		cancel()
	}
}

// ackTag is the metadata key of the tag every acknowledged enqueue of the harness
// carries.
const ackTag = "chaos_ack"

// ackedJob is an acknowledged enqueue or completion: the job's id and its tag.
type ackedJob struct {
	ID  int64
	Tag string
}

func splitAcked(js []ackedJob) ([]int64, []string) {
	ids, tags := make([]int64, len(js)), make([]string, len(js))
	for i, j := range js {
		ids[i], tags[i] = j.ID, j.Tag
	}
	return ids, tags
}

// probeJobIDs returns the probe's acknowledged enqueues.
func (e *Env) probeJobIDs() []int64 {
	if e.fo == nil {
		return nil
	}
	e.fo.mu.Lock()
	defer e.fo.mu.Unlock()
	ids, _ := splitAcked(e.fo.enqueued)
	return ids
}

// revokeBeforeFailover claims a job of fenceQueue for the harness and revokes the
// lease as an operator would (jobs requeue): the generation is bumped on the primary.
func (e *Env) revokeBeforeFailover(ctx context.Context) error {
	res, err := fenceq.Enqueue(ctx, e.Pool, diag.NoopArgs{}, &fenceq.InsertOpts{Queue: fenceQueue})
	if err != nil {
		return fmt.Errorf("enqueue the job to revoke: %w", err)
	}
	jobs, err := store.Claim(ctx, e.Pool, store.ClaimParams{Queue: fenceQueue, WorkerID: "fenceq-" + e.Token + "-stale",
		Limit: 1, Lease: time.Hour})
	if err != nil || len(jobs) != 1 || jobs[0].ID != res.Job.ID {
		return fmt.Errorf("claim the job to revoke: got %d jobs, %v", len(jobs), err)
	}
	l := store.LeaseOf(jobs[0])
	row, err := store.RequeueJob(ctx, e.Pool, l.JobID)
	if err != nil {
		return fmt.Errorf("revoke lease of job %d: %w", l.JobID, err)
	}
	if row.LeaseGen <= l.Gen {
		return fmt.Errorf("requeue of job %d left generation %d (lease had %d)", l.JobID, row.LeaseGen, l.Gen)
	}
	e.fo.mu.Lock()
	e.fo.stale, e.fo.revokedGen = &l, row.LeaseGen
	e.fo.mu.Unlock()
	return nil
}

// failover kills the primary while a COMMIT of a worker is in flight (its reply held by
// the worker's proxy), promotes the standby and waits until the harness and every worker
// work on it. Before the kill it revokes a lease; after the promotion it writes under
// that stale lease and records whether the new primary rejected the write.
func (e *Env) failover(ctx context.Context) (string, error) {
	if e.Standby == nil {
		return "", errors.New("the harness runs no standby (run with --failover)")
	}
	e.fo.mu.Lock()
	if e.fo.done {
		e.fo.mu.Unlock()
		return "", errors.New("the primary already failed over once")
	}
	e.fo.mu.Unlock()
	if err := e.revokeBeforeFailover(ctx); err != nil {
		return "", err
	}
	var lagNote string
	if e.cfg.ReplicaLag > 0 {
		// The link between the servers goes silent: what the primary acknowledges
		// meanwhile never reaches the standby.
		before := e.replProxy.Dropped()
		e.replProxy.SetBlackhole(true)
		sleepCtx(ctx, e.cfg.ReplicaLag)
		lagNote = fmt.Sprintf("replication link silent for %s (%d bytes swallowed so far); ", e.cfg.ReplicaLag,
			e.replProxy.Dropped()-before)
	}
	// Arm every worker's proxy to the primary: from the first COMMIT reply held, every
	// reply is held for holdWindow more, then the primary dies with them in flight.
	before := map[*Worker]int{}
	for _, w := range e.Workers {
		before[w] = countMatches(w.LogPath(), reconciledRe)
	}
	var hmu sync.Mutex
	var holds []heldCommit
	first := make(chan struct{}, 1)
	for _, w := range e.Workers {
		w.Proxy.HoldCommitReplies(1<<20, func(d faultproxy.CommitDrop) {
			hmu.Lock()
			holds = append(holds, heldCommit{w, d})
			hmu.Unlock()
			select {
			case first <- struct{}{}:
			default:
			}
		})
	}
	disarm := func() {
		for _, w := range e.Workers {
			w.Proxy.HoldCommitReplies(0, nil)
		}
	}
	defer disarm()
	wait := commitDropWait
	if lim := e.waitLimit(); !lim.IsZero() && time.Until(lim) < wait {
		wait = max(time.Until(lim), time.Second) // the work has stopped: commits have too
	}
	select {
	case <-first:
		sleepCtx(ctx, holdWindow)
	case <-time.After(wait):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	var lag int64
	_ = e.Pool.QueryRow(ctx, sqlReplicaLag).Scan(&lag)

	killed := time.Now()
	err := e.Cluster.Kill(ctx)
	disarm()
	if e.cfg.ReplicaLag > 0 {
		// Whatever was still on its way died with the primary.
		e.replProxy.ResetAll()
		e.replProxy.SetBlackhole(false)
	}
	hmu.Lock()
	inflight := slices.Clone(holds)
	hmu.Unlock()
	if err != nil {
		return "", fmt.Errorf("kill the primary: %w", err)
	}
	if c, err := pgx.Connect(ctx, e.Cluster.URL); err == nil {
		_ = c.Close(ctx)
		return "", errors.New("the primary still accepts connections after pg_ctl stop -m immediate")
	}
	if err := e.Standby.Promote(ctx); err != nil {
		return "", fmt.Errorf("promote the standby: %w", err)
	}
	promotedIn := time.Since(killed)
	var inRecovery bool
	var port int
	if err := e.waitQuery(ctx, 30*time.Second, func() error {
		return e.Pool.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('port')::int`).Scan(&inRecovery, &port)
	}); err != nil {
		return "", fmt.Errorf("the harness does not reach the promoted standby: %w", err)
	}
	if inRecovery || port != e.Standby.Port {
		return "", fmt.Errorf("after the promotion the harness's pool is on port %d (in recovery %v); want the standby's %d",
			port, inRecovery, e.Standby.Port)
	}
	// Every worker writes on the new primary: its heartbeat renews its row there.
	var promotedAt time.Time
	if err := e.Pool.QueryRow(ctx, `SELECT now()`).Scan(&promotedAt); err != nil {
		return "", err
	}
	for _, w := range e.Workers {
		if err := e.waitQuery(ctx, 30*time.Second, func() error {
			var n int
			if err := e.Pool.QueryRow(ctx, sqlWorkerBeatSince, w.ID(), promotedAt).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("%s has not heartbeated on the new primary", w.Name)
			}
			return nil
		}); err != nil {
			return "", err
		}
	}
	staleNote := e.writeUnderStaleLease(ctx)

	e.fo.mu.Lock()
	e.fo.done, e.fo.killedAt, e.fo.promotedIn, e.fo.lagBytes, e.fo.logBefore = true, killed, promotedIn, lag, before
	e.fo.inflight = inflight
	e.fo.mu.Unlock()
	return fmt.Sprintf("%s%s; pg_ctl stop -m immediate: the primary refuses connections; standby promoted in %s "+
		"(pg_is_in_recovery false, port %d); standby was %d WAL bytes behind; all %d workers heartbeat on it; %s",
		lagNote, describeHeld(inflight), promotedIn.Round(time.Millisecond), port, lag, len(e.Workers), staleNote), nil
}

// writeUnderStaleLease completes the revoked job under its old lease on the new
// primary, records whether that was rejected, and then settles the job under a fresh
// lease of the harness's so that the run can drain.
func (e *Env) writeUnderStaleLease(ctx context.Context) string {
	e.fo.mu.Lock()
	l, revoked := *e.fo.stale, e.fo.revokedGen
	e.fo.mu.Unlock()
	var gen int64
	_ = e.Pool.QueryRow(ctx, `SELECT lease_gen FROM fenceq_jobs WHERE id = $1`, l.JobID).Scan(&gen)
	err := store.Complete(ctx, e.Pool, l)
	rejected := errors.Is(err, queue.ErrLeaseLost)
	said := "accepted"
	if err != nil {
		said = err.Error()
	}
	e.fo.mu.Lock()
	e.fo.staleOK, e.fo.staleWrite, e.fo.staleGenNow = rejected, said, gen
	e.fo.mu.Unlock()
	if !rejected && err == nil {
		return fmt.Sprintf("the write under the revoked lease of job %d (gen %d, revoked to %d) was ACCEPTED on the new primary (gen %d there)",
			l.JobID, l.Gen, revoked, gen)
	}
	// Settle it: claim it afresh and complete it.
	if jobs, err := store.Claim(ctx, e.Pool, store.ClaimParams{Queue: fenceQueue, WorkerID: "fenceq-" + e.Token + "-harness",
		Limit: 1, Lease: time.Minute}); err == nil {
		for _, j := range jobs {
			_ = store.Complete(ctx, e.Pool, store.LeaseOf(j))
		}
	}
	return fmt.Sprintf("the revoked lease of job %d (gen %d → %d) has gen %d on the new primary; a write under it: %s",
		l.JobID, l.Gen, revoked, gen, said)
}

func (e *Env) waitQuery(ctx context.Context, within time.Duration, q func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := q()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// Acknowledgements the workers log once their commit returned, with what identifies
// the row beyond its id (a promoted standby that lost the end of the primary's WAL
// hands the same ids out again): the job and lease that wrote an invoice or an order,
// the dedupe key of an outbox row.
var (
	ackInvoiceRe   = regexp.MustCompile(`msg="invoice created"[^\n]*? job_id=(\d+) lease_gen=(\d+)[^\n]*? invoice_id=(\d+)`)
	ackOrderRe     = regexp.MustCompile(`msg="order placed by job"[^\n]*? job_id=(\d+) lease_gen=(\d+)[^\n]*? order_id=(\d+)`)
	ackDeliveredRe = regexp.MustCompile(`msg="outbox row delivered"[^\n]*? outbox_id=(\d+)[^\n]*? dedupe_key=(\S+)`)
)

// loggedAcks returns the submatches of re in the workers' logs, one slice per group.
func loggedAcks(paths []string, re *regexp.Regexp) [][]string {
	cols := make([][]string, re.NumSubexp())
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			for i := range cols {
				cols[i] = append(cols[i], string(m[i+1]))
			}
		}
	}
	return cols
}

func ints(ss []string) []int64 {
	out := make([]int64, len(ss))
	for i, s := range ss {
		out[i], _ = strconv.ParseInt(s, 10, 64)
	}
	return out
}

// failoverReport checks every acknowledged write on the promoted standby and reads
// what became of the revoked lease and of the COMMIT in flight at the kill.
func (e *Env) failoverReport(ctx context.Context, wl *Workload) (*FailoverReport, error) {
	fo := e.fo
	fo.mu.Lock()
	defer fo.mu.Unlock()
	r := &FailoverReport{Replication: "sync", Done: fo.done, Acked: map[string]int64{}, Missing: map[string]int64{}}
	if e.cfg.AsyncReplication {
		r.Replication = "async"
	}
	if !fo.done {
		return r, nil
	}
	r.PromotedIn, r.LagBytes = Duration(fo.promotedIn.Round(time.Millisecond)), fo.lagBytes
	var logs []string
	for _, w := range e.Workers {
		logs = append(logs, w.LogPath())
	}
	enqueued := append(append([]ackedJob(nil), fo.enqueued...), wl.AckedJobs()...)
	enqIDs, enqTags := splitAcked(enqueued)
	doneIDs, doneTags := splitAcked(fo.completed)
	inv := loggedAcks(logs, ackInvoiceRe)
	ord := loggedAcks(logs, ackOrderRe)
	del := loggedAcks(logs, ackDeliveredRe)
	checks := []struct {
		name, sql string
		n         int
		args      []any
	}{
		{"enqueues", sqlMissingJobs, len(enqIDs), []any{enqIDs, enqTags}},
		{"completions", sqlMissingCompleted, len(doneIDs), []any{doneIDs, doneTags}},
		{"invoices", sqlMissingInvoiceIDs, len(inv[2]), []any{ints(inv[2]), ints(inv[0]), ints(inv[1])}},
		{"orders_by_jobs", sqlMissingOrderIDs, len(ord[2]), []any{ints(ord[2]), ints(ord[0]), ints(ord[1])}},
		{"deliveries", sqlMissingDelivered, len(del[0]), []any{ints(del[0]), del[1]}},
	}
	for _, c := range checks {
		r.Acked[c.name] = int64(c.n)
		rows, err := e.Pool.Query(ctx, c.sql, c.args...)
		if err != nil {
			return nil, fmt.Errorf("chaos: failover report: %s: %w", c.name, err)
		}
		missing, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return nil, fmt.Errorf("chaos: failover report: %s: %w", c.name, err)
		}
		r.Missing[c.name] = int64(len(missing))
		for _, id := range missing {
			if len(r.MissingExamples) < 10 {
				r.MissingExamples = append(r.MissingExamples, fmt.Sprintf("%s %d", c.name, id))
			}
		}
	}
	keys := wl.AckedKeys()
	r.Acked["orders_by_http"] = int64(len(keys))
	var n int64
	if err := e.Pool.QueryRow(ctx, sqlMissingOrders, keys).Scan(&n); err != nil {
		return nil, fmt.Errorf("chaos: failover report: orders: %w", err)
	}
	r.Missing["orders_by_http"] = n

	if fo.stale != nil {
		r.StaleJob, r.StaleGen, r.RevokedGen = fo.stale.JobID, fo.stale.Gen, fo.revokedGen
		r.GenAfter, r.StaleRejected, r.StaleWriteSaid = fo.staleGenNow, fo.staleOK, fo.staleWrite
	}
	r.InFlight = describeHeld(fo.inflight)
	r.InFlightCommits = len(fo.inflight)
	if len(fo.inflight) > 0 {
		for _, w := range e.Workers {
			if n := countMatches(w.LogPath(), reconciledRe) - fo.logBefore[w]; n > 0 {
				for _, j := range lastMatches(w.LogPath(), reconciledRe, n) {
					r.Reconciled = append(r.Reconciled, w.Name+": job "+j)
					id, _ := strconv.ParseInt(j, 10, 64)
					var repeated int64
					if err := e.Pool.QueryRow(ctx, sqlRepeatedWrites, id).Scan(&repeated); err == nil {
						r.RepeatedWrites += repeated
					}
				}
			}
		}
	}
	return r, nil
}

// failures says what the failover report proves wrong; with asynchronous replication
// losses are measured, not failures.
func (r *FailoverReport) failures() []string {
	if r == nil {
		return nil
	}
	if !r.Done {
		return []string{"the failover did not happen"}
	}
	var out []string
	if r.Replication == "sync" {
		for k, n := range r.Missing {
			if n > 0 {
				out = append(out, fmt.Sprintf("%d acknowledged %s missing on the promoted standby", n, k))
			}
		}
		if !r.StaleRejected {
			out = append(out, fmt.Sprintf("the write under the lease revoked before the failover was not rejected: %s", r.StaleWriteSaid))
		}
		if r.GenAfter != r.RevokedGen {
			out = append(out, fmt.Sprintf("the revoked job has generation %d on the promoted standby, want %d", r.GenAfter, r.RevokedGen))
		}
		if r.InFlightCommits == 0 {
			out = append(out, "no COMMIT was in flight at the kill")
		}
	}
	if r.RepeatedWrites > 0 {
		out = append(out, fmt.Sprintf("%d writes repeated after a commit that landed", r.RepeatedWrites))
	}
	return out
}
