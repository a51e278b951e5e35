// Package cli is the fenceq command tree as a library: New builds it over an
// application's own handlers, migration sets and defaults, so that an application's
// main of a few lines gives its team worker, migrate, enqueue, jobs, queues, periodic,
// flow, workers, outbox, stats, verify, health, ui and version for its own kinds. The stock
// fenceq binary is the same tree with the built-in jobs and a few commands of its own
// (demo, bench, chaos, serve, billing).
//
// Run is the entry point; tests call it in-process with their own writers (Options.Stdout
// and Options.Stderr) to read the output and the exit status.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
)

// cliActor names the CLI's operator actions in the audit trail: "cli:" and the OS
// user, or "cli" when the user cannot be told.
func cliActor() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "cli:" + u.Username
	}
	return "cli"
}

// DefaultDatabaseURL is the database used when neither --database-url nor DATABASE_URL
// is given: the local server.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Exit statuses.
const (
	ExitOK    = 0
	ExitError = 1 // an error, a failed check (verify) or an alert (health)
	ExitUsage = 2 // bad command line
)

// envKey is where New keeps the command tree's settings in the app's Metadata.
const envKey = "fenceq.cli"

// env is what the commands of one command tree know: its Options, with defaults.
type env struct {
	opts Options
}

// envOf returns the settings of the command tree c runs in.
func envOf(c *ucli.Context) *env {
	if e, ok := c.App.Metadata[envKey].(*env); ok {
		return e
	}
	return &env{opts: Options{}.withDefaults()}
}

// New returns the command tree of an application's fenceq jobs: worker, migrate,
// enqueue, jobs, queues, periodic, flow, workers, outbox, stats, verify, health, ui
// and version, for the kinds, migration sets and defaults opts gives, followed by
// opts.Extra. Run it with Run; errors are returned from its RunContext, never printed
// or turned into os.Exit.
func New(opts Options) *ucli.App {
	opts = opts.withDefaults()
	e := &env{opts: opts}
	cmds := []*ucli.Command{
		withReportFlags(migrateCommand(e)),
		workerCommand(e),
		withReportFlags(enqueueCommand(e)),
		withReportFlags(jobsCommand()),
		withReportFlags(workflowsCommand()),
		withReportFlags(queuesCommand()),
		withReportFlags(periodicCommand()),
		withReportFlags(flowCommand()),
		withReportFlags(workersCommand()),
		withReportFlags(outboxCommand()),
		withReportFlags(statsCommand()),
		withReportFlags(verifyCommand()),
		withReportFlags(healthCommand()),
		uiCommand(),
		versionCommand(),
	}
	cmds = append(cmds, opts.Extra...)
	app := &ucli.App{
		Name:                   opts.Name,
		Usage:                  opts.Usage,
		Description:            opts.Description,
		Writer:                 opts.Stdout,
		ErrWriter:              opts.Stderr,
		Commands:               cmds,
		Metadata:               map[string]any{envKey: e},
		HideVersion:            true,
		UseShortOptionHandling: false,
		Suggest:                true,
		ExitErrHandler:         func(*ucli.Context, error) {},
		OnUsageError: func(c *ucli.Context, err error, _ bool) error {
			return usageError{Err: fmt.Errorf("%v (see `%s --help`)", err, c.Command.HelpName)}
		},
	}
	app.Action = func(c *ucli.Context) error {
		if c.Args().Len() > 0 {
			return usageError{Err: fmt.Errorf("unknown command %q (see `%s --help`)", c.Args().First(), c.App.Name)}
		}
		return ucli.ShowAppHelp(c)
	}
	for _, c := range app.Commands {
		setUsageErrors(c)
	}
	ownHelpFlags(app)
	return app
}

// ownHelpFlags gives the app and every command a --help flag of their own instead of
// urfave/cli's global HelpFlag, whose Apply writes to the one shared value: two apps
// running at once (tests run fenceq in-process, in parallel) would race on it.
func ownHelpFlags(app *ucli.App) {
	help := func() ucli.Flag {
		return &ucli.BoolFlag{Name: "help", Aliases: []string{"h"}, Usage: "show help", DisableDefaultText: true}
	}
	app.HideHelp = true
	app.Flags = append(app.Flags, help())
	var walk func(cmds []*ucli.Command)
	walk = func(cmds []*ucli.Command) {
		for _, c := range cmds {
			c.HideHelp = true
			c.Flags = append(c.Flags, help())
			walk(c.Subcommands)
		}
	}
	walk(app.Commands)
}

