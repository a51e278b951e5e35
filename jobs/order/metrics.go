package order

import (
	"sync/atomic"

	"github.com/fenceq/fenceq/idempotency"
)

// Metrics counts placed orders and what the idempotency mechanism decided for them
// (replays, conflicts such as HTTP 422, in-flight waits such as HTTP 409), so that
// operators can alert on the mechanism firing rather than on its symptoms. Every method
// must be safe for concurrent use and fast; it is called on the request path.
type Metrics interface {
	idempotency.Metrics
	// Created counts an order placed (committed) by this process.
	Created()
}

// NopMetrics counts nothing; it is the default.
type NopMetrics struct{}

// Created implements Metrics.
func (NopMetrics) Created() {}

// Replay implements Metrics.
func (NopMetrics) Replay(string) {}

// Conflict implements Metrics.
func (NopMetrics) Conflict(string) {}

// InflightWait implements Metrics.
func (NopMetrics) InflightWait(string) {}

// Counters is a Metrics that keeps totals in memory (all scopes together), for tests
// and command-line summaries.
type Counters struct {
	created, replays, conflicts, inflightWaits atomic.Int64
}

// CounterValues is a snapshot of Counters.
type CounterValues struct {
	Created       int64 `json:"created"`
	Replays       int64 `json:"replays"`
	Conflicts     int64 `json:"conflicts"`
	InflightWaits int64 `json:"inflight_waits"`
}

// Created implements Metrics.
func (c *Counters) Created() { c.created.Add(1) }

// Replay implements Metrics.
func (c *Counters) Replay(string) { c.replays.Add(1) }

// Conflict implements Metrics.
func (c *Counters) Conflict(string) { c.conflicts.Add(1) }

// InflightWait implements Metrics.
func (c *Counters) InflightWait(string) { c.inflightWaits.Add(1) }

// Values returns the current totals.
func (c *Counters) Values() CounterValues {
	return CounterValues{Created: c.created.Load(), Replays: c.replays.Load(),
		Conflicts: c.conflicts.Load(), InflightWaits: c.inflightWaits.Load()}
}

var (
	_ Metrics = NopMetrics{}
	_ Metrics = (*Counters)(nil)
)
