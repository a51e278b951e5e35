package builtin_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/queue"
)

// One registry holds the mechanism's and the business counters; the order metrics'
// replays land in the mechanism's idempotency counters.
func TestNewMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := builtin.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Orders.Created()
	m.Orders.Replay(order.Scope)
	m.Invoices.DuplicatePrevented(invoice.DuplicateExistingInvoice)
	m.Core.Outbox().Delivered("email")
	m.Core.JobStarted(context.Background(), &queue.JobRow{Queue: "billing", Kind: invoice.Kind})
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range []string{
		`fenceq_orders_created_total 1`,
		`fenceq_idempotency_replays_total{scope="orders"} 1`,
		`fenceq_invoice_duplicates_prevented_total{how="existing_invoice"} 1`,
		`fenceq_outbox_delivered_total{topic="email"} 1`,
		`fenceq_jobs_claimed_total{kind="invoice",queue="billing"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), "\n"+line+"\n") {
			t.Errorf("exposition lacks %q", line)
		}
	}
	if _, err := builtin.NewMetrics(reg); err == nil {
		t.Error("a second NewMetrics in one registry succeeded")
	}
}
