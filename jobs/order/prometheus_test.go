package order_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq/jobs/order"
)

// Created is counted in Prometheus; the idempotency counts go to the metrics given.
func TestPrometheusMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	idem := &order.Counters{}
	m, err := order.NewPrometheusMetrics(reg, idem)
	if err != nil {
		t.Fatal(err)
	}
	var om order.Metrics = m
	om.Created()
	om.Replay(order.Scope)
	om.Conflict(order.Scope)
	om.InflightWait(order.Scope)
	if v := idem.Values(); v.Replays != 1 || v.Conflicts != 1 || v.InflightWaits != 1 || v.Created != 0 {
		t.Errorf("idempotency metrics got %+v, want one replay, conflict and wait (and no creation)", v)
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "\nfenceq_orders_created_total 1\n") {
		t.Errorf("exposition lacks fenceq_orders_created_total 1:\n%s", rec.Body)
	}
	if _, err := order.NewPrometheusMetrics(reg, nil); err == nil {
		t.Error("a second registration in one registry succeeded")
	}
	// Without idempotency metrics, the idempotency counts go nowhere.
	quiet, err := order.NewPrometheusMetrics(prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	quiet.Replay(order.Scope)
}