// Run runs app (a command tree from New) with args (args[0] is the program name) and
// returns the exit status: ExitOK, ExitError or ExitUsage. An error is printed as one
// line on the app's ErrWriter: "NAME: …".
func Run(ctx context.Context, app *ucli.App, args []string) int {
	errw := app.ErrWriter
	if errw == nil {
		errw = os.Stderr
	}
	if fenceq.ActorFrom(ctx) == "api" {
		ctx = fenceq.WithActor(ctx, cliActor())
	}
	err := app.RunContext(ctx, reorderArgs(app, args))
	if err == nil {
		return ExitOK
	}
	var silent silentError
	if errors.As(err, &silent) {
		if silent.Msg != "" {
			fmt.Fprintf(errw, "%s: %s\n", app.Name, silent.Msg)
		}
		return ExitError
	}
	fmt.Fprintf(errw, "%s: %s\n", app.Name, oneLine(err.Error()))
	var usage usageError
	if errors.As(err, &usage) {
		return ExitUsage
	}
	return ExitError
}

func setUsageErrors(c *ucli.Command) {
	if c.OnUsageError == nil {
		c.OnUsageError = func(cc *ucli.Context, err error, _ bool) error {
			return usageError{Err: fmt.Errorf("%v (see `%s --help`)", err, cc.Command.HelpName)}
		}
	}
	for _, sub := range c.Subcommands {
		setUsageErrors(sub)
	}
	if len(c.Subcommands) > 0 && c.Action == nil {
		c.Action = func(cc *ucli.Context) error {
			if cc.Args().Len() > 0 {
				return usageError{Err: fmt.Errorf("unknown command %q for %s (see `%s --help`)",
					cc.Args().First(), cc.Command.HelpName, cc.Command.HelpName)}
			}
			_ = ucli.ShowSubcommandHelp(cc)
			return usageError{Err: fmt.Errorf("%s needs a subcommand", cc.Command.HelpName)}
		}
	}
}

// maxListLimit bounds a list command's --limit: a page the terminal can hold, and far
// from the integer overflow of the limit plus one the engine asks for.
const maxListLimit = 100000

// listLimit reads a list command's --limit: 1–maxListLimit, the most rows it shows.
func listLimit(c *ucli.Context) (int, error) {
	n := c.Int("limit")
	if n < 1 || n > maxListLimit {
		return 0, usageError{Err: fmt.Errorf("invalid --limit %d: want 1–%d", n, maxListLimit)}
	}
	return n, nil
}

// reorderArgs moves the flags of the leaf command before its positional arguments, so
// `fenceq jobs show 12 --json` and `fenceq enqueue noop --args '{}'` work: the standard
// flag parser stops at the first positional argument.
func reorderArgs(app *ucli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	cmds := app.Commands
	var leaf *ucli.Command
	i := 1
	for i < len(args) {
		var next *ucli.Command
		for _, c := range cmds {
			if c.HasName(args[i]) {
				next = c
				break
			}
		}
		if next == nil {
			break
		}
		leaf = next
		out = append(out, args[i])
		cmds = next.Subcommands
		i++
	}
	if leaf == nil || len(leaf.Subcommands) > 0 {
		return append(out, args[i:]...)
	}
	var flags, positional []string
	help := false
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" || isNumber(a) {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		help = help || a == "--help" || a == "-h"
		if strings.Contains(a, "=") {
			continue
		}
		if takesValue(leaf, strings.TrimLeft(a, "-")) && i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	out = append(out, flags...)
	// With --help, urfave/cli reads the first positional argument as a help topic
	// ("No help topic for 'drain'"): help is about the command, so they are dropped.
	if help {
		return out
	}
	if len(positional) > 0 {
		out = append(out, "--")
		out = append(out, positional...)
	}
	return out
}

func isNumber(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func takesValue(c *ucli.Command, name string) bool {
	for _, f := range c.Flags {
		for _, n := range f.Names() {
			if n == name {
				if dg, ok := f.(ucli.DocGenerationFlag); ok {
					return dg.TakesValue()
				}
				return true
			}
		}
	}
	return false
}
