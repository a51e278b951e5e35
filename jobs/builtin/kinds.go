package builtin

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"slices"

	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/jobs/housekeeping"
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// Kind describes one built-in job kind: where its jobs go and which args it accepts.
type Kind struct {
	// Name is the job kind, e.g. "invoice".
	Name string
	// Queue is the queue its jobs go to unless the enqueuer names another.
	Queue string
	// Description says in a few words what one job of the kind does.
	Description string
	// Recurring is true for a kind a periodic schedule of the worker enqueues, so that
	// a new job of it may be unfinished at any time.
	Recurring bool

	validate func(args []byte) error
}

// ValidateArgs checks the encoded args of a job of the kind before it is enqueued: they
// must decode into the kind's args type without unknown fields and pass its checks. A
// kind without args checks (noop) accepts any JSON object.
func (k Kind) ValidateArgs(args []byte) error {
	if k.validate == nil {
		return nil
	}
	return k.validate(args)
}

// kinds is the one table of the built-in kinds; Kinds and LookupKind copy from it.
func kinds() map[string]Kind {
	return map[string]Kind{
		diag.NoopKind: {Queue: queue.DefaultQueue, Description: "completes at once"},
		diag.SleepKind: {Queue: queue.DefaultQueue, Description: `sleeps, e.g. {"duration": "5s"}`,
			validate: diag.ValidateSleep},
		diag.WaitKind: {Queue: queue.DefaultQueue, Description: `waits for a signal, e.g. {"signal": "go", "timeout": "1m"}`,
			validate: diag.ValidateWait},
		outbox.DeliverKind: {Queue: outbox.Queue, Description: "delivers one outbox row (email)",
			validate: validateDeliver},
		order.PlaceKind: {Queue: queue.DefaultQueue, Description: "places an order once per idempotency key",
			validate: validatePlace},
		invoice.Kind: {Queue: invoice.Queue, Description: "writes one customer's invoice for a period",
			validate: validateInvoice},
		housekeeping.IdempotencyKind: {Queue: queue.DefaultQueue, Description: "deletes expired idempotency keys (a periodic schedule)",
			Recurring: true, validate: validateEmpty},
	}
}

// Kinds returns the built-in kinds, sorted by name: what Register runs.
func Kinds() []Kind {
	table := kinds()
	out := make([]Kind, 0, len(table))
	for _, name := range slices.Sorted(maps.Keys(table)) {
		k := table[name]
		k.Name = name
		out = append(out, k)
	}
	return out
}

// LookupKind returns the built-in kind called name.
func LookupKind(name string) (Kind, bool) {
	k, ok := kinds()[name]
	k.Name = name
	return k, ok
}

// KindNames returns the names of the built-in kinds, sorted.
func KindNames() []string { return slices.Sorted(maps.Keys(kinds())) }

// Queues returns the queues the built-in kinds use, sorted: what a worker running them
// all must serve.
func Queues() []string {
	set := map[string]bool{}
	for _, k := range kinds() {
		set[k.Queue] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// RecurringKinds returns the names of the recurring built-in kinds, sorted: the kinds
// a check that every job finished must leave out.
func RecurringKinds() []string {
	var out []string
	for _, k := range Kinds() {
		if k.Recurring {
			out = append(out, k.Name)
		}
	}
	return out
}

func validateInvoice(raw []byte) error {
	var a invoice.Args
	if err := decodeStrict(raw, &a); err != nil {
		return err
	}
	return a.Validate()
}

func validatePlace(raw []byte) error {
	var a order.PlaceArgs
	if err := decodeStrict(raw, &a); err != nil {
		return err
	}
	if a.IdempotencyKey == "" {
		return errors.New("idempotency_key is required")
	}
	return a.Request.Validate()
}

func validateDeliver(raw []byte) error {
	var a outbox.DeliverArgs
	if err := decodeStrict(raw, &a); err != nil {
		return err
	}
	if a.OutboxID <= 0 {
		return errors.New("outbox_id must be a positive outbox row id")
	}
	return nil
}

func validateEmpty(raw []byte) error {
	var a struct{}
	return decodeStrict(raw, &a)
}

// decodeStrict decodes raw into v, rejecting fields v does not have.
func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
