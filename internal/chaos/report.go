package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/verify"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// Duration is a time.Duration that reads and writes JSON as a Go duration string.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// String formats d as a Go duration string, e.g. "1.5s".
func (d Duration) String() string { return time.Duration(d).String() }

// FaultSummary counts one fault type's injections.
type FaultSummary struct {
	Type FaultType `json:"type"`
	// Scheduled is how many the schedule held, Started how many were injected before
	// the run ended, Fired how many provably happened.
	Scheduled int `json:"scheduled"`
	Started   int `json:"started"`
	Fired     int `json:"fired"`
	// Skipped says why the type was not scheduled although asked for.
	Skipped string `json:"skipped,omitempty"`
}

// Counts of business rows.
type Counts struct {
	Rows     int64 `json:"rows"`
	Distinct int64 `json:"distinct"`
	// Missing counts expected rows that do not exist (customers without an invoice,
	// storm keys without an order).
	Missing int64 `json:"missing"`
}

// OutboxCounts are the outbox rows by state.
type OutboxCounts struct {
	Rows      int64 `json:"rows"`
	Delivered int64 `json:"delivered"`
	Failed    int64 `json:"failed"`
	// Pending rows were never delivered.
	Pending int64 `json:"pending"`
}

// EmailCounts are the emails the mail files received.
type EmailCounts struct {
	// Checked is false when the workers had no mail file.
	Checked bool `json:"checked"`
	// Lines are messages written; DistinctKeys their distinct idempotency keys.
	Lines        int64 `json:"lines"`
	DistinctKeys int64 `json:"distinct_keys"`
	// Redelivered counts surplus messages with a key already delivered: at-least-once
	// delivery, which receivers deduplicate by Idempotency-Key (G4), so not a duplicate
	// outcome.
	Redelivered int64 `json:"redelivered"`
	// NotReceived counts outbox rows marked delivered whose message no mail file holds.
	NotReceived int64 `json:"not_received"`
	// SurplusPerRecipient counts, per recipient and kind of email (invoice, order),
	// distinct messages beyond the first: what a customer sees as a duplicate. Each
	// recipient of the workload stands for one invoice or one order.
	SurplusPerRecipient int64 `json:"surplus_per_recipient"`
	// notReceived names (up to 10) the rows behind NotReceived, for Report.Missing.
	notReceived []string
}

