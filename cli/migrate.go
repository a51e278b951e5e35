package cli

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/migrations"
)

func migrateCommand(e *env) *ucli.Command {
	setFlag := func(usage string) ucli.Flag {
		return &ucli.StringSliceFlag{Name: "set", Usage: usage + " (repeat for several): " + strings.Join(e.setNames(), ", ")}
	}
	desc := "Migration sets: " + strings.Join(e.setNames(), ", ") + ". The core (fenceq) creates only fenceq_*\n" +
		"tables; every other set creates the tables of its own jobs."
	if len(e.opts.OptionalMigrations) > 0 {
		var names []string
		for _, s := range e.opts.OptionalMigrations {
			names = append(names, s.Name)
		}
		desc += "\nInstalled only when named with --set: " + strings.Join(names, ", ") + "."
	}
	return &ucli.Command{
		Name:        "migrate",
		Usage:       "apply, revert or show the schema migrations of fenceq's core and of the application's sets",
		Description: desc,
		Subcommands: []*ucli.Command{
			{
				Name:   "up",
				Usage:  "apply every pending migration of the default sets, or of the --set sets",
				Flags:  []ucli.Flag{setFlag("apply only this set, installing it if needed")},
				Action: migrateUp,
			},
			{
				Name:      "down",
				Usage:     "revert the last N applied migrations of one set (default 1, of --set fenceq)",
				ArgsUsage: "[N]",
				Flags: []ucli.Flag{
					setFlag("the set to revert"),
					&ucli.BoolFlag{Name: "all", Usage: "revert every migration of every installed set (or of the --set sets): drops their tables and data"},
				},
				Action: migrateDown,
			},
			{
				Name:   "status",
				Usage:  "show each set's version and which migrations are applied",
				Flags:  []ucli.Flag{setFlag("show only this set")},
				Action: migrateStatus,
			},
		},
	}
}

// chosenSets returns the sets --set names, in the binary's order (the core first),
// or def when --set is not given. An unknown name is a usage error.
func chosenSets(c *ucli.Context, e *env, def []migrations.Set) ([]migrations.Set, error) {
	names := c.StringSlice("set")
	if len(names) == 0 {
		return def, nil
	}
	all := e.sets()
	for _, n := range names {
		if !slices.ContainsFunc(all, func(s migrations.Set) bool { return s.Name == n }) {
			return nil, usageError{Err: fmt.Errorf("invalid --set %q: want one of %s", n, strings.Join(e.setNames(), ", "))}
		}
	}
	var out []migrations.Set
	for _, s := range all {
		if slices.Contains(names, s.Name) {
			out = append(out, s)
		}
	}
	return out, nil
}

// setChange is what one set went through.
type setChange struct {
	Set     string `json:"set"`
	From    uint   `json:"from_version"`
	To      uint   `json:"to_version"`
	Latest  uint   `json:"latest_version"`
	Changed int    `json:"changed"`
}

type migrateResult struct {
	Sets    []setChange `json:"sets"`
	Changed int         `json:"changed"`
}

// statusAll reads the report of every set.
func statusAll(c *ucli.Context, pool *pgxpool.Pool, sets []migrations.Set) ([]migrations.Report, error) {
	out := make([]migrations.Report, 0, len(sets))
	for _, s := range sets {
		rep, err := s.Status(c.Context, pool)
		if err != nil {
			return nil, err
		}
		out = append(out, rep)
	}
	return out, nil
}

// changes compares the reports of each set before and after.
func changes(before, after []migrations.Report) migrateResult {
	var res migrateResult
	for i := range before {
		d := applied(after[i]) - applied(before[i])
		if d < 0 {
			d = -d
		}
		res.Sets = append(res.Sets, setChange{Set: before[i].Set, From: before[i].Version, To: after[i].Version,
			Latest: after[i].Latest, Changed: d})
		res.Changed += d
	}
	return res
}

func migrateUp(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--set NAME]..."); err != nil {
		return err
	}
	e := envOf(c)
	sets, err := chosenSets(c, e, e.defaultSets())
	if err != nil {
		return err
	}
	// Every set may refer to the core's tables: the core comes first, named or not.
	if sets[0].Name != migrations.Core().Name {
		sets = append([]migrations.Set{migrations.Core()}, sets...)
	}
	pool, err := openPool(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := statusAll(c, pool, sets)
	if err != nil {
		return err
	}
	if err := migrations.UpAll(c.Context, pool, sets...); err != nil {
		return err
	}
	after, err := statusAll(c, pool, sets)
	if err != nil {
		return err
	}
	res := changes(before, after)
	return output(c, res, func(w io.Writer) error {
		for _, s := range res.Sets {
			if s.Changed == 0 {
				fmt.Fprintf(w, "%s: schema is current at version %d\n", s.Set, s.To)
				continue
			}
			fmt.Fprintf(w, "%s: migrated from version %d to %d (%d applied)\n", s.Set, s.From, s.To, s.Changed)
		}
		return nil
	})
}

