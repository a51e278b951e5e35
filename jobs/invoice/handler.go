// Package invoice bills customers on fenceq: a billing run enqueues one invoice job per
// customer and period, and each job writes exactly one invoice and one email outbox row,
// even when its worker pauses past its lease inside a slow tax call. It is the billing
// incident fenceq is built against: workers holding per-customer locks that expire
// mid-invoice, so that a second and third worker bill the same customer again.
//
// # How exactly one invoice comes out
//
//   - The job runs under a fenced lease. Its slow work (loading usage, the tax API)
//     happens before any transaction; then ONE short transaction, fenced by the lease
//     generation, writes the invoice, its lines and the email outbox row and completes
//     the job (fenceq.Job.Commit). A holder whose lease was revoked while it was paused
//     gets ErrLeaseLost from the database and writes nothing.
//   - UNIQUE (customer_id, period) on invoices is the last line of defence: should two
//     jobs for one customer and period ever both reach their commit, the second finds the
//     invoice, writes no second email row, and completes.
//   - The email goes out through the outbox (package email): at least once, with the same
//     Message-ID on every attempt.
package invoice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/mail"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// Kind is the job kind of invoice jobs.
const Kind = "invoice"

// Queue is the queue invoice jobs run on; a worker must serve it (and
// outbox.Queue, for the emails).
const Queue = "billing"

// ErrUnknownCustomer means an invoice job names a customer that does not exist; the job
// is discarded.
var ErrUnknownCustomer = errors.New("unknown customer")

// Args are the args of an invoice job.
type Args struct {
	CustomerID int64  `json:"customer_id"`
	Period     string `json:"period"`
}

// Kind implements fenceq.JobArgs.
func (Args) Kind() string { return Kind }

// InsertOpts puts invoice jobs on Queue with the unique key of their customer and
// period, so fenceq.Enqueue(ctx, db, Args{...}, nil) cannot start a second one.
func (a Args) InsertOpts() fenceq.InsertOpts {
	return fenceq.InsertOpts{Queue: Queue, UniqueKey: UniqueKey(a.CustomerID, a.Period)}
}

// UniqueKey is the unique key of the invoice job of a customer and period.
func UniqueKey(customerID int64, period string) string {
	return "invoice:" + strconv.FormatInt(customerID, 10) + ":" + period
}

// EmailDedupePrefix + the invoice id is the outbox dedupe key of an invoice's email.
const EmailDedupePrefix = "invoice-email:"

// EmailDedupeKey is the outbox dedupe key of an invoice's email.
func EmailDedupeKey(invoiceID int64) string {
	return EmailDedupePrefix + strconv.FormatInt(invoiceID, 10)
}

// Validate checks the args; the error matches queue.ErrInvalid.
func (a Args) Validate() error {
	if a.CustomerID <= 0 {
		return &queue.ValidationError{Field: "customer_id", Reason: fmt.Sprintf("%d must be positive", a.CustomerID)}
	}
	return ValidatePeriod(a.Period)
}

// Metrics counts what the invoice handler prevented and produced. Methods must be fast
// and safe for concurrent use.
type Metrics interface {
	// InvoiceCreated: a fenced commit wrote an invoice and its email row.
	InvoiceCreated()
	// DuplicatePrevented: a job found its invoice already written. how is
	// DuplicateExistingInvoice (seen before the work) or DuplicateUniqueConstraint (the
	// UNIQUE (customer_id, period) constraint stopped a second invoice at commit).
	DuplicatePrevented(how string)
	// StaleWriteRejected: the database rejected a commit whose lease had been revoked.
	StaleWriteRejected()
	// TaxFailed: a tax service call failed; the job retries.
	TaxFailed()
}

// NopMetrics counts nothing.
type NopMetrics struct{}

// InvoiceCreated implements Metrics.
func (NopMetrics) InvoiceCreated() {}

// DuplicatePrevented implements Metrics.
func (NopMetrics) DuplicatePrevented(string) {}

// StaleWriteRejected implements Metrics.
func (NopMetrics) StaleWriteRejected() {}

// TaxFailed implements Metrics.
func (NopMetrics) TaxFailed() {}

var _ Metrics = NopMetrics{}

// Config configures the invoice handler.
type Config struct {
	// Pool reads customers and usage. Required. (The fenced commit goes through the
	// worker's own pool.)
	Pool *pgxpool.Pool
	// Tax is the tax service. Required.
	Tax TaxService
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Metrics defaults to NopMetrics.
	Metrics Metrics
	// From is the sender of invoice emails; empty means the relay mailer's From.
	From string
	// CommitTimeout bounds the fenced commit. Defaults to 10s.
	CommitTimeout time.Duration
	// Timeout bounds one attempt; 0 (the default) means none: the lease is renewed for
	// as long as the handler runs, however slow the tax service is.
	Timeout time.Duration
	// Backoff overrides the worker's retry policy for invoice jobs.
	Backoff *queue.Backoff
}

