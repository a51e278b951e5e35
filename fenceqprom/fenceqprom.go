// Package fenceqprom exposes fenceq's mechanism to Prometheus: Metrics, a
// fenceq hook that counts what workers see (claims, outcomes, revocations, stale
// writes the database rejected, leases that expired while their holder lived, lost
// leases, heartbeat failures), with the counters of the outbox relay (outbox.Metrics),
// of the idempotency mechanism (idempotency.Metrics) and of the responses of HTTP
// kinds (fenceqhttp.Metrics); and DBCollector, which reads the database at scrape
// time (queue depth, outbox backlog and its oldest age, the oldest open transaction).
//
// Every name starts with fenceq_. The counters are per process; the database gauges are
// the same from every process that scrapes one database. Business counters (invoices,
// orders) belong to the packages that produce them and register in the same registry.
//
//	reg := prometheus.NewRegistry()
//	m, err := fenceqprom.New(reg)
//	…
//	reg.MustRegister(fenceqprom.NewDBCollector(pool, 5*time.Second, logger))
//	w, err := fenceq.NewWorker(pool, fenceq.Config{Handlers: hs, Hooks: []fenceq.Hook{m}})
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
package fenceqprom

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqhttp"
	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// Metrics holds fenceq's Prometheus counters. It is a fenceq.Hook of every worker event:
// pass it in Config.Hooks. Outbox and Idempotency return the counters of those mechanisms. Its
// methods are safe for concurrent use.
type Metrics struct {
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
	outboxDelivered    *prometheus.CounterVec
	outboxRetried      *prometheus.CounterVec
	outboxFailed       *prometheus.CounterVec
	periodicEnqueued   *prometheus.CounterVec
	periodicSkipped    *prometheus.CounterVec
	httpResponses      *prometheus.CounterVec
}

var (
	_ fenceq.JobStartedHook         = (*Metrics)(nil)
	_ fenceq.JobFinishedHook        = (*Metrics)(nil)
	_ fenceq.LeaseRevokedHook       = (*Metrics)(nil)
	_ fenceq.LeaseLostHook          = (*Metrics)(nil)
	_ fenceq.StaleWriteRejectedHook = (*Metrics)(nil)
	_ fenceq.HeartbeatFailedHook    = (*Metrics)(nil)
)

// staleWriteOps are the operations the worker reports to the StaleWriteRejected hook.
// They start at 0, so that an alert on increase() sees the first rejection.
var staleWriteOps = []string{"commit", "complete", "settle", "release", "with lease"}

// Who sees that a lease expired while its holder lived: the reaper that revoked it,
// or the holder whose heartbeat found it gone.
const (
	seenByReaper = "reaper"
	seenByHolder = "holder"
)

// Kinds of idempotency conflicts.
const (
	conflictInFlight = "in_flight"
	conflictKeyReuse = "key_reuse"
)

// New returns fenceq's metrics, registered in reg. It fails when reg is nil or one of
// the metrics is registered there already; then none of them stays registered.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("fenceqprom: new metrics: registerer is nil")
	}
	m := &Metrics{}
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
	m.periodicEnqueued = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_periodic_enqueued_total",
		Help: "Jobs this process's scheduling passes enqueued for periodic schedules, by schedule name.",
	}, []string{"name"})
	m.periodicSkipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_periodic_skipped_total",
		Help: "Slots of periodic schedules this process's scheduling passes skipped because a job of the schedule was unfinished (no overlap), by schedule name.",
	}, []string{"name"})
	m.httpResponses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fenceq_http_responses_total",
		Help: "Responses of the endpoints that run HTTP kinds (fenceqhttp), by kind and status class " +
			"(2xx, 3xx, 4xx, 5xx, or error when no response came).",
	}, []string{"kind", "class"})
	if err := registerAll(reg, m.jobsClaimed, m.jobsFinished, m.jobDuration, m.leaseRevocations,
		m.staleWrites, m.expiredHolderAlive, m.leasesLost, m.heartbeatFailures, m.idemReplays,
		m.idemConflicts, m.outboxDelivered, m.outboxRetried, m.outboxFailed, m.periodicEnqueued,
		m.periodicSkipped, m.httpResponses); err != nil {
		return nil, fmt.Errorf("fenceqprom: new metrics: %w", err)
	}
	for _, op := range staleWriteOps {
		m.staleWrites.WithLabelValues(op)
	}
	for _, by := range []string{seenByReaper, seenByHolder} {
		m.expiredHolderAlive.WithLabelValues(by)
	}
	return m, nil
}

// registerAll registers every collector in reg, or none: when one fails, those
// registered before it are unregistered again, and the error names the one that failed.
func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return fmt.Errorf("register %s: %w", describe(c), err)
		}
	}
	return nil
}

// describe names a collector by the first metric it describes, for errors.
func describe(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	name := "collector"
	if d, ok := <-ch; ok {
		name = d.String()
	}
	for range ch { // let Describe finish
	}
	return name
}

// JobStarted implements fenceq.JobStartedHook: it counts the claim.
func (m *Metrics) JobStarted(_ context.Context, job *queue.JobRow) {
	m.jobsClaimed.WithLabelValues(job.Queue, job.Kind).Inc()
}

