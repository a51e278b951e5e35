package invoice

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// How a job found its invoice already written, as passed to Metrics.DuplicatePrevented.
const (
	// DuplicateExistingInvoice: the invoice was there before the job did its work.
	DuplicateExistingInvoice = "existing_invoice"
	// DuplicateUniqueConstraint: the UNIQUE (customer_id, period) constraint stopped a
	// second invoice at commit.
	DuplicateUniqueConstraint = "unique_constraint"
)

// PrometheusMetrics counts what the invoice handler produced and prevented, in
// Prometheus: fenceq_invoices_created_total, fenceq_invoice_duplicates_prevented_total
// (by how) and fenceq_tax_failures_total. It implements Metrics; its methods are safe
// for concurrent use.
type PrometheusMetrics struct {
	created    prometheus.Counter
	duplicates *prometheus.CounterVec
	taxFailed  prometheus.Counter
}

var _ Metrics = (*PrometheusMetrics)(nil)

// NewPrometheusMetrics returns the invoice counters, registered in reg (the registry
// of the worker's fenceqprom metrics, typically). It fails when reg is nil or a counter
// is registered there already; then none stays registered.
func NewPrometheusMetrics(reg prometheus.Registerer) (*PrometheusMetrics, error) {
	if reg == nil {
		return nil, errors.New("invoice metrics: registerer is nil")
	}
	m := &PrometheusMetrics{
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenceq_invoices_created_total",
			Help: "Invoices written (with their email outbox row) by a fenced commit in this process.",
		}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenceq_invoice_duplicates_prevented_total",
			Help: "Invoice jobs that found their invoice already written, by how (existing_invoice, unique_constraint).",
		}, []string{"how"}),
		taxFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenceq_tax_failures_total",
			Help: "Failed tax service calls of invoice jobs (retried).",
		}),
	}
	cs := []prometheus.Collector{m.created, m.duplicates, m.taxFailed}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("invoice metrics: %w", err)
		}
	}
	// Both ways start at 0, so that an alert on increase() sees the first one.
	for _, how := range []string{DuplicateExistingInvoice, DuplicateUniqueConstraint} {
		m.duplicates.WithLabelValues(how)
	}
	return m, nil
}

// InvoiceCreated counts an invoice written by a fenced commit.
func (m *PrometheusMetrics) InvoiceCreated() { m.created.Inc() }

// DuplicatePrevented counts a job that found its invoice already written.
func (m *PrometheusMetrics) DuplicatePrevented(how string) { m.duplicates.WithLabelValues(how).Inc() }

// StaleWriteRejected counts nothing: the worker's hooks (fenceqprom) already count
// the rejected commit in fenceq_stale_writes_rejected_total{op="commit"}.
func (m *PrometheusMetrics) StaleWriteRejected() {}

// TaxFailed counts a failed tax call.
func (m *PrometheusMetrics) TaxFailed() { m.taxFailed.Inc() }
