// Package verify checks fenceq's invariants in a database and returns a structured
// report: one invoice per (customer, period), one outbox row per invoice and per order,
// one order per idempotency key, no job running on a lease that expired more than a
// reaper interval ago, and no job lost. It is what `fenceq verify`, the demo and the
// fault-injection suite use to decide that nothing went wrong.
//
// A check whose tables do not exist (migrations not applied) is reported as skipped,
// never as passed silently and never as a crash.
package verify

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// Default dedupe-key prefixes of the emails the built-in jobs write: the outbox row of
// invoice 42 has dedupe_key "invoice-email:42". They equal invoice.EmailDedupePrefix
// and order.EmailDedupePrefix (a test holds them equal); spelled out here so that the
// checks, which the cli package runs, link none of the built-in jobs.
const (
	InvoiceEmailPrefix = "invoice-email:"
	OrderEmailPrefix   = "order-email:"
)

// Check names, stable for scripts reading the JSON report.
const (
	CheckDuplicateInvoices = "one_invoice_per_customer_period"
	CheckInvoiceEmails     = "one_outbox_row_per_invoice"
	CheckOrderEmails       = "one_outbox_row_per_order"
	CheckDuplicateOrders   = "one_order_per_idempotency_key"
	CheckOutboxKeys        = "one_outbox_row_per_dedupe_key"
	CheckExpiredLeases     = "no_job_running_on_expired_lease"
	CheckBrokenJobs        = "no_job_in_unworkable_state"
	CheckExpectedJobs      = "no_expected_job_lost"
	CheckUnfinishedJobs    = "every_job_finished"
	CheckStrandedOutbox    = "no_outbox_row_stranded"
)

// Options tunes Run.
type Options struct {
	// ReaperInterval is how long past its expiry a running lease may stay before the
	// reaper must have revoked it. Defaults to 5s (the worker's default).
	ReaperInterval time.Duration
	// Grace is added to ReaperInterval to absorb a reaper pass in progress. Defaults to 1s.
	Grace time.Duration
	// ExpectedJobs are job ids that were enqueued and must still exist (and be final
	// when RequireFinal). Retention must not have pruned them.
	ExpectedJobs []int64
	// RequireFinal demands that the expected jobs, and every job when RequireAllFinal,
	// reached a final state: for a run that drained its queues.
	RequireFinal bool
	// RequireAllFinal demands that every job except those of IgnoreKinds is final.
	RequireAllFinal bool
	// IgnoreKinds are kinds allowed to stay unfinished under RequireAllFinal (periodic
	// jobs that reschedule themselves).
	IgnoreKinds []string
	// InvoiceEmailPrefix and OrderEmailPrefix default to the constants above.
	InvoiceEmailPrefix, OrderEmailPrefix string
	// Examples bounds the examples kept per check. Defaults to 5.
	Examples int
	// Sets names the business migration sets (invoice, order) whose checks run; nil
	// runs them all. A binary that does not know a set leaves its checks out of the
	// report instead of reporting them as skipped.
	Sets []string
}

func (o Options) withDefaults() Options {
	if o.ReaperInterval <= 0 {
		o.ReaperInterval = 5 * time.Second
	}
	if o.Grace <= 0 {
		o.Grace = time.Second
	}
	if o.InvoiceEmailPrefix == "" {
		o.InvoiceEmailPrefix = InvoiceEmailPrefix
	}
	if o.OrderEmailPrefix == "" {
		o.OrderEmailPrefix = OrderEmailPrefix
	}
	if o.Examples <= 0 {
		o.Examples = 5
	}
	if o.IgnoreKinds == nil {
		o.IgnoreKinds = []string{}
	}
	return o
}

// Check is the result of one invariant check.
type Check struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Violations counts offending rows (surplus rows for duplicates); 0 means it holds.
	Violations int64 `json:"violations"`
	// Examples describe up to Options.Examples violations.
	Examples []string `json:"examples,omitempty"`
	// Skipped says why the check did not run (a table does not exist); empty when it ran.
	Skipped string `json:"skipped,omitempty"`
}

// OK reports whether the check ran and found nothing.
func (c Check) OK() bool { return c.Skipped == "" && c.Violations == 0 }

// Report is every check's result.
type Report struct {
	Checks []Check `json:"checks"`
	// Violations is the sum over checks.
	Violations int64 `json:"violations"`
	// Passed is true when no check found a violation (skipped checks do not fail it).
	Passed bool `json:"passed"`
}

