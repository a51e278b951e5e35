package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
)

// WorkloadConfig shapes the work a run gives the workers. The work comes in waves, one
// every WaveEvery while faults are injected; each wave adds customers to a billing run,
// an order retry storm and a few sleep jobs longer than the lease.
type WorkloadConfig struct {
	// WaveEvery is the time between waves. Defaults to 10s.
	WaveEvery time.Duration
	// Customers is how many new customers each wave seeds and bills. Defaults to 20.
	Customers int
	// Period is the billing period. Defaults to 2025-01.
	Period string
	// BillingRuns is how many billing runs of the period each wave starts at once (they
	// must enqueue each customer's invoice job once between them). Defaults to 2.
	BillingRuns int
	// SleepJobs per wave, each sleeping SleepFor. Defaults to 3 and 1.5×lease.
	SleepJobs int
	SleepFor  time.Duration
	// StubbornJobs per wave sleep StubbornFor ignoring cancellation: jobs that run on
	// through a cut link, so that their worker finds the lease revoked once the link is
	// back. Defaults to 2 in a Hosts run (0 otherwise) and 4×lease.
	StubbornJobs int
	StubbornFor  time.Duration
	// OrderKeys is how many idempotency keys each wave's storm uses. Defaults to 8.
	OrderKeys int
	// OrderClients is how many clients send each key, each retrying every OrderRetry
	// until answered. Defaults to 3 and 300ms.
	OrderClients int
	OrderRetry   time.Duration
	// OrderJobs is how many order.place jobs each key also gets (a storm through the
	// queue). Defaults to 2.
	OrderJobs int
	// OrderDelay bounds the random time a placement stays open before its commit (the
	// naive API: between its check and its insert). Defaults to 600ms.
	OrderDelay time.Duration
	// Seed draws the requests and delays.
	Seed int64
	// Flow runs the flow workload instead (flow.go): each wave enqueues FlowJobs jobs
	// per partition of a concurrency limit, a sequence and a rate limit, and nothing
	// else. FlowJobs defaults to 4.
	Flow     bool
	FlowJobs int
}

func (c *WorkloadConfig) withDefaults(lease time.Duration, hosts bool) error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&c.WaveEvery, 10*time.Second)
	def(&c.SleepFor, lease+lease/2)
	def(&c.StubbornFor, 4*lease)
	if hosts && c.StubbornJobs == 0 {
		c.StubbornJobs = 2
	}
	def(&c.OrderRetry, 300*time.Millisecond)
	def(&c.OrderDelay, 600*time.Millisecond)
	defInt(&c.Customers, 20)
	defInt(&c.BillingRuns, 2)
	defInt(&c.SleepJobs, 3)
	defInt(&c.OrderKeys, 8)
	defInt(&c.OrderClients, 3)
	defInt(&c.OrderJobs, 2)
	defInt(&c.FlowJobs, 4)
	if c.Period == "" {
		c.Period = "2025-01"
	}
	if err := invoice.ValidatePeriod(c.Period); err != nil {
		return fmt.Errorf("chaos: workload: %w", err)
	}
	for name, n := range map[string]int{"Customers": c.Customers, "BillingRuns": c.BillingRuns, "SleepJobs": c.SleepJobs,
		"OrderKeys": c.OrderKeys, "OrderClients": c.OrderClients, "OrderJobs": c.OrderJobs, "StubbornJobs": c.StubbornJobs, "FlowJobs": c.FlowJobs} {
		if n < 0 {
			return fmt.Errorf("chaos: workload: %s %d must not be negative", name, n)
		}
	}
	if c.WaveEvery <= 0 || c.OrderRetry <= 0 || c.OrderDelay < 0 || c.SleepFor < 0 {
		return errors.New("chaos: workload: WaveEvery and OrderRetry must be positive, OrderDelay and SleepFor not negative")
	}
	return nil
}

// WorkloadStats is what the workload did.
type WorkloadStats struct {
	Waves int `json:"waves"`
	// Customers seeded; BillingJobs the invoice jobs the billing runs enqueued.
	Customers   int   `json:"customers"`
	BillingJobs int64 `json:"billing_jobs"`
	SleepJobs   int   `json:"sleep_jobs"`
	FlowJobs    int   `json:"flow_jobs,omitempty"`
	OrderKeys   int   `json:"order_keys"`
	OrderJobs   int   `json:"order_jobs"`
	// HTTP storm: requests sent and how they were answered.
	HTTPRequests int64 `json:"http_requests"`
	HTTPCreated  int64 `json:"http_created"`
	HTTPReplayed int64 `json:"http_replayed"`
	HTTPInFlight int64 `json:"http_in_flight_409"`
	HTTPRejected int64 `json:"http_rejected_4xx"`
	HTTPErrors   int64 `json:"http_errors_5xx"`
	HTTPNetErr   int64 `json:"http_network_errors"`
	// KeysUnanswered counts keys none of whose clients got an answer before the end.
	KeysUnanswered int64 `json:"keys_unanswered"`
	// Retries counts workload steps repeated after a database error (a restart).
	Retries int64 `json:"retries"`
}

