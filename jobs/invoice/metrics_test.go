package invoice_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq/jobs/invoice"
)

func TestPrometheusMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := invoice.NewPrometheusMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var im invoice.Metrics = m
	im.InvoiceCreated()
	im.InvoiceCreated()
	im.DuplicatePrevented(invoice.DuplicateUniqueConstraint)
	im.StaleWriteRejected()
	im.TaxFailed()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, line := range []string{
		`fenceq_invoices_created_total 2`,
		`fenceq_invoice_duplicates_prevented_total{how="unique_constraint"} 1`,
		`fenceq_invoice_duplicates_prevented_total{how="existing_invoice"} 0`,
		`fenceq_tax_failures_total 1`,
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("exposition lacks %q", line)
		}
	}
	if _, err := invoice.NewPrometheusMetrics(reg); err == nil {
		t.Error("a second registration in one registry succeeded")
	}
	if _, err := invoice.NewPrometheusMetrics(nil); err == nil || !strings.Contains(err.Error(), "registerer is nil") {
		t.Errorf("nil registerer: %v", err)
	}
}