type handler struct {
	cfg Config
	log *slog.Logger
}

func newHandler(cfg Config) (*handler, error) {
	if cfg.Pool == nil {
		return nil, errors.New("invoice handler: Pool: required")
	}
	if cfg.Tax == nil {
		return nil, errors.New("invoice handler: Tax: required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NopMetrics{}
	}
	if cfg.CommitTimeout <= 0 {
		cfg.CommitTimeout = 10 * time.Second
	}
	if cfg.From != "" {
		if _, err := mail.ParseAddress(cfg.From); err != nil {
			return nil, fmt.Errorf("invoice handler: From %q: %w", cfg.From, err)
		}
	}
	return &handler{cfg: cfg, log: cfg.Logger.With("component", "invoice")}, nil
}

// Handler returns the invoice handler, for callers that wrap it; Register is the usual
// way in.
func Handler(cfg Config) (fenceq.HandlerFunc[Args], error) {
	h, err := newHandler(cfg)
	if err != nil {
		return nil, err
	}
	return h.work, nil
}

// HandlerOpts returns the handler options Register uses for cfg.
func (cfg Config) HandlerOpts() *fenceq.HandlerOpts {
	return &fenceq.HandlerOpts{Timeout: cfg.Timeout, Backoff: cfg.Backoff}
}

// Register adds the invoice handler to hs. The worker must serve Queue.
func Register(hs *fenceq.Handlers, cfg Config) error {
	h, err := Handler(cfg)
	if err != nil {
		return err
	}
	return fenceq.AddHandlerSafely(hs, h, cfg.HandlerOpts())
}

type customer struct {
	ID                             int64
	Name, Email, Country, Currency string
}

// work is one attempt of an invoice job.
func (h *handler) work(ctx context.Context, job *fenceq.Job[Args]) error {
	a := job.Args
	lease := job.Lease()
	log := h.log.With("customer_id", a.CustomerID, "period", a.Period, "job_id", lease.JobID,
		"lease_gen", lease.Gen, "attempt", job.Attempt)
	if err := a.Validate(); err != nil {
		log.Error("invoice job has invalid args; discarded", "err", err)
		return fenceq.JobDiscard(err)
	}

	// A retried or duplicate job whose invoice exists has nothing left to do.
	var existing int64
	err := h.cfg.Pool.QueryRow(ctx, sqlInvoiceIDFor, a.CustomerID, a.Period).Scan(&existing)
	switch {
	case err == nil:
		h.cfg.Metrics.DuplicatePrevented(DuplicateExistingInvoice)
		log.Info("invoice already exists; job completes without writing", "invoice_id", existing)
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("look up invoice of customer %d for %s: %w", a.CustomerID, a.Period, err)
	}

	var c customer
	err = h.cfg.Pool.QueryRow(ctx, sqlGetCustomer, a.CustomerID).Scan(&c.ID, &c.Name, &c.Email, &c.Country, &c.Currency)
	if errors.Is(err, pgx.ErrNoRows) {
		err = fmt.Errorf("customer %d: %w", a.CustomerID, ErrUnknownCustomer)
		log.Error("invoice job names an unknown customer; discarded", "err", err)
		return fenceq.JobDiscard(err)
	}
	if err != nil {
		return fmt.Errorf("load customer %d: %w", a.CustomerID, err)
	}
	lines, err := h.loadUsage(ctx, a)
	if err != nil {
		return err
	}
	totals, err := ComputeTotals(lines, 0)
	if err != nil {
		log.Error("usage does not add up to an invoice; discarded", "err", err)
		return fenceq.JobDiscard(fmt.Errorf("customer %d %s: %w", a.CustomerID, a.Period, err))
	}

	// The slow outside call, before any transaction. The worker renews the lease
	// meanwhile; if this process pauses past it, the commit below is rejected.
	quote, err := h.cfg.Tax.Quote(ctx, TaxRequest{CustomerID: c.ID, Country: c.Country, Period: a.Period,
		Currency: c.Currency, SubtotalCents: totals.SubtotalCents})
	if err != nil {
		h.cfg.Metrics.TaxFailed()
		return fmt.Errorf("tax quote for customer %d %s: %w", a.CustomerID, a.Period, err)
	}
	totals, err = ComputeTotals(lines, quote.RateMicros)
	if err != nil {
		return fmt.Errorf("totals of customer %d %s with tax rate %d: %w", a.CustomerID, a.Period, quote.RateMicros, err)
	}

	// One short fenced transaction. Its context is not the job's: whether this holder
	// may still write is decided by the database's fence, not by a local timer that
	// fired while the process was paused.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.CommitTimeout)
	defer cancel()
	var invoiceID int64
	var duplicate bool
	err = job.Commit(cctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		invoiceID, duplicate, err = h.write(ctx, tx, job, c, lines, totals, quote)
		return err
	})
	if errors.Is(err, queue.ErrLeaseLost) {
		h.cfg.Metrics.StaleWriteRejected()
		log.Warn("invoice not written: the lease was revoked while this holder worked (paused past it?); "+
			"the database rejected the stale commit", "err", err)
		return err
	}
	if err != nil {
		return fmt.Errorf("commit invoice of customer %d %s: %w", a.CustomerID, a.Period, err)
	}
	if duplicate {
		h.cfg.Metrics.DuplicatePrevented(DuplicateUniqueConstraint)
		log.Warn("invoice already existed: UNIQUE (customer_id, period) prevented a duplicate; no second email",
			"invoice_id", invoiceID)
		return nil
	}
	h.cfg.Metrics.InvoiceCreated()
	log.Info("invoice created", "invoice_id", invoiceID, "total_cents", totals.TotalCents, "tax_reference", quote.Reference)
	return nil
}

