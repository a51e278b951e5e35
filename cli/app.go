// Package cli is the fenceq command: administration (migrate, enqueue, jobs, queues,
// workers, outbox, stats), the standalone worker, the orders API server, billing runs,
// invariant checks (verify), alert conditions (health) and the demo.
//
// Run is the entry point; cmd/fenceq only calls it, and tests call it in-process with
// their own writers to read the output and the exit status.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/connect"
)

// DefaultDatabaseURL is the database used when neither --database-url nor DATABASE_URL
// is given: the local server.
const DefaultDatabaseURL = connect.DefaultURL

// Exit statuses.
const (
	ExitOK    = 0
	ExitError = 1 // an error, a failed check (verify) or an alert (health)
	ExitUsage = 2 // bad command line
)

// commands is the one list of fenceq's commands.
func commands() []*ucli.Command {
	return []*ucli.Command{
		withReportFlags(migrateCommand()),
		workerCommand(),
		withReportFlags(enqueueCommand()),
		withReportFlags(jobsCommand()),
		withReportFlags(queuesCommand()),
		withReportFlags(periodicCommand()),
		withReportFlags(workersCommand()),
		withReportFlags(outboxCommand()),
		withReportFlags(billingCommand()),
		serveCommand(),
		withReportFlags(statsCommand()),
		withReportFlags(verifyCommand()),
		withReportFlags(healthCommand()),
		uiCommand(),
		demoCommand(),
		withReportFlags(benchCommand()),
		chaosCommand(),
		versionCommand(),
	}
}

// NewApp returns the fenceq command writing to stdout and stderr. Errors are returned
// from RunContext, never printed or turned into os.Exit; Run does that.
func NewApp(stdout, stderr io.Writer) *ucli.App {
	app := &ucli.App{
		Name:  "fenceq",
		Usage: "a PostgreSQL job queue whose jobs' outcomes happen exactly once",
		Description: "Every command that talks to the database takes --database-url (env DATABASE_URL,\n" +
			"default " + DefaultDatabaseURL + ", the local server).\n" +
			"Listing and report commands take --json for machine-readable output.\n" +
			"Start with `fenceq demo`: it needs no setup.",
		Writer:                 stdout,
		ErrWriter:              stderr,
		Commands:               commands(),
		HideVersion:            true,
		UseShortOptionHandling: false,
		Suggest:                true,
		ExitErrHandler:         func(*ucli.Context, error) {},
		OnUsageError: func(c *ucli.Context, err error, _ bool) error {
			return usageError{fmt.Errorf("%v (see `%s --help`)", err, c.Command.HelpName)}
		},
	}
	app.Action = func(c *ucli.Context) error {
		if c.Args().Len() > 0 {
			return usageError{fmt.Errorf("unknown command %q (see `fenceq --help`)", c.Args().First())}
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

// Run runs fenceq with args (args[0] is the program name) and returns the exit status.
// Errors are printed as one line on stderr: "fenceq: …".
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := NewApp(stdout, stderr)
	err := app.RunContext(ctx, reorderArgs(app, args))
	if err == nil {
		return ExitOK
	}
	var silent silentError
	if errors.As(err, &silent) {
		if silent.msg != "" {
			fmt.Fprintf(stderr, "fenceq: %s\n", silent.msg)
		}
		return ExitError
	}
	fmt.Fprintf(stderr, "fenceq: %s\n", oneLine(err.Error()))
	var usage usageError
	if errors.As(err, &usage) {
		return ExitUsage
	}
	return ExitError
}

// usageError is a bad command line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// silentError ends a command whose output already said what went wrong (a failed
// verify, an alerting health check): exit 1 with at most a short summary line.
type silentError struct{ msg string }

func (e silentError) Error() string { return e.msg }

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n\t", " ")
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.TrimSpace(s)
}

func setUsageErrors(c *ucli.Command) {
	if c.OnUsageError == nil {
		c.OnUsageError = func(cc *ucli.Context, err error, _ bool) error {
			return usageError{fmt.Errorf("%v (see `%s --help`)", err, cc.Command.HelpName)}
		}
	}
	for _, sub := range c.Subcommands {
		setUsageErrors(sub)
	}
	if len(c.Subcommands) > 0 && c.Action == nil {
		c.Action = func(cc *ucli.Context) error {
			if cc.Args().Len() > 0 {
				return usageError{fmt.Errorf("unknown command %q for %s (see `%s --help`)",
					cc.Args().First(), cc.Command.HelpName, cc.Command.HelpName)}
			}
			_ = ucli.ShowSubcommandHelp(cc)
			return usageError{fmt.Errorf("%s needs a subcommand", cc.Command.HelpName)}
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
		return 0, usageError{fmt.Errorf("invalid --limit %d: want 1–%d", n, maxListLimit)}
	}
	return n, nil
}

// needArgs checks the number of positional arguments.
func needArgs(c *ucli.Context, min, max int, usage string) error {
	n := c.Args().Len()
	if n < min || (max >= 0 && n > max) {
		return usageError{fmt.Errorf("usage: %s %s", c.Command.HelpName, usage)}
	}
	return nil
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
