package stockcli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
)

// orderFlags configure the order service: in serve (the orders API) and worker (the
// order.place job).
func orderFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.DurationFlag{Name: "order-key-ttl", Value: order.DefaultKeyTTL, Usage: "how long an order's idempotency key is remembered"},
	}
}

// builtinFlags configure the rest of the built-in kinds the worker runs: where emails
// go, the simulated tax service invoices call, and the housekeeping schedule.
func builtinFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "mailer", EnvVars: []string{"FENCEQ_MAILER"}, Usage: "where emails go: file:PATH (JSON lines; file:- for stdout) or " +
			"smtp://[USER:PASSWORD@]HOST:PORT?from=ADDR[&starttls=off|opportunistic|required] " +
			"(default file:" + defaultMailPath() + ")"},
		&ucli.StringFlag{Name: "tax-latency", Value: "20ms-200ms", Usage: "latency range MIN-MAX of the simulated tax service invoices call"},
		&ucli.Float64Flag{Name: "tax-tail-probability", Usage: "chance 0–1 that a tax call takes a --tax-tail latency"},
		&ucli.StringFlag{Name: "tax-tail", Value: "2m-5m", Usage: "latency range MIN-MAX of the tax service's slow tail"},
		&ucli.Float64Flag{Name: "tax-error-rate", Usage: "chance 0–1 that a tax call fails (the invoice job retries)"},
		&ucli.DurationFlag{Name: "housekeeping-interval", Value: housekeeping.DefaultInterval, Usage: "how often expired idempotency keys are deleted (the housekeeping schedule; whole seconds)"},
	}
}

// parseRange reads "MIN-MAX" or a single duration.
func parseRange(flag, s string) (lo, hi time.Duration, err error) {
	a, b, found := strings.Cut(s, "-")
	if lo, err = time.ParseDuration(strings.TrimSpace(a)); err != nil {
		return 0, 0, usageError{Err: fmt.Errorf("invalid --%s %q: want MIN-MAX durations such as 20ms-200ms", flag, s)}
	}
	hi = lo
	if found {
		if hi, err = time.ParseDuration(strings.TrimSpace(b)); err != nil || hi < lo {
			return 0, 0, usageError{Err: fmt.Errorf("invalid --%s %q: want MIN-MAX durations with MIN ≤ MAX", flag, s)}
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
		return nil, usageError{Err: fmt.Errorf("simulated tax service: %w", err)}
	}
	return tax, nil
}

func defaultMailPath() string { return filepath.Join(os.TempDir(), "fenceq-mail.jsonl") }

// newMailer builds the mailer --mailer names. The returned func closes it; the string
// says where emails go, for the log.
func newMailer(c *ucli.Context) (email.Mailer, string, func() error, error) {
	spec := c.String("mailer")
	if spec == "" {
		spec = "file:" + defaultMailPath()
	}
	m, desc, closeFn, err := email.ParseMailer(spec)
	var se *email.SpecError
	if errors.As(err, &se) {
		return nil, "", nil, usageError{Err: fmt.Errorf("invalid --mailer %q: %s", se.Spec, se.Reason)}
	}
	return m, desc, closeFn, err
}

// newOrderService builds the order service from the command's flags.
func newOrderService(c *ucli.Context, pool *pgxpool.Pool, log *slog.Logger, m order.Metrics) (*order.Service, error) {
	svc, err := order.NewService(order.Config{Pool: pool, KeyTTL: c.Duration("order-key-ttl"),
		Metrics: m, Logger: log})
	if err != nil {
		return nil, usageError{Err: fmt.Errorf("order service: %w", err)}
	}
	return svc, nil
}
