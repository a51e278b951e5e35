package order

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceq/fenceq/idempotency"
)

// PrometheusMetrics counts placed orders in Prometheus (fenceq_orders_created_total)
// and hands what the idempotency mechanism decides to idempotency metrics of their own
// (fenceqprom's, typically, which count fenceq_idempotency_replays_total and
// fenceq_idempotency_conflicts_total). It implements Metrics; its methods are safe for
// concurrent use.
type PrometheusMetrics struct {
	idempotency.Metrics
	created prometheus.Counter
}

var _ Metrics = (*PrometheusMetrics)(nil)

// NewPrometheusMetrics returns the order counter, registered in reg, with replays,
// conflicts and in-flight waits passed to idem (nil counts them nowhere). It fails when
// reg is nil or the counter is registered there already.
func NewPrometheusMetrics(reg prometheus.Registerer, idem idempotency.Metrics) (*PrometheusMetrics, error) {
	if reg == nil {
		return nil, errors.New("order metrics: registerer is nil")
	}
	if idem == nil {
		idem = idempotency.NopMetrics{}
	}
	m := &PrometheusMetrics{Metrics: idem, created: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fenceq_orders_created_total",
		Help: "Orders placed (committed) by this process.",
	})}
	if err := reg.Register(m.created); err != nil {
		return nil, fmt.Errorf("order metrics: %w", err)
	}
	return m, nil
}

// Created counts an order placed by this process.
func (m *PrometheusMetrics) Created() { m.created.Inc() }
