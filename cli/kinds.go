package cli

import (
	"maps"
	"slices"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/queue"
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
		diag.NoopKind:           {queue: queue.DefaultQueue, desc: "completes at once"},
		diag.SleepKind:          {queue: queue.DefaultQueue, desc: `sleeps, e.g. {"duration": "5s"}`, validate: diag.ValidateSleep},
		queue.OutboxDeliverKind: {queue: queue.OutboxQueue, desc: "delivers one outbox row (email)"},
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
func periodicKinds() []string { return []string{} }

// businessFlags configure the built-in business kinds in worker, serve and billing.
func businessFlags() []ucli.Flag { return nil }

// registerBuiltins adds every built-in kind's handler. The returned func releases what
// the handlers hold (a mailer's file, …).
func registerBuiltins(c *ucli.Context, hs *fenceq.Handlers, d builtinDeps) (func(), error) {
	diag.Register(hs)
	return func() {}, nil
}
