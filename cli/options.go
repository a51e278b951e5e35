package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/migrations"
	"github.com/fenceq/fenceq/queue"
)

// Options configure the command tree New builds. Every field is optional: the zero
// value gives a command for fenceq's core tables alone, whose worker runs no kinds.
type Options struct {
	// Name is the program's name in help, in error lines ("NAME: …") and in advice
	// such as "run `NAME migrate up`". Default "fenceq".
	Name string
	// Usage is the one-line description atop the help. Default: "runs and administers
	// the fenceq jobs of this application".
	Usage string
	// Description is the help's longer text. Default: a paragraph on --database-url
	// and --json.
	Description string

	// Handlers are the kinds `worker` runs. The admin commands (enqueue, periodic add)
	// accept their kinds. Default: none; WorkerSetup may add handlers at run time.
	Handlers *fenceq.Handlers
	// Kinds describe kinds further for the admin commands: the queue a job goes to
	// unless --queue names another, and a check of its args. A kind listed here need
	// not be in Handlers (another binary may run it); a kind in Handlers need not be
	// listed (its jobs go to the default queue, any JSON object as args). Default: none.
	Kinds []Kind

	// Migrations are the application's migration sets, in the order they apply after
	// fenceq's core set (which always comes first and must not be listed): plain
	// `migrate up` installs them, and `worker` applies what is pending at start.
	// Default: none.
	Migrations []migrations.Set
	// OptionalMigrations are sets the binary knows but installs only when named:
	// `migrate up --set NAME`. Until then `migrate status` shows them as not
	// installed. Default: none.
	OptionalMigrations []migrations.Set

	// Queues are the queues `worker` serves when --queues is not given. Default: the
	// queues of Kinds and the default queue, sorted.
	Queues []string
	// Periodic are schedules `worker` defines (fenceq.Config.Periodic), unless
	// --no-periodic. Default: none.
	Periodic []*fenceq.PeriodicJob
	// Configure edits the worker's Config once the flags are read and WorkerSetup ran,
	// just before the worker is built: the place for hooks, middleware, per-queue
	// settings or anything else the flags do not cover. Default: nil.
	Configure func(*fenceq.Config)
	// WorkerFlags are extra flags of `worker`, for WorkerSetup to read. Default: none.
	WorkerFlags []ucli.Flag
	// WorkerSetup run in order in `worker`, once the database is open and migrated and
	// before the worker is built: each may register handlers whose dependencies need
	// the pool or the flags (fenceq.AddHandler, fenceq.AddRawHandler on env.Handlers),
	// add schedules and metrics, and register cleanups. An error stops the worker
	// before it starts. Default: none.
	WorkerSetup []func(env *WorkerEnv) error
	// RecurringKinds are kinds whose jobs may stay unfinished at any time (a periodic
	// schedule enqueues them): `verify --all-final` leaves them out. Default: none.
	RecurringKinds []string

	// Extra are more commands, listed after the standard ones. Default: none.
	Extra []*ucli.Command

	// Stdout receives the commands' output. Default os.Stdout.
	Stdout io.Writer
	// Stderr receives logs and error lines. Default os.Stderr.
	Stderr io.Writer
}

// Kind describes a job kind to the admin commands.
type Kind struct {
	// Name is the job kind, e.g. "app.greet". Required.
	Name string
	// Queue is where `enqueue` and `periodic add` put its jobs unless --queue names
	// another. Default: the default queue.
	Queue string
	// Description says in a few words what one job does, for help texts. Optional.
	Description string
	// ValidateArgs checks a job's JSON args before it is enqueued; the error is shown
	// to the user. Default: any JSON object is accepted.
	ValidateArgs func(args []byte) error
}

// WorkerEnv is what a WorkerSetup function gets: the started command and what the
// worker is being built from. Changes to Handlers, Config and Periodic take effect.
type WorkerEnv struct {
	// Context is the command's context: flags (c.String("...")) and c.Context.
	Context *ucli.Context
	// Pool is the worker's database pool, migrated.
	Pool *pgxpool.Pool
	// Logger is the command's logger.
	Logger *slog.Logger
	// Handlers are the worker's handlers: Options.Handlers itself, or a fresh set when
	// that is nil.
	Handlers *fenceq.Handlers
	// Config is the worker's configuration so far.
	Config *fenceq.Config
	// Registry serves --metrics-addr's /metrics; Metrics (the worker's hook) is
	// registered in it.
	Registry *prometheus.Registry
	// Metrics are the worker's fenceq metrics.
	Metrics *fenceqprom.Metrics

	starts   []func()
	cleanups []func()
}

// OnStart registers fn to run once the worker is built from a valid Config, just
// before it starts: the place to log what a setup configured, so that a bad command
// line ends with its error alone.
func (e *WorkerEnv) OnStart(fn func()) { e.starts = append(e.starts, fn) }

// OnStop registers fn to run when the worker command returns, after the worker stopped;
// cleanups run in the reverse order of registration.
func (e *WorkerEnv) OnStop(fn func()) { e.cleanups = append(e.cleanups, fn) }

