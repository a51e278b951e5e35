package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// The naive baseline is the design of the two incidents fenceq is built against, kept
// on purpose so the verifier can be seen to fail: a lease is a row lock with an expiry and no
// generation (whoever comes after the expiry takes the job, like SET NX PX), nothing
// renews it, completion and release are unconditional writes (like DEL), the
// idempotency test is check-then-insert, and the business unique constraints are gone.
// It runs the same job kinds on the same tables as the real worker.

// PrepareNaiveSchema drops the business unique constraints of a migrated schema: one
// invoice per (customer, period) and one order per idempotency key. The outbox keeps its
// dedupe key (a duplicate invoice gets an outbox row of its own key anyway).
func PrepareNaiveSchema(ctx context.Context, db queue.DBTX) error {
	if _, err := db.Exec(ctx, sqlDropUniqueConstraints); err != nil {
		return fmt.Errorf("chaos: prepare the naive schema: %w", err)
	}
	return nil
}

// NaiveConfig configures a naive baseline worker.
type NaiveConfig struct {
	// DatabaseURL connects to the run's schema. Required.
	DatabaseURL string
	// ID names the worker in fenceq_workers and leased_by. Required.
	ID string
	// Lease is how long a claim lasts. Defaults to 2s.
	Lease time.Duration
	// Renew, when positive, renews held leases this often — by job id alone, with no
	// holder or generation check. Zero (the default) renews nothing, as in the billing
	// incident.
	Renew time.Duration
	// Poll is the pause between empty claims. Defaults to 250ms.
	Poll time.Duration
	// Concurrency is how many jobs run at once. Defaults to 4.
	Concurrency int
	// MailFile receives delivered emails, one JSON line each. Required.
	MailFile string
	// Tax shapes the simulated tax call of invoice jobs.
	Tax invoice.SimulatedTaxConfig
	// OrderDelay bounds the random processing time between an order's idempotency
	// check and its insert (the window the index lag opened in the orders incident).
	// Defaults to 500ms.
	OrderDelay time.Duration
	// Logger defaults to a text logger on stderr.
	Logger *slog.Logger
}

// DefaultNaiveTax is the naive worker's tax latency: mostly fast, with a tail past a
// 2s lease.
var DefaultNaiveTax = invoice.SimulatedTaxConfig{MinLatency: 20 * time.Millisecond, MaxLatency: 300 * time.Millisecond,
	TailProbability: 0.1, TailMin: 2500 * time.Millisecond, TailMax: 4 * time.Second}

// ParseNaiveFlags reads a naive worker's command line (the flags after
// `fenceq chaos naive-worker`).
func ParseNaiveFlags(args []string) (NaiveConfig, error) {
	fs := flag.NewFlagSet("naive-worker", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	var c NaiveConfig
	c.Tax = DefaultNaiveTax
	fs.StringVar(&c.DatabaseURL, "database-url", "", "connection URL of the run's schema")
	fs.StringVar(&c.ID, "id", "", "worker id")
	fs.DurationVar(&c.Lease, "lease", 2*time.Second, "lease duration")
	fs.DurationVar(&c.Renew, "renew", 0, "renew leases this often, unfenced (0: never)")
	fs.DurationVar(&c.Poll, "poll", 250*time.Millisecond, "pause between empty claims")
	fs.IntVar(&c.Concurrency, "concurrency", 4, "jobs at once")
	fs.StringVar(&c.MailFile, "mail-file", "", "file receiving delivered emails")
	fs.DurationVar(&c.OrderDelay, "order-delay", 500*time.Millisecond, "longest pause between the order check and insert")
	fs.DurationVar(&c.Tax.MinLatency, "tax-min", c.Tax.MinLatency, "shortest tax call")
	fs.DurationVar(&c.Tax.MaxLatency, "tax-max", c.Tax.MaxLatency, "longest tax call outside the tail")
	fs.Float64Var(&c.Tax.TailProbability, "tax-tail", c.Tax.TailProbability, "chance of a tail latency")
	fs.DurationVar(&c.Tax.TailMin, "tax-tail-min", c.Tax.TailMin, "shortest tail latency")
	fs.DurationVar(&c.Tax.TailMax, "tax-tail-max", c.Tax.TailMax, "longest tail latency")
	if err := fs.Parse(args); err != nil {
		return c, fmt.Errorf("naive worker: %w", err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("naive worker: unexpected argument %q", fs.Arg(0))
	}
	return c, c.validate()
}

func (c *NaiveConfig) validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("naive worker: --database-url is required")
	case c.ID == "":
		return errors.New("naive worker: --id is required")
	case c.MailFile == "":
		return errors.New("naive worker: --mail-file is required")
	case c.Lease <= 0 || c.Poll <= 0 || c.Renew < 0 || c.OrderDelay < 0:
		return fmt.Errorf("naive worker: --lease %s and --poll %s must be positive, --renew %s and --order-delay %s not negative",
			c.Lease, c.Poll, c.Renew, c.OrderDelay)
	case c.Concurrency < 1:
		return fmt.Errorf("naive worker: --concurrency %d must be at least 1", c.Concurrency)
	}
	return nil
}

