package cli

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// The metrics are what the worker and the business packages count into.
var (
	_ fenceq.Observer = (*fenceqprom.Metrics)(nil)
	_ outbox.Metrics  = (*fenceqprom.OutboxMetrics)(nil)
	_ order.Metrics   = (*order.PrometheusMetrics)(nil)
	_ invoice.Metrics = (*invoice.PrometheusMetrics)(nil)
)

// cliMetrics are the metrics of one command, in one registry: the mechanism's
// (fenceqprom), the built-in kinds' business counters, the Go runtime's and the
// process's, and (when the command reads a database) the database collector.
type cliMetrics struct {
	reg      *prometheus.Registry
	core     *fenceqprom.Metrics
	invoices *invoice.PrometheusMetrics
	orders   *order.PrometheusMetrics
}

// newMetrics registers the metrics in a fresh registry. With db set, the database is
// read at every scrape.
func newMetrics(db queue.DBTX, log *slog.Logger) (*cliMetrics, error) {
	m := &cliMetrics{reg: prometheus.NewRegistry()}
	if err := m.reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register Go metrics: %w", err)
	}
	if err := m.reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process metrics: %w", err)
	}
	var err error
	if m.core, err = fenceqprom.New(m.reg); err != nil {
		return nil, err
	}
	if m.invoices, err = invoice.NewPrometheusMetrics(m.reg); err != nil {
		return nil, err
	}
	if m.orders, err = order.NewPrometheusMetrics(m.reg, m.core.Idempotency()); err != nil {
		return nil, err
	}
	if db != nil {
		if err := m.reg.Register(fenceqprom.NewDBCollector(db, 5*time.Second, log)); err != nil {
			return nil, fmt.Errorf("register database metrics: %w", err)
		}
	}
	return m, nil
}

// handler serves the metrics in the Prometheus exposition format.
func (m *cliMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