func (o Options) withDefaults() Options {
	if o.Name == "" {
		o.Name = "fenceq"
	}
	if o.Usage == "" {
		o.Usage = "runs and administers the fenceq jobs of this application"
	}
	if o.Description == "" {
		o.Description = "Every command that talks to the database takes --database-url (env DATABASE_URL,\n" +
			"default " + DefaultDatabaseURL + ", the local server).\n" +
			"Listing and report commands take --json for machine-readable output."
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if len(o.Queues) == 0 {
		set := map[string]bool{queue.DefaultQueue: true}
		for _, k := range o.Kinds {
			if k.Queue != "" {
				set[k.Queue] = true
			}
		}
		o.Queues = slices.Sorted(maps.Keys(set))
	}
	return o
}

// sets returns every migration set the binary knows: the core, Migrations, then
// OptionalMigrations.
func (e *env) sets() []migrations.Set {
	return slices.Concat([]migrations.Set{migrations.Core()}, e.opts.Migrations, e.opts.OptionalMigrations)
}

// defaultSets returns the sets plain `migrate up` installs: the core and Migrations.
func (e *env) defaultSets() []migrations.Set {
	return slices.Concat([]migrations.Set{migrations.Core()}, e.opts.Migrations)
}

func (e *env) setNames() []string {
	var out []string
	for _, s := range e.sets() {
		out = append(out, s.Name)
	}
	return out
}

// optional reports whether the set called name is installed only when named.
func (e *env) optional(name string) bool {
	return slices.ContainsFunc(e.opts.OptionalMigrations, func(s migrations.Set) bool { return s.Name == name })
}

// lookupKind returns what the binary knows of kind: from Kinds, else from Handlers.
func (e *env) lookupKind(kind string) (Kind, bool) {
	for _, k := range e.opts.Kinds {
		if k.Name == kind {
			if k.Queue == "" {
				k.Queue = queue.DefaultQueue
			}
			return k, true
		}
	}
	if e.opts.Handlers != nil && slices.Contains(e.opts.Handlers.Kinds(), kind) {
		return Kind{Name: kind, Queue: queue.DefaultQueue}, true
	}
	return Kind{}, false
}

// kindNames returns the kinds the binary knows, sorted.
func (e *env) kindNames() []string {
	set := map[string]bool{}
	for _, k := range e.opts.Kinds {
		set[k.Name] = true
	}
	if e.opts.Handlers != nil {
		for _, k := range e.opts.Handlers.Kinds() {
			set[k] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// liveKinds returns the kinds that live workers (heartbeat within
// queue.DefaultLiveWithin) registered in fenceq_workers, sorted.
func liveKinds(ctx context.Context, db queue.DBTX) ([]string, error) {
	ws, err := fenceq.ListWorkers(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("list the live workers' kinds: %w", err)
	}
	set := map[string]bool{}
	for _, w := range ws {
		if w.HeartbeatAge <= queue.DefaultLiveWithin {
			for _, k := range w.Kinds {
				set[k] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// checkKind decides whether an admin command accepts kind: the binary knows it, a
// live worker registers it, or allowUnknown. flag prefixes the error ("--kind: ").
// The known Kind is returned with ok; the pool is only read when the binary does not
// know the kind.
func (e *env) checkKind(ctx context.Context, pool *pgxpool.Pool, kind, flag string, allowUnknown bool) (Kind, bool, error) {
	if k, ok := e.lookupKind(kind); ok {
		return k, true, nil
	}
	if allowUnknown {
		return Kind{Name: kind, Queue: queue.DefaultQueue}, false, nil
	}
	live, err := liveKinds(ctx, pool)
	if err != nil {
		return Kind{}, false, err
	}
	if slices.Contains(live, kind) {
		return Kind{Name: kind, Queue: queue.DefaultQueue}, false, nil
	}
	return Kind{}, false, e.unknownKind(kind, flag, "live workers run "+listOrNone(live))
}

// unknownKind is the usage error of a kind neither the binary nor a live worker
// knows; live names the live workers' kinds, or says why they could not be read.
func (e *env) unknownKind(kind, flag, live string) error {
	return usageError{Err: fmt.Errorf("%sunknown kind %q: this binary knows %s; %s "+
		"(or pass --allow-unknown-kind)", flag, kind, listOrNone(e.kindNames()), live)}
}

// openForKind opens the admin command's database; when that fails for a kind the
// binary does not know, the error is the unknown kind's, saying why the live workers'
// kinds could not be read.
func (e *env) openForKind(c *ucli.Context, known bool, kind, flag string) (*pgxpool.Pool, error) {
	pool, err := openSchema(c, 2)
	if err != nil && !known && !c.Bool("allow-unknown-kind") {
		return nil, e.unknownKind(kind, flag, fmt.Sprintf("the live workers' kinds could not be read (%v)", err))
	}
	return pool, err
}

// listOrNone joins names with commas, or says none.
func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