// naiveWorker is one naive process.
type naiveWorker struct {
	cfg    NaiveConfig
	log    *slog.Logger
	pool   *pgxpool.Pool
	tax    *invoice.SimulatedTax
	mailer *email.FileMailer
	rng    *lockedRand

	mu   sync.Mutex
	held map[int64]bool
	// flow is the per-process enforcement of the flow workload's limits, the way a
	// MaxWorkers semaphore enforces a limit: per flow key (from the job's args), the jobs
	// this process runs and the times it started them. Other processes do not see it.
	flowRunning map[string]int
	flowStarts  map[string][]time.Time
	flowLimits  map[string]flowSleepArgs
}

// flowFull returns the flow keys this process must not claim from now: those whose
// jobs it runs fill their limit, or whose starts fill their rate.
func (w *naiveWorker) flowFull(now time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	full := []string{}
	for key, a := range w.flowLimits {
		if a.FlowMax > 0 && w.flowRunning[key] >= a.FlowMax {
			full = append(full, key)
			continue
		}
		if a.FlowRate > 0 {
			per := time.Duration(a.FlowPerMS) * time.Millisecond
			n := 0
			for _, t := range w.flowStarts[key] {
				if now.Sub(t) < per {
					n++
				}
			}
			if n >= a.FlowRate {
				full = append(full, key)
			}
		}
	}
	return full
}

// flowStart counts a claimed flow job in, or out when done.
func (w *naiveWorker) flowStart(a flowSleepArgs, now time.Time, done bool) {
	if a.FlowKey == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.flowLimits == nil {
		w.flowRunning, w.flowStarts, w.flowLimits = map[string]int{}, map[string][]time.Time{}, map[string]flowSleepArgs{}
	}
	w.flowLimits[a.FlowKey] = a
	if done {
		w.flowRunning[a.FlowKey]--
		return
	}
	w.flowRunning[a.FlowKey]++
	w.flowStarts[a.FlowKey] = append(w.flowStarts[a.FlowKey], now)
	if len(w.flowStarts[a.FlowKey]) > 100 {
		w.flowStarts[a.FlowKey] = w.flowStarts[a.FlowKey][50:]
	}
}

// RunNaiveWorker runs a naive baseline worker until ctx is done, then waits up to 2s
// for running jobs and releases the rest unconditionally.
func RunNaiveWorker(ctx context.Context, cfg NaiveConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("naive worker: database URL: %w", err)
	}
	pcfg.MaxConns = int32(cfg.Concurrency + 2)
	tax, err := invoice.NewSimulatedTax(cfg.Tax)
	if err != nil {
		return fmt.Errorf("naive worker: %w", err)
	}
	mailer, err := email.NewFileMailer(cfg.MailFile)
	if err != nil {
		return fmt.Errorf("naive worker: %w", err)
	}
	defer mailer.Close()
	pool, err := pgxpool.NewWithConfig(context.WithoutCancel(ctx), pcfg)
	if err != nil {
		return fmt.Errorf("naive worker: connect: %w", err)
	}
	defer pool.Close()
	w := &naiveWorker{cfg: cfg, log: cfg.Logger.With("worker", cfg.ID), pool: pool, tax: tax, mailer: mailer,
		rng: newLockedRand(uint64(os.Getpid())), held: map[int64]bool{}}
	host, _ := os.Hostname()
	if _, err := pool.Exec(ctx, sqlNaiveWorkerBeat, cfg.ID, host, os.Getpid(), []string{"*"}); err != nil {
		return fmt.Errorf("naive worker: register: %w", err)
	}
	w.log.Info("naive worker started", "lease", cfg.Lease, "renew", cfg.Renew, "concurrency", cfg.Concurrency)

	bg := context.WithoutCancel(ctx)
	beatCtx, stopBeat := context.WithCancel(bg)
	var beatWG sync.WaitGroup
	beatWG.Add(1)
	go func() {
		defer beatWG.Done()
		w.beat(beatCtx, host)
	}()

	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(ctx)
		}()
	}
	<-ctx.Done()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	stopBeat()
	beatWG.Wait()
	// The unconditional release: whoever holds these jobs now, they become available.
	rctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	for _, id := range w.heldIDs() {
		if _, err := pool.Exec(rctx, sqlNaiveRelease, id); err != nil {
			w.log.Warn("release", "job_id", id, "err", err)
		}
	}
	_, _ = pool.Exec(rctx, sqlNaiveWorkerGone, cfg.ID)
	w.log.Info("naive worker stopped")
	return nil
}