// Workload generates the run's work: billing runs, order storms and sleep jobs.
type Workload struct {
	env   *Env
	cfg   WorkloadConfig
	naive bool
	log   *slog.Logger
	pool  *pgxpool.Pool
	svc   *order.Service
	srv   *http.Server
	base  string
	http  *http.Client
	rng   *lockedRand

	mu     sync.Mutex
	stats  WorkloadStats
	keys   []string
	acked  []string // keys the API answered 201 for
	jobIDs []int64
	jobs   []ackedJob // jobIDs with their tags
	tags   atomic.Int64

	storms                                                                                sync.WaitGroup
	stormCtx                                                                              context.Context
	stopStorm                                                                             context.CancelFunc
	created, replayed, inflight, rejected, errs5xx, netErr, requests, unanswered, retries atomic.Int64
}

// StartWorkload serves the orders API in this process (the real one, or the naive one
// for a naive run) and returns a workload ready to issue waves.
func StartWorkload(ctx context.Context, env *Env, cfg WorkloadConfig) (*Workload, error) {
	if err := cfg.withDefaults(env.cfg.Lease, env.cfg.Hosts > 0); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		return nil, fmt.Errorf("chaos: workload pool: %w", err)
	}
	pcfg.MaxConns = 8
	pcfg.ConnConfig.RuntimeParams["application_name"] = "fenceq-" + env.Token + "-workload"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("chaos: workload pool: %w", err)
	}
	wl := &Workload{env: env, cfg: cfg, naive: env.cfg.Naive, log: env.log.With("component", "workload"), pool: pool,
		rng: newLockedRand(uint64(cfg.Seed) ^ 0x776f726b), http: &http.Client{Timeout: 15 * time.Second}}
	wl.stormCtx, wl.stopStorm = context.WithCancel(context.WithoutCancel(ctx))
	var h http.Handler
	if wl.naive {
		h = http.HandlerFunc(wl.naiveOrders)
	} else {
		wl.svc, err = order.NewService(order.Config{Pool: pool, Logger: wl.log,
			BeforeCommit: func(ctx context.Context) error {
				sleepCtx(ctx, wl.rng.duration(cfg.OrderDelay))
				return nil
			}})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("chaos: orders service: %w", err)
		}
		h = wl.svc.Handler()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("chaos: orders API: %w", err)
	}
	wl.base = "http://" + ln.Addr().String()
	wl.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = wl.srv.Serve(ln) }()
	if cfg.Flow {
		if err := wl.startFlow(ctx); err != nil {
			wl.Close()
			return nil, err
		}
	}
	return wl, nil
}

// Close stops the storm, the orders API and the workload's pool.
func (wl *Workload) Close() {
	wl.stopStorm()
	wl.storms.Wait()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = wl.srv.Shutdown(sctx)
	wl.pool.Close()
}

// Run issues a wave at once and then every WaveEvery until deadline, and after it until
// faultsDone is closed (nil: not waited for), so that a fault schedule that runs late
// still meets work in flight.
func (wl *Workload) Run(ctx context.Context, deadline time.Time, faultsDone <-chan struct{}) error {
	for i := 0; ; i++ {
		if err := wl.Wave(ctx, i); err != nil {
			return err
		}
		next := time.Now().Add(wl.cfg.WaveEvery)
		if !next.Before(deadline) && isClosed(faultsDone) {
			return nil
		}
		sleepCtx(ctx, time.Until(next))
		if ctx.Err() != nil {
			return nil
		}
	}
}

// isClosed reports whether ch is nil or closed.
func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// retry repeats a workload step after database errors for up to 30s: a PostgreSQL
// restart must not stop the workload.
func (wl *Workload) retry(ctx context.Context, what string, fn func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("chaos: workload: %s: %w", what, err)
		}
		wl.retries.Add(1)
		wl.log.Warn("workload step failed; retrying", "step", what, "err", err)
		sleepCtx(ctx, 300*time.Millisecond)
	}
}