// Report is the outcome of a run.
type Report struct {
	// Mode is "fenced" (fenceq's workers) or "naive" (the baseline).
	Mode     string   `json:"mode"`
	Seed     int64    `json:"seed"`
	Workers  int      `json:"workers"`
	Lease    Duration `json:"lease"`
	Duration Duration `json:"duration"`
	// FaultPhase is how long the faults and the workload really ran: Duration, or
	// longer when a late fault (one of a type not yet tried) fired after it.
	FaultPhase Duration `json:"fault_phase"`
	// Elapsed is the whole run; Settle how long the work took to drain after the
	// faults stopped.
	Elapsed Duration `json:"elapsed"`
	Settle  Duration `json:"settle"`
	Schema  string   `json:"schema"`
	LogDir  string   `json:"log_dir"`

	Jobs struct {
		Total   int64                       `json:"total"`
		ByState map[string]int64            `json:"by_state"`
		ByKind  map[string]map[string]int64 `json:"by_kind"`
		// Claims counts every lease taken (attempts).
		Claims int64 `json:"claims"`
	} `json:"jobs"`
	Workload WorkloadStats `json:"workload"`

	Faults   []FaultSummary `json:"faults"`
	FaultLog []FaultRecord  `json:"fault_log"`

	// LeaseEvents counts fenceq_lease_events by kind.
	LeaseEvents         map[string]int64 `json:"lease_events"`
	StaleWritesRejected int64            `json:"stale_writes_rejected"`
	ExpiredHolderAlive  int64            `json:"expired_holder_alive"`
	// Revocations, how many revoked jobs were claimed again, and the longest wait from
	// a revocation to the next claim (G5: within lease + reaper interval + claim poll).
	Revocations        int64    `json:"revocations"`
	RevokedReclaimed   int64    `json:"revoked_reclaimed"`
	LongestRevokedWait Duration `json:"longest_revoked_wait"`
	// Takeovers counts claims of a job still running under another worker's expired
	// claim: how the naive baseline loses its leases (it records no revocation).
	Takeovers int64 `json:"takeovers"`
	// NoLeaseLog is set on Citus, where the harness has no lease log: Jobs.Claims,
	// RevokedReclaimed, LongestRevokedWait and Takeovers are not measured.
	NoLeaseLog bool `json:"no_lease_log,omitempty"`
	// SleepJobs longer than the lease: completed, and on their first attempt.
	SleepCompleted    int64 `json:"sleep_completed"`
	SleepFirstAttempt int64 `json:"sleep_first_attempt"`

	Invoices Counts       `json:"invoices"`
	Orders   Counts       `json:"orders"`
	Outbox   OutboxCounts `json:"outbox"`
	Emails   EmailCounts  `json:"emails"`

	// Duplicates is the sum of DuplicateDetail: surplus invoices per (customer, period),
	// orders per idempotency key, outbox rows per dedupe key.
	Duplicates      int64            `json:"duplicates"`
	DuplicateDetail map[string]int64 `json:"duplicate_detail"`
	// Lost is the sum of LostDetail: jobs not finished or missing, jobs discarded,
	// expected invoices and orders that do not exist, emails not received.
	Lost       int64            `json:"lost"`
	LostDetail map[string]int64 `json:"lost_detail"`

	// Unfinished and Discarded describe (up to 10) jobs behind a non-zero lost count.
	Unfinished []string `json:"unfinished,omitempty"`
	Discarded  []string `json:"discarded,omitempty"`
	// Missing describes (up to 10 of each) the rest behind a non-zero lost count:
	// revoked leases never run again, missing invoices and orders, undelivered outbox
	// rows and emails not received.
	Missing []string `json:"missing,omitempty"`

	// Failover is what a failover run proved on the promoted standby.
	Failover *FailoverReport `json:"failover,omitempty"`
	// Flow is what the flow workload's checks found (nil for the other workloads).
	Flow *FlowReport `json:"flow,omitempty"`
	// Asserted is false when the run measures rather than asserts (a failover with
	// asynchronous replication, which is expected to lose acknowledged writes): its
	// failures are reported, and `fenceq chaos` still exits 0.
	Asserted bool `json:"asserted"`

	Verify *verify.Report `json:"verify"`
	// Crashes lists worker processes that exited without being told to.
	Crashes []string `json:"crashes,omitempty"`
	// Pass is true when there are no duplicates, nothing was lost, every scheduled
	// fault type fired at least once and no worker crashed. Failures says what failed.
	Pass     bool     `json:"pass"`
	Failures []string `json:"failures,omitempty"`
}

// collectInput is what the report is computed from besides the database.
type collectInput struct {
	env      *Env
	wl       *Workload
	plan     []PlannedFault
	records  []FaultRecord
	skipped  map[FaultType]string
	asked    []FaultType
	seed     int64
	duration time.Duration
}

