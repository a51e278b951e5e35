// Package metrics exposes fenceq's mechanism to Prometheus: a fenceq.Observer that
// counts what workers see (claims, outcomes, revocations, stale writes, leases that
// expired while their holder lived, heartbeat failures), counters for idempotency
// replays and conflicts (the method set of jobs/order.Metrics), invoices (of
// jobs/invoice.Metrics) and outbox deliveries (of jobs/email.Metrics), and a collector that reads the database
// at scrape time (queue depth, outbox backlog and its oldest age, the oldest open
// transaction).
//
// Every name starts with fenceq_. The counters are per process; the database gauges are
// the same from every process that scrapes one database.
package metrics

import (
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// Metrics holds fenceq's Prometheus metrics and the registry they live in. It
// implements fenceq.Observer; pass it as Config.Observer. Its methods are safe for
// concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	jobsClaimed        *prometheus.CounterVec
	jobsFinished       *prometheus.CounterVec
	jobDuration        *prometheus.HistogramVec
	leaseRevocations   *prometheus.CounterVec
	staleWrites        *prometheus.CounterVec
	expiredHolderAlive *prometheus.CounterVec
	leasesLost         prometheus.Counter
	heartbeatFailures  prometheus.Counter
	idemReplays        *prometheus.CounterVec
	idemConflicts      *prometheus.CounterVec
	ordersCreated      prometheus.Counter
	invoicesCreated    prometheus.Counter
	invoiceDuplicates  *prometheus.CounterVec
	taxFailures        prometheus.Counter
	outboxDelivered    *prometheus.CounterVec
	outboxRetried      *prometheus.CounterVec
	outboxFailed       *prometheus.CounterVec
	periodicEnqueued   *prometheus.CounterVec
}

var _ fenceq.Observer = (*Metrics)(nil)

// New returns metrics registered in a fresh registry, together with the Go runtime and
// process collectors. Add the database collector with Register(NewDBCollector(…)).
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.jobsClaimed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_jobs_claimed_total",
		Help: "Jobs claimed by this process, by queue and kind.",
	}, []string{"queue", "kind"})
	m.jobsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_jobs_finished_total",
		Help: "Job attempts that ended in this process, by queue, kind and outcome " +
			"(completed, retried, discarded, cancelled, snoozed, lease_lost, released, unknown).",
	}, []string{"queue", "kind", "outcome"})
	m.jobDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fenceq_job_duration_seconds",
		Help:    "Duration of job attempts from claim to settled outcome, by queue and kind.",
		Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{"queue", "kind"})
	m.leaseRevocations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_lease_revocations_total",
		Help: "Expired leases this process's reaper revoked (generation bumped), by queue and kind.",
	}, []string{"queue", "kind"})
	m.staleWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_stale_writes_rejected_total",
		Help: "Writes under a revoked lease generation that the database rejected, by operation.",
	}, []string{"op"})
	m.expiredHolderAlive = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_leases_expired_holder_alive_total",
		Help: "Leases that expired while their holder process was still alive (paused or stuck), " +
			"by who saw it: the reaper or the holder. Alert on any increase.",
	}, []string{"seen_by"})
	m.leasesLost = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fenceq_leases_lost_total",
		Help: "Leases this process held and found revoked at a heartbeat; their jobs were cancelled here.",
	})
	m.heartbeatFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fenceq_heartbeat_failures_total",
		Help: "Heartbeat statements that failed (database unreachable or slow).",
	})
	m.idemReplays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_idempotency_replays_total",
		Help: "Requests answered from a stored idempotency key (a retry of a request already placed), by scope.",
	}, []string{"scope"})
	m.idemConflicts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_idempotency_conflicts_total",
		Help: "Idempotency-key insert conflicts, by scope and kind (in_flight: another request holds the key; " +
			"key_reuse: the key came with a different request). Alert on the rate: it is the mechanism firing.",
	}, []string{"scope", "kind"})
	m.outboxDelivered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_outbox_delivered_total",
		Help: "Outbox rows delivered by this process, by topic.",
	}, []string{"topic"})
	m.outboxRetried = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_outbox_delivery_retries_total",
		Help: "Outbox delivery attempts in this process that failed transiently and will be retried, by topic.",
	}, []string{"topic"})
	m.outboxFailed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_outbox_failed_total",
		Help: "Outbox rows this process marked failed (permanent rejection or last attempt), by topic.",
	}, []string{"topic"})
	m.invoicesCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fenceq_invoices_created_total",
		Help: "Invoices written (with their email outbox row) by a fenced commit in this process.",
	})
	m.invoiceDuplicates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_invoice_duplicates_prevented_total",
		Help: "Invoice jobs that found their invoice already written, by how (existing_invoice, unique_constraint).",
	}, []string{"how"})
	m.taxFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fenceq_tax_failures_total",
		Help: "Failed tax service calls of invoice jobs (retried).",
	})
	m.ordersCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fenceq_orders_created_total",
		Help: "Orders placed (committed) by this process.",
	})
	m.periodicEnqueued = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_periodic_enqueued_total",
		Help: "Jobs this process's scheduling passes enqueued for periodic schedules, by schedule name.",
	}, []string{"name"})
	m.reg.MustRegister(m.periodicEnqueued, m.jobsClaimed, m.jobsFinished, m.jobDuration, m.leaseRevocations,
		m.staleWrites, m.expiredHolderAlive, m.leasesLost, m.heartbeatFailures,
		m.idemReplays, m.idemConflicts, m.ordersCreated, m.invoicesCreated, m.invoiceDuplicates, m.taxFailures, m.outboxDelivered, m.outboxRetried, m.outboxFailed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Known label values start at 0, so an alert on increase() sees the first event.
	for _, op := range []string{"commit", "complete", "settle", "release", "with lease"} {
		m.staleWrites.WithLabelValues(op)
	}
	for _, by := range []string{"reaper", "holder"} {
		m.expiredHolderAlive.WithLabelValues(by)
	}
	for _, how := range []string{"existing_invoice", "unique_constraint"} {
		m.invoiceDuplicates.WithLabelValues(how)
	}
	return m
}

