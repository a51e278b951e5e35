package verify_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/verify"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
)

// The prefixes the checks use are the ones the built-in jobs write.
func TestEmailPrefixesMatchTheJobs(t *testing.T) {
	t.Parallel()
	if verify.InvoiceEmailPrefix != invoice.EmailDedupePrefix || verify.OrderEmailPrefix != order.EmailDedupePrefix {
		t.Errorf("verify prefixes %q, %q; the jobs write %q, %q", verify.InvoiceEmailPrefix, verify.OrderEmailPrefix,
			invoice.EmailDedupePrefix, order.EmailDedupePrefix)
	}
}

// Options.Sets leaves out the checks of the sets it does not name, and a named set
// whose tables are missing is reported as not installed.
func TestSetsSelectBusinessChecks(t *testing.T) {
	t.Parallel()
	db := fenceqtest.New(t, nil) // the core tables only
	ctx := context.Background()
	names := func(rep *verify.Report) []string {
		var out []string
		for _, c := range rep.Checks {
			out = append(out, c.Name)
		}
		return out
	}
	coreOnly, err := verify.Run(ctx, db.Pool, verify.Options{Sets: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{verify.CheckDuplicateInvoices, verify.CheckInvoiceEmails, verify.CheckDuplicateOrders, verify.CheckOrderEmails} {
		if slices.Contains(names(coreOnly), n) {
			t.Errorf("Sets [] ran %s: %v", n, names(coreOnly))
		}
	}
	if !slices.Contains(names(coreOnly), verify.CheckOutboxKeys) || !coreOnly.Passed {
		t.Errorf("Sets []: checks %v, passed %v; want the core checks, passing", names(coreOnly), coreOnly.Passed)
	}
	withInvoice, err := verify.Run(ctx, db.Pool, verify.Options{Sets: []string{"invoice"}})
	if err != nil {
		t.Fatal(err)
	}
	c, ok := withInvoice.Get(verify.CheckDuplicateInvoices)
	if !ok || !strings.Contains(c.Skipped, "the invoice set is not installed") {
		t.Errorf("Sets [invoice] on a core-only schema: %+v, %v; want skipped as not installed", c, ok)
	}
	if _, ok := withInvoice.Get(verify.CheckDuplicateOrders); ok {
		t.Errorf("Sets [invoice] ran the order checks: %v", names(withInvoice))
	}
}