func collect(ctx context.Context, in collectInput) (*Report, error) {
	e := in.env
	r := &Report{Mode: "fenced", Seed: in.seed, Workers: len(e.Workers), Lease: Duration(e.cfg.Lease),
		Duration: Duration(in.duration), Schema: e.Schema, LogDir: e.LogDir,
		LeaseEvents: map[string]int64{}, DuplicateDetail: map[string]int64{}, LostDetail: map[string]int64{}}
	if e.cfg.Naive {
		r.Mode = "naive"
	}
	db := e.Pool
	r.Jobs.ByState = map[string]int64{}
	r.Jobs.ByKind = map[string]map[string]int64{}
	rows, err := db.Query(ctx, sqlJobsByKindState)
	if err != nil {
		return nil, fmt.Errorf("chaos: report: jobs: %w", err)
	}
	for rows.Next() {
		var kind, state string
		var n int64
		if err := rows.Scan(&kind, &state, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("chaos: report: jobs: %w", err)
		}
		r.Jobs.Total += n
		r.Jobs.ByState[state] += n
		if r.Jobs.ByKind[kind] == nil {
			r.Jobs.ByKind[kind] = map[string]int64{}
		}
		r.Jobs.ByKind[kind][state] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: report: jobs: %w", err)
	}
	r.NoLeaseLog = e.Citus
	if !r.NoLeaseLog {
		if err := db.QueryRow(ctx, sqlClaimCount).Scan(&r.Jobs.Claims); err != nil {
			return nil, fmt.Errorf("chaos: report: claims: %w", err)
		}
	}

	for _, k := range queue.LeaseEventKinds() {
		r.LeaseEvents[string(k)] = 0
	}
	rows, err = db.Query(ctx, sqlLeaseEventCounts)
	if err != nil {
		return nil, fmt.Errorf("chaos: report: lease events: %w", err)
	}
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("chaos: report: lease events: %w", err)
		}
		r.LeaseEvents[k] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("chaos: report: lease events: %w", err)
	}
	r.StaleWritesRejected = r.LeaseEvents[string(queue.EventStaleWriteRejected)]
	r.ExpiredHolderAlive = r.LeaseEvents[string(queue.EventExpiredHolderAlive)]
	r.Revocations = r.LeaseEvents[string(queue.EventRevoked)]

	var longest float64
	var neverRerun int64
	if !r.NoLeaseLog {
		if err := db.QueryRow(ctx, sqlRevokedWaits).Scan(&r.RevokedReclaimed, &longest, &neverRerun); err != nil {
			return nil, fmt.Errorf("chaos: report: revocation waits: %w", err)
		}
		r.LongestRevokedWait = Duration(time.Duration(longest * float64(time.Second)).Round(time.Millisecond))
		if err := db.QueryRow(ctx, sqlTakeovers).Scan(&r.Takeovers); err != nil {
			return nil, fmt.Errorf("chaos: report: takeovers: %w", err)
		}
	}
	if err := db.QueryRow(ctx, sqlSleepFirstAttempt).Scan(&r.SleepCompleted, &r.SleepFirstAttempt); err != nil {
		return nil, fmt.Errorf("chaos: report: sleep jobs: %w", err)
	}

	if err := db.QueryRow(ctx, sqlInvoiceCounts).Scan(&r.Invoices.Rows, &r.Invoices.Distinct); err != nil {
		return nil, fmt.Errorf("chaos: report: invoices: %w", err)
	}
	if err := db.QueryRow(ctx, sqlOrderCounts).Scan(&r.Orders.Rows, &r.Orders.Distinct); err != nil {
		return nil, fmt.Errorf("chaos: report: orders: %w", err)
	}
	if err := db.QueryRow(ctx, sqlOutboxCounts).Scan(&r.Outbox.Rows, &r.Outbox.Delivered, &r.Outbox.Failed); err != nil {
		return nil, fmt.Errorf("chaos: report: outbox: %w", err)
	}
	r.Outbox.Pending = r.Outbox.Rows - r.Outbox.Delivered - r.Outbox.Failed
	if in.wl != nil {
		r.Workload = in.wl.Stats()
		if err := db.QueryRow(ctx, sqlMissingInvoices, []string{in.wl.cfg.Period}).Scan(&r.Invoices.Missing); err != nil {
			return nil, fmt.Errorf("chaos: report: missing invoices: %w", err)
		}
		if err := db.QueryRow(ctx, sqlMissingOrders, in.wl.Keys()).Scan(&r.Orders.Missing); err != nil {
			return nil, fmt.Errorf("chaos: report: missing orders: %w", err)
		}
	}
	if err := r.countEmails(ctx, e); err != nil {
		return nil, err
	}

	var expected []int64
	if in.wl != nil {
		expected = in.wl.JobIDs()
	}
	expected = append(expected, e.probeJobIDs()...)
	r.Asserted = !e.cfg.AsyncReplication
	if e.fo != nil && in.wl != nil {
		if r.Failover, err = e.failoverReport(ctx, in.wl); err != nil {
			return nil, err
		}
	}
	r.Verify, err = verify.Run(ctx, db, verify.Options{ReaperInterval: e.cfg.Reaper, Grace: e.cfg.Lease,
		ExpectedJobs: expected, RequireFinal: true, RequireAllFinal: true, IgnoreKinds: builtin.RecurringKinds()})
	if err != nil {
		return nil, fmt.Errorf("chaos: report: %w", err)
	}

	r.DuplicateDetail["invoices"] = r.Verify.Count(verify.CheckDuplicateInvoices)
	r.DuplicateDetail["orders"] = r.Verify.Count(verify.CheckDuplicateOrders)
	r.DuplicateDetail["outbox_rows"] = r.Verify.Count(verify.CheckOutboxKeys)
	r.DuplicateDetail["emails_per_recipient"] = r.Emails.SurplusPerRecipient
	r.LostDetail["jobs"] = r.Verify.Lost()
	r.LostDetail["jobs_discarded"] = r.Jobs.ByState[string(queue.StateDiscarded)] + r.Jobs.ByState[string(queue.StateCancelled)]
	r.LostDetail["invoices_missing"] = r.Invoices.Missing
	r.LostDetail["orders_missing"] = r.Orders.Missing
	r.LostDetail["outbox_undelivered"] = r.Outbox.Pending + r.Outbox.Failed
	r.LostDetail["emails_not_received"] = r.Emails.NotReceived
	r.LostDetail["revoked_never_rerun"] = neverRerun
	for _, n := range r.DuplicateDetail {
		r.Duplicates += n
	}
	for _, n := range r.LostDetail {
		r.Lost += n
	}

	if r.Unfinished, err = queryStrings(ctx, db, sqlUnfinishedDetail, builtin.RecurringKinds(), 10); err != nil {
		return nil, fmt.Errorf("chaos: report: unfinished jobs: %w", err)
	}
	if r.Discarded, err = queryStrings(ctx, db, sqlDiscardedDetail, 10); err != nil {
		return nil, fmt.Errorf("chaos: report: discarded jobs: %w", err)
	}
	if err := r.describeMissing(ctx, db, in.wl); err != nil {
		return nil, err
	}
	if in.wl != nil && in.wl.cfg.Flow {
		if r.Flow, err = checkFlow(ctx, db, !e.cfg.Naive); err != nil {
			return nil, err
		}
	}
	r.summarizeFaults(in)
	for _, w := range e.Workers {
		if w.Proc.Unexpected() {
			r.Crashes = append(r.Crashes, fmt.Sprintf("%s (%s) exited on its own: %s; see %s",
				w.Name, w.ID(), w.Proc.ExitStatus(), w.LogPath()))
		}
	}
	r.judge()
	return r, nil
}