// Register adds a collector (such as the one NewDBCollector returns) to the registry.
func (m *Metrics) Register(c prometheus.Collector) error {
	if err := m.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return nil
		}
		return err
	}
	return nil
}

// Registry returns the registry the metrics live in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// JobClaimed implements fenceq.Observer.
func (m *Metrics) JobClaimed(q, kind string) { m.jobsClaimed.WithLabelValues(q, kind).Inc() }

// JobFinished implements fenceq.Observer.
func (m *Metrics) JobFinished(q, kind string, outcome fenceq.Outcome, d time.Duration) {
	m.jobsFinished.WithLabelValues(q, kind, string(outcome)).Inc()
	m.jobDuration.WithLabelValues(q, kind).Observe(d.Seconds())
}

// LeaseRevoked implements fenceq.Observer.
func (m *Metrics) LeaseRevoked(r queue.Revocation) {
	m.leaseRevocations.WithLabelValues(r.Queue, r.Kind).Inc()
	if r.HolderAlive {
		m.expiredHolderAlive.WithLabelValues("reaper").Inc()
	}
}

// LeaseLost implements fenceq.Observer. holderAlive is true only when the holder
// recorded the expired_holder_alive event itself (the reaper had not), so the two
// observers never count one lease twice.
func (m *Metrics) LeaseLost(_ fenceq.Lease, holderAlive bool) {
	m.leasesLost.Inc()
	if holderAlive {
		m.expiredHolderAlive.WithLabelValues("holder").Inc()
	}
}

// StaleWriteRejected implements fenceq.Observer.
func (m *Metrics) StaleWriteRejected(op string, _ fenceq.Lease) {
	m.staleWrites.WithLabelValues(op).Inc()
}

// HeartbeatFailed implements fenceq.Observer.
func (m *Metrics) HeartbeatFailed(error) { m.heartbeatFailures.Inc() }

// PeriodicEnqueued implements fenceq.Observer.
func (m *Metrics) PeriodicEnqueued(name string, n int) {
	m.periodicEnqueued.WithLabelValues(name).Add(float64(n))
}

// Idempotency returns the metrics of the idempotency mechanism, with the method set of
// jobs/order's Metrics interface.
func (m *Metrics) Idempotency() *IdempotencyMetrics { return &IdempotencyMetrics{m: m} }

// Invoices returns the metrics of the invoice handler, with the method set of
// jobs/invoice's Metrics interface.
func (m *Metrics) Invoices() *InvoiceMetrics { return &InvoiceMetrics{m: m} }

// InvoiceMetrics counts what the invoice handler produced and prevented:
// fenceq_invoices_created_total, fenceq_invoice_duplicates_prevented_total,
// and fenceq_tax_failures_total.
type InvoiceMetrics struct{ m *Metrics }

// InvoiceCreated counts an invoice written by a fenced commit.
func (i *InvoiceMetrics) InvoiceCreated() { i.m.invoicesCreated.Inc() }

// DuplicatePrevented counts a job that found its invoice already written.
func (i *InvoiceMetrics) DuplicatePrevented(how string) {
	i.m.invoiceDuplicates.WithLabelValues(how).Inc()
}

// StaleWriteRejected is a no-op: the worker's Observer already counts the rejected
// commit in fenceq_stale_writes_rejected_total{op="commit"}.
func (i *InvoiceMetrics) StaleWriteRejected() {}

// TaxFailed counts a failed tax call.
func (i *InvoiceMetrics) TaxFailed() { i.m.taxFailures.Inc() }

// Outbox returns the metrics of the outbox relay, with the method set of jobs/email's
// Metrics interface.
func (m *Metrics) Outbox() *OutboxMetrics { return &OutboxMetrics{m: m} }

// IdempotencyMetrics counts idempotent placements: fenceq_orders_created_total,
// fenceq_idempotency_replays_total and fenceq_idempotency_conflicts_total.
type IdempotencyMetrics struct{ m *Metrics }

// Created counts an order placed by this process.
func (i *IdempotencyMetrics) Created() { i.m.ordersCreated.Inc() }

// Replay counts a request answered from a stored idempotency key.
func (i *IdempotencyMetrics) Replay(scope string) { i.m.idemReplays.WithLabelValues(scope).Inc() }

// Conflict counts a key reused with a different request.
func (i *IdempotencyMetrics) Conflict(scope string) {
	i.m.idemConflicts.WithLabelValues(scope, "key_reuse").Inc()
}

// InflightWait counts a request that found its key held by a request still in flight.
func (i *IdempotencyMetrics) InflightWait(scope string) {
	i.m.idemConflicts.WithLabelValues(scope, "in_flight").Inc()
}

// OutboxMetrics counts outbox deliveries: fenceq_outbox_delivered_total,
// fenceq_outbox_delivery_retries_total and fenceq_outbox_failed_total.
type OutboxMetrics struct{ m *Metrics }

// Delivered counts a row sent and marked delivered.
func (o *OutboxMetrics) Delivered(topic string) { o.m.outboxDelivered.WithLabelValues(topic).Inc() }

// Retried counts a failed attempt that will be tried again.
func (o *OutboxMetrics) Retried(topic string) { o.m.outboxRetried.WithLabelValues(topic).Inc() }

// Failed counts a row marked failed (permanent rejection or last attempt).
func (o *OutboxMetrics) Failed(topic string) { o.m.outboxFailed.WithLabelValues(topic).Inc() }
