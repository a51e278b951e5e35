package cli

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/migrations"
)

func migrateCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "migrate",
		Usage: "apply, revert or show the schema migrations: fenceq's own, then the built-in jobs' tables",
		Description: "Migration sets: " + strings.Join(setNames(), ", ") + ". The core (fenceq) creates only\n" +
			"fenceq_* tables; each built-in job's set creates its own business tables.",
		Subcommands: []*ucli.Command{
			{
				Name:   "up",
				Usage:  "apply every pending migration of every set",
				Action: migrateUp,
			},
			{
				Name:      "down",
				Usage:     "revert the last N applied migrations of one set (default 1, of --set fenceq)",
				ArgsUsage: "[N]",
				Flags: []ucli.Flag{
					&ucli.StringFlag{Name: "set", Value: migrations.Core().Name, Usage: "the set to revert: " + strings.Join(setNames(), ", ")},
					&ucli.BoolFlag{Name: "all", Usage: "revert every migration of every set: drops all fenceq and built-in job tables and their data"},
				},
				Action: migrateDown,
			},
			{
				Name:   "status",
				Usage:  "show each set's version and which migrations are applied",
				Action: migrateStatus,
			},
		},
	}
}

func setNames() []string {
	var out []string
	for _, s := range builtin.Migrations() {
		out = append(out, s.Name)
	}
	return out
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
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	pool, err := openPool(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	sets := builtin.Migrations()
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
	if err := needArgs(c, 0, 1, "[N] [--set SET] | --all"); err != nil {
		return err
	}
	all := builtin.Migrations()
	steps := 1
	if c.Args().Len() == 1 {
		if c.Bool("all") {
			return usageError{fmt.Errorf("give either N or --all, not both")}
		}
		n, err := strconv.Atoi(c.Args().First())
		if err != nil || n < 1 {
			return usageError{fmt.Errorf("invalid number of migrations %q: want a positive integer", c.Args().First())}
		}
		steps = n
	}
	// --all reverts the business sets first: they were applied after the core.
	sets := slices.Clone(all)
	slices.Reverse(sets)
	if c.Bool("all") {
		steps = 0
	} else {
		i := slices.IndexFunc(all, func(s migrations.Set) bool { return s.Name == c.String("set") })
		if i < 0 {
			return usageError{fmt.Errorf("invalid --set %q: want one of %s", c.String("set"), strings.Join(setNames(), ", "))}
		}
		sets = all[i : i+1]
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
	for _, s := range sets {
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
		for _, s := range res.Sets {
			fmt.Fprintf(w, "%s: reverted from version %d to %d (%d reverted)\n", s.Set, s.From, s.To, s.Changed)
		}
		return nil
	})
}

func migrateStatus(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, ""); err != nil {
		return err
	}
	pool, err := openPool(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	reps, err := statusAll(c, pool, builtin.Migrations())
	if err != nil {
		return err
	}
	return output(c, reps, func(w io.Writer) error {
		rows := [][]string{}
		for _, rep := range reps {
			state := "current"
			switch {
			case rep.Dirty:
				state = "DIRTY: a migration failed half-way"
			case rep.Version < rep.Latest:
				state = fmt.Sprintf("%d pending (run `fenceq migrate up`)", len(rep.Migrations)-applied(rep))
			}
			fmt.Fprintf(w, "%s: version %d of %d, %s\n", rep.Set, rep.Version, rep.Latest, state)
			for _, m := range rep.Migrations {
				st := "pending"
				if m.Applied {
					st = "applied"
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