// describeMissing fills Missing with the rows behind each non-zero lost count that
// Unfinished, Discarded and the verify checks do not already name.
func (r *Report) describeMissing(ctx context.Context, db queue.DBTX, wl *Workload) error {
	type detail struct {
		count int64
		sql   string
		args  []any
	}
	details := []detail{
		{r.LostDetail["revoked_never_rerun"], sqlNeverRerunDetail, []any{10}},
		{r.LostDetail["outbox_undelivered"], sqlUndeliveredDetail, []any{10}},
	}
	if wl != nil {
		details = append(details,
			detail{r.Invoices.Missing, sqlMissingInvoicesDetail, []any{[]string{wl.cfg.Period}, 10}},
			detail{r.Orders.Missing, sqlMissingOrdersDetail, []any{wl.Keys(), 10}})
	}
	for _, d := range details {
		if d.count == 0 {
			continue
		}
		lines, err := queryStrings(ctx, db, d.sql, d.args...)
		if err != nil {
			return fmt.Errorf("chaos: report: describe what was lost: %w", err)
		}
		r.Missing = append(r.Missing, lines...)
	}
	r.Missing = append(r.Missing, r.Emails.notReceived...)
	return nil
}

func (r *Report) summarizeFaults(in collectInput) {
	by := map[FaultType]*FaultSummary{}
	for _, t := range in.asked {
		by[t] = &FaultSummary{Type: t, Skipped: in.skipped[t]}
	}
	for _, f := range in.plan {
		if by[f.Type] == nil {
			by[f.Type] = &FaultSummary{Type: f.Type}
		}
		by[f.Type].Scheduled++
	}
	for _, rec := range in.records {
		by[rec.Type].Started++
		if rec.Fired {
			by[rec.Type].Fired++
		}
	}
	for _, t := range AllFaults {
		if s := by[t]; s != nil {
			r.Faults = append(r.Faults, *s)
		}
	}
	r.FaultLog = in.records
}