func (w *naiveWorker) heldIDs() []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]int64, 0, len(w.held))
	for id := range w.held {
		ids = append(ids, id)
	}
	return ids
}

func (w *naiveWorker) hold(id int64, on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if on {
		w.held[id] = true
	} else {
		delete(w.held, id)
	}
}

func (w *naiveWorker) beat(ctx context.Context, host string) {
	every := time.Second
	if w.cfg.Renew > 0 {
		every = w.cfg.Renew
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, _ = w.pool.Exec(ctx, sqlNaiveWorkerBeat, w.cfg.ID, host, os.Getpid(), []string{"*"})
		if w.cfg.Renew > 0 {
			if ids := w.heldIDs(); len(ids) > 0 {
				_, _ = w.pool.Exec(ctx, sqlNaiveHeartbeat, ids, w.cfg.Lease.Microseconds())
			}
		}
	}
}

func (w *naiveWorker) loop(ctx context.Context) {
	for ctx.Err() == nil {
		var id int64
		var kind string
		var args []byte
		var attempt int
		err := w.pool.QueryRow(ctx, sqlNaiveClaim, w.cfg.ID, w.cfg.Lease.Microseconds(), w.flowFull(time.Now())).
			Scan(&id, &kind, &args, &attempt)
		if err != nil {
			if !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil {
				w.log.Warn("claim failed", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(w.cfg.Poll):
			}
			continue
		}
		w.hold(id, true)
		// Jobs run to the end whatever happens to the lease: nothing tells them.
		jctx := context.WithoutCancel(ctx)
		log := w.log.With("job_id", id, "kind", kind, "attempt", attempt)
		err = w.run(jctx, id, kind, args)
		if err != nil {
			log.Warn("job failed; retrying", "err", err)
			_, err = w.pool.Exec(jctx, sqlNaiveRetry, id, err.Error())
		} else {
			_, err = w.pool.Exec(jctx, sqlNaiveComplete, id)
		}
		if err != nil {
			log.Warn("could not record the outcome", "err", err)
		}
		w.hold(id, false)
	}
}

func (w *naiveWorker) run(ctx context.Context, id int64, kind string, args []byte) error {
	switch kind {
	case diag.NoopKind:
		return nil
	case diag.SleepKind:
		var a flowSleepArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return err
		}
		w.flowStart(a, time.Now(), false)
		time.Sleep(time.Duration(a.Duration))
		w.flowStart(a, time.Now(), true)
		return nil
	case invoice.Kind:
		var a invoice.Args
		if err := json.Unmarshal(args, &a); err != nil {
			return err
		}
		return w.invoice(ctx, id, a)
	case order.PlaceKind:
		var a order.PlaceArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return err
		}
		_, _, err := NaivePlaceOrder(ctx, w.pool, a.IdempotencyKey, a.Request, id, w.rng.duration(w.cfg.OrderDelay))
		return err
	case outbox.DeliverKind:
		var a outbox.DeliverArgs
		if err := json.Unmarshal(args, &a); err != nil {
			return err
		}
		return w.deliver(ctx, a.OutboxID)
	}
	return fmt.Errorf("naive worker: no handler for kind %q", kind)
}

// invoice looks for the invoice, then (after the slow tax call) inserts it: the
// check-then-insert that two holders of one job both pass.
func (w *naiveWorker) invoice(ctx context.Context, jobID int64, a invoice.Args) error {
	var existing int64
	err := w.pool.QueryRow(ctx, sqlNaiveFindInvoice, a.CustomerID, a.Period).Scan(&existing)
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	var currency, country string
	if err := w.pool.QueryRow(ctx, sqlNaiveCustomer, a.CustomerID).Scan(&currency, &country); err != nil {
		return fmt.Errorf("customer %d: %w", a.CustomerID, err)
	}
	rows, err := w.pool.Query(ctx, sqlNaiveUsage, a.CustomerID, a.Period)
	if err != nil {
		return err
	}
	lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (invoice.Line, error) {
		var l invoice.Line
		err := r.Scan(&l.SKU, &l.Description, &l.Quantity, &l.UnitPriceCents)
		l.AmountCents = l.Quantity * l.UnitPriceCents
		return l, err
	})
	if err != nil {
		return err
	}
	quote, err := w.tax.Quote(ctx, invoice.TaxRequest{CustomerID: a.CustomerID, Country: country, Period: a.Period, Currency: currency})
	if err != nil {
		return err
	}
	totals, err := invoice.ComputeTotals(lines, quote.RateMicros)
	if err != nil {
		return err
	}
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var invoiceID int64
	if err := tx.QueryRow(ctx, sqlNaiveInsertInvoice, a.CustomerID, a.Period, currency, totals.SubtotalCents,
		totals.TaxRateMicros, totals.TaxCents, quote.Reference, jobID, w.cfg.ID).Scan(&invoiceID); err != nil {
		return fmt.Errorf("insert invoice: %w", err)
	}
	for i, l := range lines {
		if _, err := tx.Exec(ctx, sqlNaiveInsertLine, invoiceID, i+1, l.SKU, l.Description, l.Quantity, l.UnitPriceCents); err != nil {
			return fmt.Errorf("insert invoice line: %w", err)
		}
	}
	payload, err := json.Marshal(email.Message{To: []string{fmt.Sprintf("customer-%d@example.com", a.CustomerID)},
		Subject: fmt.Sprintf("Invoice %d for %s", invoiceID, a.Period), Text: "Your invoice."})
	if err != nil {
		return err
	}
	if _, err := outbox.Insert(ctx, tx, outbox.Message{Topic: email.TopicEmail,
		DedupeKey: invoice.EmailDedupeKey(invoiceID), Payload: payload, JobID: jobID}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	w.log.Info("invoice created", "invoice_id", invoiceID, "customer_id", a.CustomerID, "period", a.Period, "job_id", jobID)
	return nil
}

