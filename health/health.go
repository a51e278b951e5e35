// Package health evaluates fenceq's alert conditions: the checks behind `fenceq health`
// and the dashboard's alerts, importable by applications that want them in their own
// health endpoint.
//
// The conditions, each against a bound of Thresholds:
//
//   - a lease expired while its holder process was still alive (expired_holder_alive
//     events within Window): a worker paused or stuck past its lease;
//   - a stale write was rejected (stale_write_rejected events within Window): the fence
//     stopped a holder whose lease had been revoked;
//   - the oldest pending outbox row has waited longer than MaxOutboxAge;
//   - a transaction has been open longer than MaxTransactionAge: it holds back vacuum;
//   - a periodic schedule's next slot has been due longer than MaxPeriodicLag without
//     its job: no worker runs scheduling passes, or they fail.
//
// Every age is measured by the database's clock.
package health

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// Default thresholds.
const (
	DefaultWindow            = 5 * time.Minute
	DefaultMaxOutboxAge      = 5 * time.Minute
	DefaultMaxTransactionAge = 5 * time.Minute
	DefaultMaxPeriodicLag    = time.Minute
)

// Thresholds bound the alert conditions.
type Thresholds struct {
	// Window is how far back lease events count. Defaults to DefaultWindow.
	Window time.Duration `json:"window"`
	// MaxOutboxAge is how long the oldest pending outbox row may wait. Defaults to
	// DefaultMaxOutboxAge.
	MaxOutboxAge time.Duration `json:"max_outbox_age"`
	// MaxTransactionAge is how long a transaction may be open. Defaults to
	// DefaultMaxTransactionAge.
	MaxTransactionAge time.Duration `json:"max_transaction_age"`
	// MaxPeriodicLag is how long a periodic schedule's next slot may be due without its
	// job. Defaults to DefaultMaxPeriodicLag.
	MaxPeriodicLag time.Duration `json:"max_periodic_lag"`
}

// WithDefaults returns t with every zero field set to its default.
func (t Thresholds) WithDefaults() Thresholds {
	if t.Window == 0 {
		t.Window = DefaultWindow
	}
	if t.MaxOutboxAge == 0 {
		t.MaxOutboxAge = DefaultMaxOutboxAge
	}
	if t.MaxTransactionAge == 0 {
		t.MaxTransactionAge = DefaultMaxTransactionAge
	}
	if t.MaxPeriodicLag == 0 {
		t.MaxPeriodicLag = DefaultMaxPeriodicLag
	}
	return t
}

// Validate reports the first threshold that is not positive once defaults apply; the
// error names the field and matches queue.ErrInvalid.
func (t Thresholds) Validate() error {
	t = t.WithDefaults()
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"window", t.Window}, {"max_outbox_age", t.MaxOutboxAge}, {"max_transaction_age", t.MaxTransactionAge},
		{"max_periodic_lag", t.MaxPeriodicLag}} {
		if f.d <= 0 {
			return &queue.ValidationError{Field: f.name, Reason: fmt.Sprintf("%s must be positive", f.d)}
		}
	}
	return nil
}

// Kind names a condition, for code that reacts to one of them.
type Kind string

// The conditions.
const (
	ExpiredHolderAlive Kind = "expired_holder_alive"
	StaleWriteRejected Kind = "stale_write_rejected"
	OutboxAge          Kind = "outbox_age"
	TransactionAge     Kind = "transaction_age"
	PeriodicLag        Kind = "periodic_lag"
)

// Condition is one alert condition and whether it holds.
type Condition struct {
	Kind Kind `json:"kind"`
	// Name, Value and Bound are for people: what is checked, what was found, and what
	// is healthy.
	Name  string `json:"name"`
	Value string `json:"value"`
	Bound string `json:"bound"`
	Alert bool   `json:"alert"`
}

// Report is the outcome of Check.
type Report struct {
	Conditions []Condition `json:"conditions"`
	// Alerts counts the conditions that hold.
	Alerts  int  `json:"alerts"`
	Healthy bool `json:"healthy"`
	// LeaseEvents counts every lease event kind within the window.
	LeaseEvents map[queue.LeaseEventKind]int64 `json:"lease_events"`
	// Outbox is the outbox backlog.
	Outbox outbox.Backlog `json:"outbox"`
	// Activity is the database's oldest open transaction.
	Activity queue.Activity `json:"activity"`
	// MostLagging is the periodic schedule whose next slot has been due longest; nil
	// when none is due.
	MostLagging *fenceq.PeriodicInfo `json:"most_lagging_schedule,omitempty"`
	// Thresholds are the bounds checked, defaults applied.
	Thresholds Thresholds `json:"thresholds"`
}

// Check evaluates every condition. Its reads use indexes only (lease events by time,
// pending outbox rows) and pg_stat_activity, so it is cheap however many jobs exist.
func Check(ctx context.Context, db queue.DBTX, t Thresholds) (*Report, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	t = t.WithDefaults()
	events, err := fenceq.CountLeaseEvents(ctx, db, t.Window)
	if err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	backlog, err := outbox.Stats(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	act, err := fenceq.ReadActivity(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	schedules, err := fenceq.ListPeriodic(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	var lagging *fenceq.PeriodicInfo
	for i := range schedules {
		if s := &schedules[i]; s.Lag > 0 && (lagging == nil || s.Lag > lagging.Lag) {
			lagging = s
		}
	}
	lagValue, lag := "none due", time.Duration(0)
	if lagging != nil {
		lag = lagging.Lag
		lagValue = fmt.Sprintf("%s (%s)", Age(lag), lagging.Name)
	}
	within := "0 in the last " + Age(t.Window)
	alive, stale := events[queue.EventExpiredHolderAlive], events[queue.EventStaleWriteRejected]
	conds := []Condition{
		{Kind: ExpiredHolderAlive, Name: "leases expired while the holder lived",
			Value: strconv.FormatInt(alive, 10), Bound: within, Alert: alive > 0},
		{Kind: StaleWriteRejected, Name: "stale writes rejected",
			Value: strconv.FormatInt(stale, 10), Bound: within, Alert: stale > 0},
		{Kind: OutboxAge, Name: "oldest pending outbox row",
			Value: fmt.Sprintf("%s (%d pending)", Age(backlog.OldestPendingAge), backlog.Pending),
			Bound: "≤ " + Age(t.MaxOutboxAge), Alert: backlog.OldestPendingAge > t.MaxOutboxAge},
		{Kind: TransactionAge, Name: "oldest open transaction", Value: Age(act.OldestTransactionAge),
			Bound: "≤ " + Age(t.MaxTransactionAge), Alert: act.OldestTransactionAge > t.MaxTransactionAge},
		{Kind: PeriodicLag, Name: "periodic schedule most behind", Value: lagValue,
			Bound: "≤ " + Age(t.MaxPeriodicLag), Alert: lag > t.MaxPeriodicLag},
	}
	rep := &Report{Conditions: conds, Healthy: true, LeaseEvents: events, Outbox: backlog, Activity: act,
		MostLagging: lagging, Thresholds: t}
	for _, c := range conds {
		if c.Alert {
			rep.Alerts++
			rep.Healthy = false
		}
	}
	return rep, nil
}

// Age formats a duration for people, to the precision that matters at its size:
// 850ms, 4.2s, 3m12s, 5h4m (whole minutes and hours without their zeros: 5m, 1h).
func Age(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + Age(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return trimZeros(d.Round(time.Second).String())
	default:
		return trimZeros(d.Round(time.Minute).String())
	}
}

// trimZeros turns 5m0s into 5m and 1h0m0s into 1h.
func trimZeros(s string) string {
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