func (r *Report) judge() {
	r.Failures = nil
	if r.Duplicates > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d duplicates %s", r.Duplicates, formatNonZero(r.DuplicateDetail)))
	}
	if r.Lost > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d lost %s", r.Lost, formatNonZero(r.LostDetail)))
	}
	if r.Mode == "fenced" && r.Takeovers > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d claims of a job still running under another lease", r.Takeovers))
	}
	for _, f := range r.Faults {
		if f.Scheduled > 0 && f.Fired == 0 {
			r.Failures = append(r.Failures, fmt.Sprintf("fault %s was scheduled %d times and never fired", f.Type, f.Scheduled))
		}
	}
	r.Failures = append(r.Failures, r.Crashes...)
	r.Failures = append(r.Failures, r.Failover.failures()...)
	r.Failures = append(r.Failures, r.Flow.failures()...)
	r.Pass = len(r.Failures) == 0
}

// countEmails reads the workers' mail files: one JSON message per line.
func (r *Report) countEmails(ctx context.Context, e *Env) error {
	r.Emails.Checked = true
	seen := map[string]int64{}
	perRecipient := map[string]map[string]bool{}
	for _, w := range e.Workers {
		f, err := os.Open(w.MailFile)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("chaos: report: mail file: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var m email.Message
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				_ = f.Close()
				return fmt.Errorf("chaos: report: %s: %w", w.MailFile, err)
			}
			r.Emails.Lines++
			seen[m.IdempotencyKey]++
			kind, _, _ := strings.Cut(m.IdempotencyKey, ":")
			for _, to := range m.To {
				rk := to + " " + kind
				if perRecipient[rk] == nil {
					perRecipient[rk] = map[string]bool{}
				}
				perRecipient[rk][m.IdempotencyKey] = true
			}
		}
		_ = f.Close()
		if err := sc.Err(); err != nil {
			return fmt.Errorf("chaos: report: %s: %w", w.MailFile, err)
		}
	}
	for _, keys := range perRecipient {
		r.Emails.SurplusPerRecipient += int64(len(keys) - 1)
	}
	r.Emails.DistinctKeys = int64(len(seen))
	r.Emails.Redelivered = r.Emails.Lines - r.Emails.DistinctKeys
	rows, err := e.Pool.Query(ctx, sqlDeliveredKeys)
	if err != nil {
		return fmt.Errorf("chaos: report: delivered outbox rows: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("chaos: report: delivered outbox rows: %w", err)
	}
	for _, k := range keys {
		if seen[outbox.DeliveryKey(k)] == 0 {
			r.Emails.NotReceived++
			if len(r.Emails.notReceived) < 10 {
				r.Emails.notReceived = append(r.Emails.notReceived,
					fmt.Sprintf("outbox row with dedupe key %s: delivered, but no mail file holds its email", k))
			}
		}
	}
	return nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a human: the verdict first, then the figures.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format+"\n", args...) }
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL: " + strings.Join(r.Failures, "; ")
	}
	if !r.Asserted {
		verdict = "MEASURED, NOT ASSERTED (asynchronous replication)"
		if len(r.Failures) > 0 {
			verdict += ": " + strings.Join(r.Failures, "; ")
		}
	}
	p("chaos run (%s workers, seed %d): %s", r.Mode, r.Seed, verdict)
	p("")
	phase := r.FaultPhase.String()
	if r.FaultPhase > r.Duration {
		phase += fmt.Sprintf(" (planned %s; a late fault extended it)", r.Duration)
	}
	p("run\t%d worker processes, lease %s, faults for %s, settled in %s, %s in all", r.Workers, r.Lease, phase, r.Settle, r.Elapsed)
	p("schema\t%s (logs in %s)", r.Schema, r.LogDir)
	if r.NoLeaseLog {
		p("jobs\t%d in all: %s", r.Jobs.Total, formatCounts(r.Jobs.ByState))
	} else {
		p("jobs\t%d in all, %d claims: %s", r.Jobs.Total, r.Jobs.Claims, formatCounts(r.Jobs.ByState))
	}
	kinds := make([]string, 0, len(r.Jobs.ByKind))
	for k := range r.Jobs.ByKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		p("  %s\t%s", k, formatCounts(r.Jobs.ByKind[k]))
	}
	s := r.Workload
	if r.Flow != nil {
		p("workload\t%d waves: %d jobs under flow limits (concurrency %d per partition, a sequence, %d starts per %s)",
			s.Waves, s.FlowJobs, flowConcMax, flowRate, flowPer)
	} else {
		p("workload\t%d waves: %d customers billed (%d invoice jobs), %d sleep jobs, %d order keys (%d order.place jobs)",
			s.Waves, s.Customers, s.BillingJobs, s.SleepJobs, s.OrderKeys, s.OrderJobs)
	}
	p("order storm\t%d requests: %d created, %d replayed, %d in-flight 409, %d 5xx, %d network errors, %d rejected, %d keys unanswered",
		s.HTTPRequests, s.HTTPCreated, s.HTTPReplayed, s.HTTPInFlight, s.HTTPErrors, s.HTTPNetErr, s.HTTPRejected, s.KeysUnanswered)
	p("")
	p("FAULT\tSCHEDULED\tSTARTED\tFIRED\t")
	var planned, started, fired int
	for _, f := range r.Faults {
		if f.Skipped != "" {
			p("%s\t-\t-\t-\tskipped: %s", f.Type, f.Skipped)
			continue
		}
		p("%s\t%d\t%d\t%d\t", f.Type, f.Scheduled, f.Started, f.Fired)
		planned, started, fired = planned+f.Scheduled, started+f.Started, fired+f.Fired
	}
	p("all\t%d\t%d\t%d\t", planned, started, fired)
	p("")
	p("stale writes rejected\t%d", r.StaleWritesRejected)
	p("leases expired while the holder lived\t%d", r.ExpiredHolderAlive)
	if r.NoLeaseLog {
		p("leases revoked\t%d (no lease log on Citus: re-runs not measured)", r.Revocations)
	} else {
		p("leases revoked\t%d (%d claimed again; longest wait revoked → re-run %s)", r.Revocations, r.RevokedReclaimed, r.LongestRevokedWait)
	}
	if r.Takeovers > 0 {
		p("takeovers of running jobs\t%d", r.Takeovers)
	}
	p("sleep jobs longer than the lease\t%d completed, %d on their first attempt", r.SleepCompleted, r.SleepFirstAttempt)
	p("invoices\t%d rows, %d distinct (customer, period), %d missing", r.Invoices.Rows, r.Invoices.Distinct, r.Invoices.Missing)
	p("orders\t%d rows, %d distinct keys, %d missing", r.Orders.Rows, r.Orders.Distinct, r.Orders.Missing)
	p("outbox\t%d rows: %d delivered, %d pending, %d failed", r.Outbox.Rows, r.Outbox.Delivered, r.Outbox.Pending, r.Outbox.Failed)
	if r.Emails.Checked {
		p("emails\t%d received, %d distinct keys, %d redelivered with the same key, %d not received, %d surplus per recipient",
			r.Emails.Lines, r.Emails.DistinctKeys, r.Emails.Redelivered, r.Emails.NotReceived, r.Emails.SurplusPerRecipient)
	}
	if f := r.Flow; f != nil {
		p("flow: concurrency-limit violations %d (checked %d)", f.ConcurrencyViolations, f.ConcurrencyChecked)
		p("flow: sequence-order violations %d (checked %d)", f.SequenceViolations, f.SequenceChecked)
		p("flow: rate-limit violations %d (checked %d)", f.RateViolations, f.RateChecked)
		if f.Graphs {
			p("flow: dependency-order violations %d (checked %d)", f.DependencyViolations, f.DependencyChecked)
			p("flow: batch callbacks %d of %d, duplicates %d", f.BatchCallbacks, f.Batches, f.BatchDuplicates)
			p("flow: signal waits resumed %d of %d, duplicates %d", f.WaitsResumed, f.Waits, f.WaitDuplicates)
		}
	}
	p("duplicates\t%d %s", r.Duplicates, formatCounts(r.DuplicateDetail))
	p("lost\t%d %s", r.Lost, formatCounts(r.LostDetail))
	if r.Verify != nil {
		for _, c := range r.Verify.Checks {
			if !c.OK() && c.Skipped == "" {
				p("  verify %s\t%d: %s", c.Name, c.Violations, strings.Join(c.Examples, "; "))
			}
		}
	}
	for _, j := range r.Unfinished {
		p("  unfinished\t%s", j)
	}
	for _, j := range r.Discarded {
		p("  discarded\t%s", j)
	}
	for _, m := range r.Missing {
		p("  missing\t%s", m)
	}
	for _, c := range r.Crashes {
		p("crash\t%s", c)
	}
	if f := r.Failover; f != nil && !f.Done {
		p("")
		p("failover (%s replication)\tdid not happen", f.Replication)
	}
	if f := r.Failover; f != nil && f.Done {
		p("")
		p("failover (%s replication)\tpromoted in %s; standby %d WAL bytes behind at the kill", f.Replication, f.PromotedIn, f.LagBytes)
		keys := make([]string, 0, len(f.Acked))
		for k := range f.Acked {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			p("  acknowledged %s\t%d, %d missing on the promoted standby", k, f.Acked[k], f.Missing[k])
		}
		for _, m := range f.MissingExamples {
			p("  missing\t%s", m)
		}
		p("  revoked lease\tjob %d gen %d → %d before the kill, gen %d after; a write under it after the failover: %s",
			f.StaleJob, f.StaleGen, f.RevokedGen, f.GenAfter, f.StaleWriteSaid)
		p("  in flight at the kill\t%s", f.InFlight)
		p("  settled by looking\t%d (%s), %d writes repeated", len(f.Reconciled), strings.Join(f.Reconciled, ", "), f.RepeatedWrites)
	}
	return tw.Flush()
}

// WriteFaultLog writes one line per injected fault.
func (r *Report) WriteFaultLog(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tFAULT\tTARGET\tFIRED\tPROOF")
	for _, f := range r.FaultLog {
		what := f.Proof
		if !f.Fired {
			what = f.Err
		}
		if f.Effect != "" {
			what += "; " + f.Effect
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", f.Started.Round(time.Millisecond), f.Type, f.Target, f.Fired, what)
	}
	return tw.Flush()
}

func formatCounts(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// formatNonZero is formatCounts of the non-zero counts only: what a failure names.
func formatNonZero(m map[string]int64) string {
	nz := map[string]int64{}
	for k, n := range m {
		if n != 0 {
			nz[k] = n
		}
	}
	return formatCounts(nz)
}

func queryStrings(ctx context.Context, db queue.DBTX, sql string, args ...any) ([]string, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