// Wave issues one wave: customers seeded and billed by concurrent billing runs, sleep
// jobs, order.place jobs and an HTTP retry storm.
func (wl *Workload) Wave(ctx context.Context, i int) error {
	c := wl.cfg
	if c.Flow {
		if err := wl.flowWave(ctx, i); err != nil {
			return err
		}
		wl.mu.Lock()
		wl.stats.Waves++
		wl.mu.Unlock()
		wl.log.Info("flow wave issued", "wave", i)
		return nil
	}
	if c.Customers > 0 {
		var ids []int64
		if err := wl.retry(ctx, "seed customers", func() error {
			var err error
			ids, err = invoice.SeedCustomers(ctx, wl.pool, c.Customers, c.Period)
			return err
		}); err != nil {
			return err
		}
		// Several billing runs at once: between them each new customer gets one job.
		var wg sync.WaitGroup
		var billed atomic.Int64
		errs := make([]error, c.BillingRuns)
		for r := 0; r < c.BillingRuns; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = wl.retry(ctx, "billing run", func() error {
					n, err := invoice.RunBilling(ctx, wl.pool, c.Period)
					billed.Add(n)
					return err
				})
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		wl.mu.Lock()
		wl.stats.Customers += len(ids)
		wl.stats.BillingJobs += billed.Load()
		wl.mu.Unlock()
	}
	for j := 0; j < c.SleepJobs; j++ {
		if err := wl.enqueue(ctx, "sleep job", diag.SleepArgs{Duration: diag.Duration(c.SleepFor)}, nil); err != nil {
			return err
		}
		wl.mu.Lock()
		wl.stats.SleepJobs++
		wl.mu.Unlock()
	}
	for j := 0; j < c.StubbornJobs; j++ {
		args := diag.SleepArgs{Duration: diag.Duration(c.StubbornFor), IgnoreCancel: true}
		if err := wl.enqueue(ctx, "sleep job ignoring cancellation", args, nil); err != nil {
			return err
		}
		wl.mu.Lock()
		wl.stats.SleepJobs++
		wl.mu.Unlock()
	}
	for k := 0; k < c.OrderKeys; k++ {
		key := fmt.Sprintf("%s-order-%d-%d", wl.env.Token, i, k)
		req := wl.request(i, k)
		wl.mu.Lock()
		wl.keys = append(wl.keys, key)
		wl.stats.OrderKeys++
		wl.mu.Unlock()
		wl.storm(key, req)
		// The same key through the queue, landing while the clients retry.
		for j := 0; j < c.OrderJobs; j++ {
			opts := &fenceq.InsertOpts{RunIn: time.Duration(j) * c.OrderRetry}
			if err := wl.enqueue(ctx, "order.place job", order.PlaceArgs{IdempotencyKey: key, Request: req}, opts); err != nil {
				return err
			}
			wl.mu.Lock()
			wl.stats.OrderJobs++
			wl.mu.Unlock()
		}
	}
	wl.mu.Lock()
	wl.stats.Waves++
	wl.mu.Unlock()
	wl.log.Info("wave issued", "wave", i)
	return nil
}

func (wl *Workload) enqueue(ctx context.Context, what string, args fenceq.JobArgs, opts *fenceq.InsertOpts) error {
	return wl.retry(ctx, "enqueue "+what, func() error {
		// Each acknowledged enqueue is tagged: a failover run checks it is still there
		// by more than its id.
		o := fenceq.InsertOpts{}
		if opts != nil {
			o = *opts
		}
		tag := fmt.Sprintf("%s-job-%d", wl.env.Token, wl.tags.Add(1))
		o.Metadata = map[string]any{ackTag: tag}
		res, err := fenceq.Enqueue(ctx, wl.pool, args, &o)
		if err != nil {
			return err
		}
		wl.mu.Lock()
		wl.jobIDs = append(wl.jobIDs, res.Job.ID)
		wl.jobs = append(wl.jobs, ackedJob{res.Job.ID, tag})
		wl.mu.Unlock()
		return nil
	})
}

// AckedJobs returns the jobs the workload enqueued one by one, with their tags.
func (wl *Workload) AckedJobs() []ackedJob {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return append([]ackedJob(nil), wl.jobs...)
}

// request is the order of key k of wave i, the same for every client and job.
func (wl *Workload) request(i, k int) order.Request {
	rng := rand.New(rand.NewPCG(uint64(wl.cfg.Seed), uint64(i)<<20|uint64(k)))
	n := 1 + rng.IntN(3)
	items := make([]order.Item, n)
	for j := range items {
		items[j] = order.Item{SKU: fmt.Sprintf("sku-%d", rng.IntN(50)), Quantity: 1 + rng.Int64N(5),
			UnitPriceCents: 100 + rng.Int64N(10_000)}
	}
	return order.Request{CustomerEmail: fmt.Sprintf("buyer-%d-%d@example.com", i, k), Currency: "EUR", Items: items}
}