// JobFinished implements fenceq.JobFinishedHook.
func (m *Metrics) JobFinished(_ context.Context, job *queue.JobRow, res fenceq.AttemptResult) {
	m.jobsFinished.WithLabelValues(job.Queue, job.Kind, string(res.Outcome)).Inc()
	m.jobDuration.WithLabelValues(job.Queue, job.Kind).Observe(res.Duration.Seconds())
}

// LeaseRevoked implements fenceq.LeaseRevokedHook.
func (m *Metrics) LeaseRevoked(_ context.Context, r queue.Revocation) {
	m.leaseRevocations.WithLabelValues(r.Queue, r.Kind).Inc()
	if r.HolderAlive {
		m.expiredHolderAlive.WithLabelValues(seenByReaper).Inc()
	}
}

// LeaseLost implements fenceq.LeaseLostHook. holderAlive is true only when the holder
// recorded the expired_holder_alive event itself (the reaper had not), so the two
// hooks never count one lease twice.
func (m *Metrics) LeaseLost(_ context.Context, _ *queue.JobRow, holderAlive bool) {
	m.leasesLost.Inc()
	if holderAlive {
		m.expiredHolderAlive.WithLabelValues(seenByHolder).Inc()
	}
}

// StaleWriteRejected implements fenceq.StaleWriteRejectedHook.
func (m *Metrics) StaleWriteRejected(_ context.Context, _ *queue.JobRow, op string) {
	m.staleWrites.WithLabelValues(op).Inc()
}

// HeartbeatFailed implements fenceq.HeartbeatFailedHook.
func (m *Metrics) HeartbeatFailed(context.Context, error) { m.heartbeatFailures.Inc() }

// PeriodicEnqueued implements fenceq.PeriodicEnqueuedHook.
func (m *Metrics) PeriodicEnqueued(_ context.Context, name string, n int) {
	m.periodicEnqueued.WithLabelValues(name).Add(float64(n))
}

// PeriodicSkipped implements fenceq.PeriodicSkippedHook.
func (m *Metrics) PeriodicSkipped(_ context.Context, name string, n int) {
	m.periodicSkipped.WithLabelValues(name).Add(float64(n))
}

// Outbox returns the counters of the outbox relay, for outbox.RelayConfig.Metrics:
// fenceq_outbox_delivered_total, fenceq_outbox_delivery_retries_total and
// fenceq_outbox_failed_total.
func (m *Metrics) Outbox() *OutboxMetrics { return &OutboxMetrics{m: m} }

// Idempotency returns the counters of the idempotency mechanism, for
// idempotency.Scope.Metrics: fenceq_idempotency_replays_total and
// fenceq_idempotency_conflicts_total.
func (m *Metrics) Idempotency() *IdempotencyMetrics { return &IdempotencyMetrics{m: m} }

// HTTP returns the counter of the responses of HTTP kinds, for fenceqhttp.Endpoint.Metrics:
// fenceq_http_responses_total.
func (m *Metrics) HTTP() *HTTPMetrics { return &HTTPMetrics{m: m} }

// HTTPMetrics counts the responses of the endpoints that run HTTP kinds, by kind and
// status class. It implements fenceqhttp.Metrics.
type HTTPMetrics struct{ m *Metrics }

var _ fenceqhttp.Metrics = (*HTTPMetrics)(nil)

// Response counts one response of kind's endpoint by its status class; status 0 (no
// response: a connection error, a timeout) counts as class "error".
func (h *HTTPMetrics) Response(kind string, status int) {
	class := "error"
	if status >= 100 && status < 600 {
		class = strconv.Itoa(status/100) + "xx"
	}
	h.m.httpResponses.WithLabelValues(kind, class).Inc()
}

// OutboxMetrics counts outbox deliveries by topic. It implements outbox.Metrics.
type OutboxMetrics struct{ m *Metrics }

var _ outbox.Metrics = (*OutboxMetrics)(nil)

// Delivered counts a row sent and marked delivered.
func (o *OutboxMetrics) Delivered(topic string) { o.m.outboxDelivered.WithLabelValues(topic).Inc() }

// Retried counts a failed attempt that will be tried again.
func (o *OutboxMetrics) Retried(topic string) { o.m.outboxRetried.WithLabelValues(topic).Inc() }

// Failed counts a row marked failed (permanent rejection or last attempt).
func (o *OutboxMetrics) Failed(topic string) { o.m.outboxFailed.WithLabelValues(topic).Inc() }

// IdempotencyMetrics counts what the idempotency mechanism decided, by scope. It
// implements idempotency.Metrics.
type IdempotencyMetrics struct{ m *Metrics }

var _ idempotency.Metrics = (*IdempotencyMetrics)(nil)

// Replay counts a request answered from a stored idempotency key.
func (i *IdempotencyMetrics) Replay(scope string) { i.m.idemReplays.WithLabelValues(scope).Inc() }

// Conflict counts a key reused with a different request.
func (i *IdempotencyMetrics) Conflict(scope string) {
	i.m.idemConflicts.WithLabelValues(scope, conflictKeyReuse).Inc()
}

// InflightWait counts a request that found its key held by a request still in flight.
func (i *IdempotencyMetrics) InflightWait(scope string) {
	i.m.idemConflicts.WithLabelValues(scope, conflictInFlight).Inc()
}
