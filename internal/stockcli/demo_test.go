package stockcli_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/demo"
	"github.com/fenceq/fenceq/internal/pgcluster"
	"github.com/fenceq/fenceq/internal/stockcli"
	"github.com/fenceq/fenceq/internal/syncbuf"
)

// TestDemo runs the demo end to end, scaled down, on the test server: it must exit 0,
// and its report must show that the fault really fired (a frozen worker's lease was
// revoked and its late commit rejected) and that every outcome happened exactly once.
func TestDemo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const customers, keys = 20, 6
	var out, errb syncbuf.Buffer
	code := stockcli.Run(ctx, []string{"fenceq", "demo", "--database-url", fenceqtest.RequireServerURL(t), "--customers", "20",
		"--workers", "4", "--order-keys", "6", "--json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	var rep demo.Report
	if err := jsonDecode(out.String(), &rep); err != nil {
		t.Fatalf("decode report: %v\n%s", err, out.String())
	}
	// The fault fired: a frozen worker's lease was revoked and the database rejected it.
	p := rep.Pause
	if p == nil || !p.Revoked || p.StaleWrites < 1 || p.TakenBy == "" || p.TakenBy == p.Worker {
		t.Fatalf("pause: %+v, want a revoked lease whose stale commit was rejected and whose invoice another worker wrote", p)
	}
	if rep.StaleWritesRejected < 1 || rep.LeasesRevoked < 1 || rep.ExpiredHolderAlive < 1 {
		t.Fatalf("mechanism counts: revoked %d, stale writes %d, expired while holder lived %d; want each ≥ 1",
			rep.LeasesRevoked, rep.StaleWritesRejected, rep.ExpiredHolderAlive)
	}
	// Exactly once.
	if rep.Invoices != customers || rep.InvoiceEmails != customers || rep.Orders != keys || rep.OrderEmails != keys {
		t.Fatalf("outcomes: %d invoices, %d invoice emails, %d orders, %d order emails; want %d, %d, %d, %d",
			rep.Invoices, rep.InvoiceEmails, rep.Orders, rep.OrderEmails, customers, customers, keys, keys)
	}
	if rep.Storm.Created != keys || rep.Storm.Requests < keys*3*6 || rep.Storm.Failed != 0 {
		t.Fatalf("order storm: %+v, want %d created from ≥ %d requests, none failed", rep.Storm, keys, keys*3*6)
	}
	if rep.DistinctMessageIDs != customers+keys || rep.MailLines < rep.DistinctMessageIDs {
		t.Fatalf("mail file: %d lines, %d distinct Message-IDs; want %d distinct", rep.MailLines, rep.DistinctMessageIDs, customers+keys)
	}
	if rep.Duplicates != 0 || rep.LostJobs != 0 || rep.Verify == nil || !rep.Verify.Passed {
		t.Fatalf("duplicates %d, lost %d, verify %+v", rep.Duplicates, rep.LostJobs, rep.Verify)
	}
	// The demo's schema is gone.
	conn, err := pgx.Connect(ctx, fenceqtest.RequireServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, rep.Schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists || rep.Schema == "" {
		t.Fatalf("demo schema %q still exists after the demo", rep.Schema)
	}
}

func TestDemoErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r := runCLI(ctx, "demo", "--database-url", "postgres://u:secret@127.0.0.1:1/x")
	oneErrorLine(t, r, "cannot connect to postgres://u:xxxxx@127.0.0.1:1/x")
	r = runCLI(ctx, "demo", "--workers", "1", "--database-url", "postgres://u@127.0.0.1:1/x")
	oneErrorLine(t, r, "invalid --workers 1")
}

// TestDemoThrowawayCluster: with no database given and none at the local address, the
// demo starts a throwaway cluster from the machine's PostgreSQL binaries, runs there and
// removes it.
func TestDemoThrowawayCluster(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBinDir(); err != nil {
		t.Fatalf("%v: install PostgreSQL's server package (apt-get install postgresql; .ci/run does)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb syncbuf.Buffer
	code := stockcli.Run(ctx, []string{"fenceq", "demo", "--local-database-url", "postgres://postgres@127.0.0.1:1/none",
		"--customers", "8", "--workers", "3", "--order-keys", "2", "--json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("demo: exit %d\nstderr:\n%s", code, errb.String())
	}
	var rep demo.Report
	if err := jsonDecode(out.String(), &rep); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`throwaway cluster \(PostgreSQL from \S+, port \d+, in (\S+)\)`).FindStringSubmatch(rep.Database)
	if m == nil || rep.Invoices != 8 || !rep.Verify.Passed {
		t.Fatalf("report: database %q, %d invoices, verify passed %v", rep.Database, rep.Invoices, rep.Verify.Passed)
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still exists (err %v)", m[1], err)
	}
	if !strings.Contains(errb.String(), "throwaway cluster stopped and removed") {
		t.Errorf("stderr lacks the cluster's removal:\n%s", errb.String())
	}
}

func TestDemoWithoutAnyPostgreSQL(t *testing.T) {
	t.Parallel()
	r := runCLI(t.Context(), "demo", "--local-database-url", "postgres://postgres@127.0.0.1:1/none", "--pg-bin-dir", t.TempDir())
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	last := lines[len(lines)-1]
	if r.code != 1 || !strings.HasPrefix(last, "fenceq: the demo needs PostgreSQL") || !strings.Contains(last, "DATABASE_URL=") {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}