func (w *naiveWorker) deliver(ctx context.Context, outboxID int64) error {
	var topic, key string
	var payload []byte
	if err := w.pool.QueryRow(ctx, sqlNaiveOutboxRow, outboxID).Scan(&topic, &key, &payload); err != nil {
		return fmt.Errorf("outbox row %d: %w", outboxID, err)
	}
	var m email.Message
	if err := json.Unmarshal(payload, &m); err != nil {
		return fmt.Errorf("outbox row %d: %w", outboxID, err)
	}
	m.MessageID = email.MessageIDFor(key, "")
	m.IdempotencyKey = outbox.DeliveryKey(key)
	if err := w.mailer.Send(ctx, m); err != nil {
		return err
	}
	_, err := w.pool.Exec(ctx, sqlNaiveMarkDelivered, outboxID)
	return err
}

// NaivePlaceOrder is the orders incident's placement: look for an order with the key;
// if there is none, work for delay (the window the lagging index opened), then insert.
// Concurrent requests with one key all pass the check. jobID 0 means an HTTP request.
// It returns the order id and whether it was found rather than created.
func NaivePlaceOrder(ctx context.Context, pool *pgxpool.Pool, key string, req order.Request, jobID int64, delay time.Duration) (int64, bool, error) {
	var id int64
	err := pool.QueryRow(ctx, sqlNaiveFindOrder, key).Scan(&id)
	if err == nil {
		return id, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, false, err
	}
	if err := req.Validate(); err != nil {
		return 0, false, err
	}
	hash, err := req.Hash()
	if err != nil {
		return 0, false, err
	}
	time.Sleep(delay)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var job, gen *int64
	if jobID != 0 {
		zero := int64(0)
		job, gen = &jobID, &zero
	}
	if err := tx.QueryRow(ctx, sqlNaiveInsertOrder, key, hash, req.CustomerEmail, req.Currency, req.Total(), job, gen).Scan(&id); err != nil {
		return 0, false, fmt.Errorf("insert order: %w", err)
	}
	for i, it := range req.Items {
		if _, err := tx.Exec(ctx, sqlNaiveInsertOrderItem, id, i+1, it.SKU, it.Quantity, it.UnitPriceCents); err != nil {
			return 0, false, fmt.Errorf("insert order item: %w", err)
		}
	}
	payload, err := json.Marshal(email.Message{To: []string{req.CustomerEmail}, Subject: fmt.Sprintf("Order %d confirmed", id),
		Text: "Thank you for your order."})
	if err != nil {
		return 0, false, err
	}
	if _, err := outbox.Insert(ctx, tx, outbox.Message{Topic: email.TopicEmail,
		DedupeKey: order.EmailDedupePrefix + fmt.Sprint(id), Payload: payload, JobID: jobID}); err != nil {
		return 0, false, err
	}
	return id, false, tx.Commit(ctx)
}

// lockedRand is a math/rand/v2 source safe for concurrent use.
type lockedRand struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func newLockedRand(seed uint64) *lockedRand {
	return &lockedRand{rng: rand.New(rand.NewPCG(seed, seed^0x5ca1ab1e))}
}

// duration returns a duration in [0, max].
func (r *lockedRand) duration(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Duration(r.rng.Int64N(int64(max) + 1))
}

// RunNaiveCommand parses a naive worker's command line (see ParseNaiveFlags) and runs
// the worker until ctx is done: the body of `fenceq chaos naive-worker`.
func RunNaiveCommand(ctx context.Context, args []string) error {
	cfg, err := ParseNaiveFlags(args)
	if err != nil {
		return err
	}
	return RunNaiveWorker(ctx, cfg)
}