func migrateDown(c *ucli.Context) error {
	if err := needArgs(c, 0, 1, "[N] [--set NAME] | --all [--set NAME]..."); err != nil {
		return err
	}
	e := envOf(c)
	steps := 1
	if c.Args().Len() == 1 {
		if c.Bool("all") {
			return usageError{Err: fmt.Errorf("give either N or --all, not both")}
		}
		n, err := strconv.Atoi(c.Args().First())
		if err != nil || n < 1 {
			return usageError{Err: fmt.Errorf("invalid number of migrations %q: want a positive integer", c.Args().First())}
		}
		steps = n
	}
	var sets []migrations.Set
	if c.Bool("all") {
		steps = 0
		all, err := chosenSets(c, e, e.sets())
		if err != nil {
			return err
		}
		// Reverted in the reverse order they apply: the sets that may refer to the
		// core before the core.
		sets = slices.Clone(all)
		slices.Reverse(sets)
	} else {
		chosen, err := chosenSets(c, e, []migrations.Set{migrations.Core()})
		if err != nil {
			return err
		}
		if len(chosen) != 1 {
			return usageError{Err: fmt.Errorf("reverting N migrations takes one --set, got %d (or use --all)", len(chosen))}
		}
		sets = chosen
	}
	pool, err := openPool(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := statusAll(c, pool, sets)
	if err != nil {
		return err
	}
	if steps > 0 {
		if applied(before[0]) == 0 {
			return output(c, changes(before, before), func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s: no migration is applied; nothing to revert\n", before[0].Set)
				return err
			})
		}
		if steps > applied(before[0]) {
			return fmt.Errorf("cannot revert %d migrations of %s: only %d are applied", steps, before[0].Set, applied(before[0]))
		}
	}
	for i, s := range sets {
		if !before[i].Installed {
			continue // nothing to revert; reverting would create its version table
		}
		if err := s.Down(c.Context, pool, steps); err != nil {
			return err
		}
	}
	after, err := statusAll(c, pool, sets)
	if err != nil {
		return err
	}
	res := changes(before, after)
	return output(c, res, func(w io.Writer) error {
		for i, s := range res.Sets {
			if !before[i].Installed {
				fmt.Fprintf(w, "%s: not installed; nothing to revert\n", s.Set)
				continue
			}
			fmt.Fprintf(w, "%s: reverted from version %d to %d (%d reverted)\n", s.Set, s.From, s.To, s.Changed)
		}
		return nil
	})
}

func migrateStatus(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--set NAME]..."); err != nil {
		return err
	}
	e := envOf(c)
	sets, err := chosenSets(c, e, e.sets())
	if err != nil {
		return err
	}
	pool, err := openPool(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	reps, err := statusAll(c, pool, sets)
	if err != nil {
		return err
	}
	return output(c, reps, func(w io.Writer) error {
		rows := [][]string{}
		for _, rep := range reps {
			up := e.opts.Name + " migrate up"
			if e.optional(rep.Set) {
				up += " --set " + rep.Set
			}
			state := "current"
			switch {
			case rep.Dirty:
				state = "DIRTY: a migration failed half-way"
			case !rep.Installed:
				state = fmt.Sprintf("not installed (install it with `%s`)", up)
			case rep.Version < rep.Latest:
				state = fmt.Sprintf("%d pending (run `%s`)", len(rep.Migrations)-applied(rep), up)
			}
			fmt.Fprintf(w, "%s: version %d of %d, %s\n", rep.Set, rep.Version, rep.Latest, state)
			for _, m := range rep.Migrations {
				st := "pending"
				switch {
				case m.Applied:
					st = "applied"
				case !rep.Installed:
					st = "not installed"
				}
				rows = append(rows, []string{rep.Set, strconv.FormatUint(uint64(m.Version), 10), m.Name, st})
			}
		}
		fmt.Fprintln(w)
		return table(w, []string{"SET", "VERSION", "NAME", "STATE"}, rows)
	})
}

func applied(r migrations.Report) int {
	n := 0
	for _, m := range r.Migrations {
		if m.Applied {
			n++
		}
	}
	return n
}
