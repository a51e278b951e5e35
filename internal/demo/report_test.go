package demo

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/verify"
)

// sampleReport is a report of a run that proved its point.
func sampleReport() *Report {
	return &Report{Database: "db", Schema: "s", Duration: "6.1s",
		Config: Scale{Customers: 48, Workers: 8, OrderKeys: 24, Lease: 2 * time.Second, Seed: 1}, Period: "2026-10",
		Invoices: 48, InvoiceEmails: 48, Orders: 24, OrderEmails: 24,
		Storm:     StormCounts{Requests: 432, Created: 24, Replayed: 408},
		MailLines: 72, DistinctMessageIDs: 72, SlowTaxCalls: 3, TaxCalls: 52,
		Pause: &PauseReport{Worker: "worker-3", CustomerID: 5, JobID: 9, Gen: 1, Frozen: "3.1s", Revoked: true,
			Noticed: true, TakenBy: "worker-1", StaleWrites: 1},
		LeasesRevoked: 4, StaleWritesRejected: 4, ExpiredHolderAlive: 4,
		Verify: &verify.Report{Passed: true, Checks: []verify.Check{{Name: "a", Description: "one a"},
			{Name: "b", Description: "bb", Skipped: "no table"}}},
		Kept: map[string]string{"mail_file": "/tmp/m"},
	}
}

// The text and the JSON of a report are what scripts and the README show: they change
// only on purpose (go test -run TestReportGolden after updating testdata/).
func TestReportGolden(t *testing.T) {
	t.Parallel()
	rep := sampleReport()
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	for file, got := range map[string]string{"testdata/report.txt": text.String(), "testdata/report.json": string(js) + "\n"} {
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Errorf("%s differs; got:\n%s", file, got)
		}
	}
}

func TestReportFailure(t *testing.T) {
	t.Parallel()
	if f := sampleReport().Failure(); f != "" {
		t.Fatalf("Failure of a good run: %q", f)
	}
	for _, c := range []struct {
		name   string
		change func(*Report)
		want   string
	}{
		{"ViolationFound", func(r *Report) { r.Verify = &verify.Report{Violations: 2} }, "demo: verify found 2 violation(s)"},
		{"FaultDidNotFire", func(r *Report) { r.StaleWritesRejected = 0 }, "the injected fault did not fire"},
		{"InvoiceMissing", func(r *Report) { r.Invoices = 47 }, "demo: 47 of 48 invoices and 24 of 24 orders were written"},
		{"OrderMissing", func(r *Report) { r.Orders = 23 }, "demo: 48 of 48 invoices and 23 of 24 orders were written"},
	} {
		rep := sampleReport()
		c.change(rep)
		if f := rep.Failure(); !strings.Contains(f, c.want) {
			t.Errorf("%s: Failure() = %q, want %q", c.name, f, c.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := Config{Scale: DefaultScale(), Timeout: time.Minute}
	if err := good.Validate(); err != nil {
		t.Fatalf("the default scale: %v", err)
	}
	for _, c := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Customers = 0 }, "invalid --customers 0: want 1 to 10000"},
		{func(c *Config) { c.Workers = 1 }, "invalid --workers 1: want 2 to 32"},
		{func(c *Config) { c.OrderKeys = 1001 }, "invalid --order-keys 1001: want 1 to 1000"},
		{func(c *Config) { c.Lease = 100 * time.Millisecond }, "invalid --lease 100ms: want 500ms to 1m"},
		{func(c *Config) { c.Timeout = 0 }, "invalid --timeout 0s: must be positive"},
	} {
		cfg := good
		c.change(&cfg)
		if err := cfg.Validate(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want %q", err, c.want)
		}
	}
}