// Get returns the check of that name.
func (r *Report) Get(name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// Count returns the violations of the named checks.
func (r *Report) Count(names ...string) int64 {
	var n int64
	for _, name := range names {
		if c, ok := r.Get(name); ok {
			n += c.Violations
		}
	}
	return n
}

// Duplicates is the number of surplus business rows: invoices, orders and outbox rows.
func (r *Report) Duplicates() int64 {
	return r.Count(CheckDuplicateInvoices, CheckDuplicateOrders, CheckOutboxKeys)
}

// Lost is the number of jobs and outbox rows that nothing will finish or deliver.
func (r *Report) Lost() int64 {
	return r.Count(CheckBrokenJobs, CheckExpectedJobs, CheckUnfinishedJobs, CheckStrandedOutbox)
}

type checkDef struct {
	name, desc string
	set        string // the business migration set the check belongs to; "" for the core
	tables     []string
	sql        string
	args       func(o Options) []any
	enabled    func(o Options) bool
}

var checks = []checkDef{
	{name: CheckDuplicateInvoices, set: "invoice", desc: "one invoice per (customer, period)",
		tables: []string{"invoices"}, sql: sqlDuplicateInvoices},
	{name: CheckInvoiceEmails, set: "invoice", desc: "every invoice has exactly one outbox row (its email)",
		tables: []string{"invoices", "fenceq_outbox"}, sql: sqlOutboxPerInvoice,
		args: func(o Options) []any { return []any{o.InvoiceEmailPrefix} }},
	{name: CheckDuplicateOrders, set: "order", desc: "one order per idempotency key",
		tables: []string{"orders"}, sql: sqlDuplicateOrders},
	{name: CheckOrderEmails, set: "order", desc: "every order has exactly one outbox row (its confirmation email)",
		tables: []string{"orders", "fenceq_outbox"}, sql: sqlOutboxPerOrder,
		args: func(o Options) []any { return []any{o.OrderEmailPrefix} }},
	{name: CheckOutboxKeys, desc: "one outbox row per dedupe key",
		tables: []string{"fenceq_outbox"}, sql: sqlDuplicateOutboxKeys},
	{name: CheckExpiredLeases, desc: "no job running on a lease expired longer than the reaper interval",
		tables: []string{"fenceq_jobs"}, sql: sqlExpiredLeases,
		args: func(o Options) []any { return []any{(o.ReaperInterval + o.Grace).Microseconds()} }},
	{name: CheckBrokenJobs, desc: "every job is final or workable (known state, running ones leased)",
		tables: []string{"fenceq_jobs"}, sql: sqlBrokenJobs},
	{name: CheckExpectedJobs, desc: "every expected job exists (and is final when required)",
		tables: []string{"fenceq_jobs"}, sql: sqlExpectedJobs,
		args:    func(o Options) []any { return []any{o.ExpectedJobs, o.RequireFinal} },
		enabled: func(o Options) bool { return len(o.ExpectedJobs) > 0 }},
	{name: CheckUnfinishedJobs, desc: "every job reached a final state",
		tables: []string{"fenceq_jobs"}, sql: sqlUnfinishedJobs,
		args:    func(o Options) []any { return []any{o.IgnoreKinds} },
		enabled: func(o Options) bool { return o.RequireAllFinal }},
	{name: CheckStrandedOutbox, desc: "every pending outbox row has a live delivery job",
		tables: []string{"fenceq_outbox", "fenceq_jobs"}, sql: sqlStrandedOutbox},
}

// Run runs every check against db (whose search_path selects the schema). It returns
// an error only when the database cannot be asked; violations are in the report.
func Run(ctx context.Context, db queue.DBTX, opts Options) (*Report, error) {
	o := opts.withDefaults()
	rep := &Report{Passed: true}
	exists := map[string]bool{}
	for _, def := range checks {
		if def.enabled != nil && !def.enabled(o) {
			continue
		}
		if def.set != "" && o.Sets != nil && !slices.Contains(o.Sets, def.set) {
			continue
		}
		c := Check{Name: def.name, Description: def.desc}
		for _, t := range def.tables {
			ok, seen := exists[t]
			if !seen {
				if err := db.QueryRow(ctx, sqlTableExists, t).Scan(&ok); err != nil {
					return nil, fmt.Errorf("verify: look up table %s: %w", t, err)
				}
				exists[t] = ok
			}
			if !ok {
				c.Skipped = fmt.Sprintf("table %s does not exist", t)
				if def.set != "" {
					c.Skipped = fmt.Sprintf("the %s set is not installed (table %s does not exist)", def.set, t)
				}
				break
			}
		}
		if c.Skipped == "" {
			args := []any{o.Examples}
			if def.args != nil {
				args = append(args, def.args(o)...)
			}
			if err := runCheck(ctx, db, def.sql, args, &c); err != nil {
				return nil, fmt.Errorf("verify %s: %w", def.name, err)
			}
		}
		rep.Violations += c.Violations
		if c.Violations > 0 {
			rep.Passed = false
		}
		rep.Checks = append(rep.Checks, c)
	}
	return rep, nil
}

func runCheck(ctx context.Context, db queue.DBTX, sql string, args []any, c *Check) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var n int64
		var ex string
		if err := rows.Scan(&n, &ex); err != nil {
			return err
		}
		c.Violations = n
		c.Examples = append(c.Examples, ex)
	}
	return rows.Err()
}
