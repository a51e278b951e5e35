package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/internal/metrics"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// The metrics are what the business packages count into.
var (
	_ fenceq.JobFinishedHook = (*metrics.Metrics)(nil)
	_ order.Metrics          = (*metrics.IdempotencyMetrics)(nil)
	_ outbox.Metrics         = (*metrics.OutboxMetrics)(nil)
	_ invoice.Metrics        = (*metrics.InvoiceMetrics)(nil)
)

// kindInfo describes a built-in kind for enqueue and worker.
type kindInfo struct {
	queue    string
	desc     string
	validate func(args []byte) error
}

// builtinKinds are the kinds `fenceq worker` runs.
func builtinKinds() map[string]kindInfo {
	return map[string]kindInfo{
		diag.NoopKind:      {queue: queue.DefaultQueue, desc: "completes at once"},
		diag.SleepKind:     {queue: queue.DefaultQueue, desc: `sleeps, e.g. {"duration": "5s"}`, validate: diag.ValidateSleep},
		outbox.DeliverKind: {queue: outbox.Queue, desc: "delivers one outbox row (email)", validate: validateDeliver},
		order.PlaceKind:    {queue: queue.DefaultQueue, desc: "places an order once per idempotency key", validate: validatePlace},
		invoice.Kind:       {queue: invoice.Queue, desc: "writes one customer's invoice for a period", validate: validateInvoice},
		housekeeping.IdempotencyKind: {queue: queue.DefaultQueue, desc: "deletes expired idempotency keys (recurring)",
			validate: validateEmpty},
	}
}

func kindNames() []string { return slices.Sorted(maps.Keys(builtinKinds())) }

// builtinQueues are the queues the built-in kinds use, served by default.
func builtinQueues() []string {
	set := map[string]bool{}
	for _, k := range builtinKinds() {
		set[k.queue] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// periodicKinds reschedule themselves and so never all finish.
func periodicKinds() []string { return []string{housekeeping.IdempotencyKind} }

func validateInvoice(raw []byte) error {
	var a invoice.Args
	if err := decodeStrict(raw, &a); err != nil {
		return err
	}
	return a.Validate()
}

func validateEmpty(raw []byte) error {
	var a struct{}
	return decodeStrict(raw, &a)
}

func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func validatePlace(raw []byte) error {
	var a order.PlaceArgs
	if err := decodeStrict(raw, &a); err != nil {
		return err
	}
	if a.IdempotencyKey == "" {
		return fmt.Errorf("idempotency_key is required")
	}
	return a.Request.Validate()
}

func validateDeliver(raw []byte) error {
	var a outbox.DeliverArgs
	if err := decodeStrict(raw, &a); err != nil {
		return err
	}
	if a.OutboxID <= 0 {
		return fmt.Errorf("outbox_id must be a positive outbox row id")
	}
	return nil
}

// businessFlags configure the built-in business kinds in worker and serve.
func businessFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "mailer", Usage: "where emails go: file:PATH (JSON lines; file:- for stdout) or " +
			"smtp://[USER:PASSWORD@]HOST:PORT?from=ADDR[&starttls=off|opportunistic|required] " +
			"(default file:" + defaultMailPath() + ")"},
		&ucli.DurationFlag{Name: "order-key-ttl", Value: order.DefaultKeyTTL, Usage: "how long an order's idempotency key is remembered"},
		&ucli.StringFlag{Name: "tax-latency", Value: "20ms-200ms", Usage: "latency range MIN-MAX of the simulated tax service invoices call"},
		&ucli.Float64Flag{Name: "tax-tail-probability", Usage: "chance 0–1 that a tax call takes a --tax-tail latency"},
		&ucli.StringFlag{Name: "tax-tail", Value: "2m-5m", Usage: "latency range MIN-MAX of the tax service's slow tail"},
		&ucli.Float64Flag{Name: "tax-error-rate", Usage: "chance 0–1 that a tax call fails (the invoice job retries)"},
		&ucli.DurationFlag{Name: "housekeeping-interval", Value: housekeeping.DefaultInterval, Usage: "how often expired idempotency keys are deleted"},
	}
}

// parseRange reads "MIN-MAX" or a single duration.
func parseRange(flag, s string) (lo, hi time.Duration, err error) {
	a, b, found := strings.Cut(s, "-")
	if lo, err = time.ParseDuration(strings.TrimSpace(a)); err != nil {
		return 0, 0, usageError{fmt.Errorf("invalid --%s %q: want MIN-MAX durations such as 20ms-200ms", flag, s)}
	}
	hi = lo
	if found {
		if hi, err = time.ParseDuration(strings.TrimSpace(b)); err != nil || hi < lo {
			return 0, 0, usageError{fmt.Errorf("invalid --%s %q: want MIN-MAX durations with MIN ≤ MAX", flag, s)}
		}
	}
	return lo, hi, nil
}