func (h *handler) loadUsage(ctx context.Context, a Args) ([]Line, error) {
	rows, err := h.cfg.Pool.Query(ctx, sqlLoadUsage, a.CustomerID, a.Period)
	if err != nil {
		return nil, fmt.Errorf("load usage of customer %d %s: %w", a.CustomerID, a.Period, err)
	}
	lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Line, error) {
		var l Line
		err := r.Scan(&l.SKU, &l.Description, &l.UnitPriceCents, &l.Quantity)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("load usage of customer %d %s: %w", a.CustomerID, a.Period, err)
	}
	return lines, nil
}

// write is the body of the fenced commit: the invoice, its lines and its email row, or
// nothing when the invoice exists already.
func (h *handler) write(ctx context.Context, tx pgx.Tx, job *fenceq.Job[Args], c customer, lines []Line,
	t Totals, q TaxQuote) (int64, bool, error) {
	lease := job.Lease()
	a := job.Args
	var id int64
	err := tx.QueryRow(ctx, sqlInsertInvoice, a.CustomerID, a.Period, c.Currency, t.SubtotalCents, t.TaxRateMicros,
		t.TaxCents, t.TotalCents, q.Reference, lease.JobID, lease.Gen, lease.Holder).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := tx.QueryRow(ctx, sqlInvoiceIDFor, a.CustomerID, a.Period).Scan(&id); err != nil {
			return 0, false, fmt.Errorf("read existing invoice: %w", err)
		}
		return id, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("insert invoice: %w", err)
	}
	n := len(lines)
	nos, skus, descs := make([]int32, n), make([]string, n), make([]string, n)
	qty, price, amt := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, l := range lines {
		nos[i], skus[i], descs[i] = int32(i+1), l.SKU, l.Description
		qty[i], price[i], amt[i] = l.Quantity, l.UnitPriceCents, l.AmountCents
	}
	if n > 0 {
		if _, err := tx.Exec(ctx, sqlInsertInvoiceLines, id, nos, skus, descs, qty, price, amt); err != nil {
			return 0, false, fmt.Errorf("insert %d invoice lines: %w", n, err)
		}
	}
	payload, err := json.Marshal(h.emailFor(id, a.Period, c, lines, t))
	if err != nil {
		return 0, false, fmt.Errorf("encode invoice email: %w", err)
	}
	if _, err := outbox.Insert(ctx, tx, outbox.Message{Topic: email.TopicEmail,
		DedupeKey: EmailDedupeKey(id), Payload: payload, JobID: lease.JobID}); err != nil {
		return 0, false, fmt.Errorf("write invoice email to the outbox: %w", err)
	}
	return id, false, nil
}

func (h *handler) emailFor(id int64, period string, c customer, lines []Line, t Totals) email.Message {
	var b strings.Builder
	fmt.Fprintf(&b, "Hello %s,\n\nyour invoice %d for %s:\n\n", c.Name, id, period)
	for _, l := range lines {
		fmt.Fprintf(&b, "  %-28s %10d × %10s = %12s %s\n", l.Description, l.Quantity,
			FormatCents(l.UnitPriceCents), FormatCents(l.AmountCents), c.Currency)
	}
	fmt.Fprintf(&b, "\n  Subtotal %s %s\n  Tax (%s, %s) %s %s\n  Total %s %s\n",
		FormatCents(t.SubtotalCents), c.Currency, c.Country, FormatRate(t.TaxRateMicros),
		FormatCents(t.TaxCents), c.Currency, FormatCents(t.TotalCents), c.Currency)
	return email.Message{
		From:    h.cfg.From,
		To:      []string{c.Email},
		Subject: fmt.Sprintf("Invoice %d for %s: %s %s", id, period, FormatCents(t.TotalCents), c.Currency),
		Text:    b.String(),
		Headers: map[string]string{"X-Invoice-Id": strconv.FormatInt(id, 10), "X-Billing-Period": period},
	}
}
