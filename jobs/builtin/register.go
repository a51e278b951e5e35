package builtin

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/outbox"
)

// Deps are what the built-in handlers need to run.
type Deps struct {
	// Pool is the database the handlers read and write. Required.
	Pool *pgxpool.Pool
	// Mailer delivers the emails the invoice and order jobs write to the outbox.
	// Required; email.ParseMailer builds one from a spec such as file:PATH.
	Mailer email.Mailer
	// Tax is the tax service the invoice job calls. Required.
	Tax invoice.TaxService
	// Orders places the orders of order.place jobs: the same service an orders API
	// takes its requests with. Required.
	Orders *order.Service
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// InvoiceMetrics counts invoices and the duplicates prevented. Defaults to
	// invoice.NopMetrics.
	InvoiceMetrics invoice.Metrics
	// OutboxMetrics counts the outbox relay's deliveries. Defaults to outbox.NopMetrics.
	OutboxMetrics outbox.Metrics
}

// Register adds the handler of every built-in kind (see Kinds) to hs. The worker must
// serve Queues() for all of them to run; the housekeeping job is enqueued by the
// schedule housekeeping.Periodic returns, which the worker puts in Config.Periodic.
func Register(hs *fenceq.Handlers, d Deps) error {
	switch {
	case d.Pool == nil:
		return errors.New("register the built-in kinds: Pool: required")
	case d.Mailer == nil:
		return errors.New("register the built-in kinds: Mailer: required")
	case d.Tax == nil:
		return errors.New("register the built-in kinds: Tax: required")
	case d.Orders == nil:
		return errors.New("register the built-in kinds: Orders: required")
	}
	diag.Register(hs)
	if _, err := email.RegisterRelay(hs, outbox.RelayConfig{Pool: d.Pool, Logger: d.Logger, Metrics: d.OutboxMetrics},
		email.DelivererConfig{Mailer: d.Mailer}); err != nil {
		return fmt.Errorf("register %s: %w", outbox.DeliverKind, err)
	}
	if err := order.Register(hs, d.Orders); err != nil {
		return fmt.Errorf("register %s: %w", order.PlaceKind, err)
	}
	if err := invoice.Register(hs, invoice.Config{Pool: d.Pool, Tax: d.Tax, Logger: d.Logger,
		Metrics: d.InvoiceMetrics}); err != nil {
		return fmt.Errorf("register %s: %w", invoice.Kind, err)
	}
	if err := housekeeping.Register(hs, housekeeping.Config{Pool: d.Pool, Logger: d.Logger}); err != nil {
		return fmt.Errorf("register %s: %w", housekeeping.IdempotencyKind, err)
	}
	return nil
}
