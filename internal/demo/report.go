package demo

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/fenceq/fenceq/internal/verify"
)

// Report is what a demo run found.
type Report struct {
	Database string `json:"database"`
	Schema   string `json:"schema"`
	Duration string `json:"duration"`
	Config   Scale  `json:"config"`
	Period   string `json:"period"`

	Invoices      int64 `json:"invoices"`
	InvoiceEmails int64 `json:"invoice_emails_delivered"`
	Orders        int64 `json:"orders"`
	OrderEmails   int64 `json:"order_emails_delivered"`
	// Storm counts the order requests by answer.
	Storm StormCounts `json:"order_requests"`
	// MailLines and DistinctMessageIDs read the mail file: a line per delivery attempt
	// that reached the mailer, and the distinct Message-IDs among them.
	MailLines          int `json:"mail_file_lines"`
	DistinctMessageIDs int `json:"distinct_message_ids"`
	// SlowTaxCalls took longer than the lease; heartbeats kept their leases.
	SlowTaxCalls int64 `json:"tax_calls_longer_than_lease"`
	TaxCalls     int64 `json:"tax_calls"`
	// Pause is what happened to the frozen worker.
	Pause *PauseReport `json:"pause"`

	LeasesRevoked       int64 `json:"leases_revoked"`
	StaleWritesRejected int64 `json:"stale_writes_rejected"`
	ExpiredHolderAlive  int64 `json:"leases_expired_while_holder_lived"`
	Duplicates          int64 `json:"duplicates"`
	LostJobs            int64 `json:"lost_jobs"`

	Verify *verify.Report    `json:"verify"`
	Kept   map[string]string `json:"kept,omitempty"`
}

// Failure says in one line why the run proves nothing, or "" when it proves its
// point: every invariant held, the injected fault really fired (a stale write was
// rejected), and every invoice and order was written.
func (r *Report) Failure() string {
	switch {
	case r.Verify == nil || !r.Verify.Passed:
		var n int64
		if r.Verify != nil {
			n = r.Verify.Violations
		}
		return fmt.Sprintf("demo: verify found %d violation(s)", n)
	case r.StaleWritesRejected == 0:
		return "demo: the injected fault did not fire (no stale write was rejected), so the run proves nothing"
	case r.Invoices != int64(r.Config.Customers) || r.Orders != int64(r.Config.OrderKeys):
		return fmt.Sprintf("demo: %d of %d invoices and %d of %d orders were written",
			r.Invoices, r.Config.Customers, r.Orders, r.Config.OrderKeys)
	}
	return ""
}

// WriteText writes the report for a human: the counts, the frozen worker's story and
// the verify table.
func (r *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "\nfenceq demo: %d customers, %d workers, lease %s, %s\n\n", r.Config.Customers, r.Config.Workers,
		r.Config.Lease, r.Duration)
	i := func(n int64) string { return strconv.FormatInt(n, 10) }
	rows := [][]string{
		{"invoices", i(r.Invoices), fmt.Sprintf("one per customer for %s (%d customers)", r.Period, r.Config.Customers)},
		{"invoice emails delivered", i(r.InvoiceEmails), "through the outbox"},
		{"orders", i(r.Orders), fmt.Sprintf("%d idempotency keys, %d requests: %d created, %d replayed, %d told to retry (in flight)",
			r.Config.OrderKeys, r.Storm.Requests, r.Storm.Created, r.Storm.Replayed, r.Storm.InFlight)},
		{"order emails delivered", i(r.OrderEmails), "through the outbox"},
		{"mail file", strconv.Itoa(r.MailLines), fmt.Sprintf("lines, %d distinct Message-IDs", r.DistinctMessageIDs)},
		{"tax calls longer than the lease", i(r.SlowTaxCalls), fmt.Sprintf("of %d; heartbeats kept those leases", r.TaxCalls)},
		{"leases revoked", i(r.LeasesRevoked), "by the reaper, generation bumped"},
		{"stale writes rejected", i(r.StaleWritesRejected), "by the database: the fence held"},
		{"leases expired while the holder lived", i(r.ExpiredHolderAlive), "alerted (ERROR log, metric, health)"},
		{"duplicates", i(r.Duplicates), "invoices, orders, outbox rows"},
		{"lost jobs", i(r.LostJobs), "jobs or emails that nothing would finish"},
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WHAT\tCOUNT\t")
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p := r.Pause; p != nil {
		takenBy := p.TakenBy
		if takenBy == "" {
			takenBy = "-"
		}
		fmt.Fprintf(w, "\nthe pause: %s froze for %s inside the tax call of customer %d; its lease (job %d, generation %d) "+
			"was revoked and the job finished on %s; its late commit was rejected\n",
			p.Worker, p.Frozen, p.CustomerID, p.JobID, p.Gen, takenBy)
	}
	fmt.Fprintln(w)
	if r.Verify != nil {
		if err := r.Verify.WriteText(w); err != nil {
			return err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.Kept)) {
		fmt.Fprintf(w, "kept %s: %s\n", k, r.Kept[k])
	}
	return nil
}