// storm starts the clients of one key: each sends the same request with the same key
// and retries every OrderRetry until it gets an answer that is final for it.
func (wl *Workload) storm(key string, req order.Request) {
	body, _ := json.Marshal(req)
	var answered atomic.Bool
	var clients sync.WaitGroup
	for c := 0; c < wl.cfg.OrderClients; c++ {
		clients.Add(1)
		wl.storms.Add(1)
		offset := wl.rng.duration(100 * time.Millisecond)
		go func() {
			defer wl.storms.Done()
			defer clients.Done()
			sleepCtx(wl.stormCtx, offset)
			for wl.stormCtx.Err() == nil {
				if wl.post(key, body) {
					answered.Store(true)
					return
				}
				sleepCtx(wl.stormCtx, wl.cfg.OrderRetry)
			}
		}()
	}
	wl.storms.Add(1)
	go func() {
		defer wl.storms.Done()
		clients.Wait()
		if !answered.Load() {
			wl.unanswered.Add(1)
		}
	}()
}

func (wl *Workload) ackKey(key string) {
	wl.mu.Lock()
	wl.acked = append(wl.acked, key)
	wl.mu.Unlock()
}

// AckedKeys returns the idempotency keys the orders API answered 201 for: orders whose
// placement was acknowledged.
func (wl *Workload) AckedKeys() []string {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return append([]string(nil), wl.acked...)
}

// post sends one request and reports whether the client is done with its key.
func (wl *Workload) post(key string, body []byte) bool {
	wl.requests.Add(1)
	req, err := http.NewRequestWithContext(wl.stormCtx, http.MethodPost, wl.base+"/orders", bytes.NewReader(body))
	if err != nil {
		return true
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(order.HeaderIdempotencyKey, key)
	resp, err := wl.http.Do(req)
	if err != nil {
		wl.netErr.Add(1)
		return false
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusCreated && resp.Header.Get(order.HeaderReplayed) == "true",
		resp.StatusCode == http.StatusOK:
		wl.replayed.Add(1)
		wl.ackKey(key)
		return true
	case resp.StatusCode == http.StatusCreated:
		wl.created.Add(1)
		wl.ackKey(key)
		return true
	case resp.StatusCode == http.StatusConflict:
		wl.inflight.Add(1)
		return false
	case resp.StatusCode >= 500:
		wl.errs5xx.Add(1)
		return false
	default:
		wl.rejected.Add(1)
		wl.log.Error("order request rejected", "key", key, "status", resp.StatusCode)
		return true
	}
}

// naiveOrders is the orders incident's API: check, work, insert.
func (wl *Workload) naiveOrders(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/orders" {
		http.NotFound(w, r)
		return
	}
	var req order.Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key := r.Header.Get(order.HeaderIdempotencyKey)
	id, found, err := NaivePlaceOrder(r.Context(), wl.pool, key, req, 0, wl.rng.duration(wl.cfg.OrderDelay))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if found {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusCreated)
	}
	_ = json.NewEncoder(w).Encode(map[string]int64{"id": id})
}

// WaitStorm waits until every storm client is answered or ctx ends (then it stops the
// remaining clients).
func (wl *Workload) WaitStorm(ctx context.Context) {
	done := make(chan struct{})
	go func() { wl.storms.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		wl.stopStorm()
		<-done
	}
}

// Stats returns what the workload did so far.
func (wl *Workload) Stats() WorkloadStats {
	wl.mu.Lock()
	s := wl.stats
	wl.mu.Unlock()
	s.HTTPRequests, s.HTTPCreated, s.HTTPReplayed = wl.requests.Load(), wl.created.Load(), wl.replayed.Load()
	s.HTTPInFlight, s.HTTPRejected, s.HTTPErrors = wl.inflight.Load(), wl.rejected.Load(), wl.errs5xx.Load()
	s.HTTPNetErr, s.KeysUnanswered, s.Retries = wl.netErr.Load(), wl.unanswered.Load(), wl.retries.Load()
	return s
}

// Keys returns the idempotency keys of the storm.
func (wl *Workload) Keys() []string {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return append([]string(nil), wl.keys...)
}

// JobIDs returns the ids of the jobs the workload enqueued one by one (sleep and
// order.place jobs; the billing runs' COPY batches return no ids).
func (wl *Workload) JobIDs() []int64 {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return append([]int64(nil), wl.jobIDs...)
}
