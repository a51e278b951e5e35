package builtin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
)

// Metrics are the Prometheus metrics of a worker running the built-in kinds: the
// mechanism's (Core, a worker hook for Config.Hooks, with the outbox relay's and the
// idempotency mechanism's counters) and the business counters of invoices and orders.
type Metrics struct {
	// Core is the worker's observer; Core.Outbox() goes in Deps.OutboxMetrics.
	Core *fenceqprom.Metrics
	// Invoices goes in Deps.InvoiceMetrics.
	Invoices *invoice.PrometheusMetrics
	// Orders goes in order.Config.Metrics; it hands replays and conflicts to
	// Core.Idempotency().
	Orders *order.PrometheusMetrics
}

// NewMetrics registers the metrics in reg. It fails when reg is nil or one of them is
// registered there already.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	core, err := fenceqprom.New(reg)
	if err != nil {
		return nil, err
	}
	invoices, err := invoice.NewPrometheusMetrics(reg)
	if err != nil {
		return nil, err
	}
	orders, err := order.NewPrometheusMetrics(reg, core.Idempotency())
	if err != nil {
		return nil, err
	}
	return &Metrics{Core: core, Invoices: invoices, Orders: orders}, nil
}