// newTax builds the simulated tax service from the command's flags.
func newTax(c *ucli.Context) (*invoice.SimulatedTax, error) {
	cfg := invoice.SimulatedTaxConfig{TailProbability: c.Float64("tax-tail-probability"), ErrorRate: c.Float64("tax-error-rate")}
	var err error
	if cfg.MinLatency, cfg.MaxLatency, err = parseRange("tax-latency", c.String("tax-latency")); err != nil {
		return nil, err
	}
	if cfg.TailMin, cfg.TailMax, err = parseRange("tax-tail", c.String("tax-tail")); err != nil {
		return nil, err
	}
	tax, err := invoice.NewSimulatedTax(cfg)
	if err != nil {
		return nil, usageError{fmt.Errorf("simulated tax service: %w", err)}
	}
	return tax, nil
}

func defaultMailPath() string { return filepath.Join(os.TempDir(), "fenceq-mail.jsonl") }

// builtinDeps are what the built-in kinds need.
type builtinDeps struct {
	Pool    *pgxpool.Pool
	Logger  *slog.Logger
	Metrics *metrics.Metrics
	// Mailer overrides the --mailer flag (the demo's file mailer).
	Mailer email.Mailer
}

// newOrderService builds the order service from the command's flags.
func newOrderService(c *ucli.Context, d builtinDeps) (*order.Service, error) {
	svc, err := order.NewService(order.Config{Pool: d.Pool, KeyTTL: c.Duration("order-key-ttl"),
		Metrics: d.Metrics.Idempotency(), Logger: d.Logger})
	if err != nil {
		return nil, usageError{fmt.Errorf("order service: %w", err)}
	}
	return svc, nil
}

// parseMailer builds the mailer named by --mailer and describes it for the log. The
// returned func closes it.
func parseMailer(spec string) (email.Mailer, string, func(), error) {
	if spec == "" {
		spec = "file:" + defaultMailPath()
	}
	switch {
	case strings.HasPrefix(spec, "file:"):
		path := strings.TrimPrefix(spec, "file:")
		if path == "" {
			return nil, "", nil, usageError{fmt.Errorf("invalid --mailer %q: file: needs a path", spec)}
		}
		fm, err := email.NewFileMailer(path)
		if err != nil {
			return nil, "", nil, fmt.Errorf("open mail file: %w", err)
		}
		return fm, "emails are written as JSON lines to " + path, func() { _ = fm.Close() }, nil
	case strings.HasPrefix(spec, "smtp://"):
		u, err := url.Parse(spec)
		if err != nil {
			return nil, "", nil, usageError{fmt.Errorf("invalid --mailer %s: %v", RedactURL(spec), err)}
		}
		cfg := email.SMTPConfig{Addr: u.Host, From: u.Query().Get("from"), Timeout: 30 * time.Second}
		if u.User != nil {
			cfg.Username = u.User.Username()
			cfg.Password, _ = u.User.Password()
		}
		if s := u.Query().Get("starttls"); s != "" {
			if cfg.StartTLS, err = email.ParseStartTLSMode(s); err != nil {
				return nil, "", nil, usageError{fmt.Errorf("invalid --mailer %s: %v", RedactURL(spec), err)}
			}
		}
		sm, err := email.NewSMTPMailer(cfg)
		if err != nil {
			return nil, "", nil, usageError{fmt.Errorf("invalid --mailer %s: %v", RedactURL(spec), err)}
		}
		return sm, "emails are sent over SMTP to " + cfg.Addr, func() {}, nil
	}
	return nil, "", nil, usageError{fmt.Errorf("invalid --mailer %q: want file:PATH or smtp://HOST:PORT?from=ADDR", spec)}
}

// registerBuiltins adds every built-in kind's handler. It returns a func releasing what
// the handlers hold (the mail file) and a line saying where emails go.
func registerBuiltins(c *ucli.Context, hs *fenceq.Handlers, d builtinDeps) (func(), string, error) {
	diag.Register(hs)
	cleanup := func() {}
	mailer, desc := d.Mailer, "emails go to the given mailer"
	if mailer == nil {
		var err error
		if mailer, desc, cleanup, err = parseMailer(c.String("mailer")); err != nil {
			return nil, "", err
		}
	}
	if _, err := email.RegisterRelay(hs, outbox.RelayConfig{Pool: d.Pool, Logger: d.Logger, Metrics: d.Metrics.Outbox()},
		email.DelivererConfig{Mailer: mailer}); err != nil {
		cleanup()
		return nil, "", err
	}
	svc, err := newOrderService(c, d)
	if err != nil {
		cleanup()
		return nil, "", err
	}
	if err := order.Register(hs, svc); err != nil {
		cleanup()
		return nil, "", fmt.Errorf("register %s: %w", order.PlaceKind, err)
	}
	tax, err := newTax(c)
	if err != nil {
		cleanup()
		return nil, "", err
	}
	if err := invoice.Register(hs, invoice.Config{Pool: d.Pool, Tax: tax, Logger: d.Logger,
		Metrics: d.Metrics.Invoices()}); err != nil {
		cleanup()
		return nil, "", fmt.Errorf("register %s: %w", invoice.Kind, err)
	}
	if err := housekeeping.Register(hs, housekeeping.Config{Pool: d.Pool, Interval: c.Duration("housekeeping-interval"),
		Logger: d.Logger}); err != nil {
		cleanup()
		return nil, "", fmt.Errorf("register housekeeping: %w", err)
	}
	return cleanup, desc, nil
}
