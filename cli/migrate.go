package cli

import (
	"fmt"
	"io"
	"strconv"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/migrations"
)

func migrateCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "migrate",
		Usage: "apply, revert or show fenceq's schema migrations",
		Subcommands: []*ucli.Command{
			{
				Name:   "up",
				Usage:  "apply every pending migration",
				Action: migrateUp,
			},
			{
				Name:      "down",
				Usage:     "revert the last N applied migrations (default 1)",
				ArgsUsage: "[N]",
				Flags: []ucli.Flag{
					&ucli.BoolFlag{Name: "all", Usage: "revert every migration: drops all fenceq tables and their data"},
				},
				Action: migrateDown,
			},
			{
				Name:   "status",
				Usage:  "show the schema version and which migrations are applied",
				Action: migrateStatus,
			},
		},
	}
}

type migrateResult struct {
	From    uint `json:"from_version"`
	To      uint `json:"to_version"`
	Latest  uint `json:"latest_version"`
	Applied int  `json:"changed"`
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
	before, err := migrations.Status(c.Context, pool)
	if err != nil {
		return err
	}
	if err := migrations.Up(c.Context, pool); err != nil {
		return err
	}
	after, err := migrations.Status(c.Context, pool)
	if err != nil {
		return err
	}
	res := migrateResult{From: before.Version, To: after.Version, Latest: migrations.Latest(),
		Applied: applied(after) - applied(before)}
	return output(c, res, func(w io.Writer) error {
		if res.Applied == 0 {
			_, err := fmt.Fprintf(w, "schema is current at version %d\n", res.To)
			return err
		}
		_, err := fmt.Fprintf(w, "migrated from version %d to %d (%d applied)\n", res.From, res.To, res.Applied)
		return err
	})
}

func migrateDown(c *ucli.Context) error {
	if err := needArgs(c, 0, 1, "[N] | --all"); err != nil {
		return err
	}
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
	if c.Bool("all") {
		steps = 0
	}
	pool, err := openPool(c, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := migrations.Status(c.Context, pool)
	if err != nil {
		return err
	}
	if before.Version == 0 {
		return output(c, migrateResult{Latest: migrations.Latest()}, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, "no migration is applied; nothing to revert")
			return err
		})
	}
	if steps > applied(before) {
		return fmt.Errorf("cannot revert %d migrations: only %d are applied", steps, applied(before))
	}
	if err := migrations.Down(c.Context, pool, steps); err != nil {
		return err
	}
	after, err := migrations.Status(c.Context, pool)
	if err != nil {
		return err
	}
	res := migrateResult{From: before.Version, To: after.Version, Latest: migrations.Latest(),
		Applied: applied(before) - applied(after)}
	return output(c, res, func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "reverted from version %d to %d (%d reverted)\n", res.From, res.To, res.Applied)
		return err
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
	rep, err := migrations.Status(c.Context, pool)
	if err != nil {
		return err
	}
	return output(c, rep, func(w io.Writer) error {
		state := "current"
		switch {
		case rep.Dirty:
			state = "DIRTY: a migration failed half-way"
		case rep.Version < migrations.Latest():
			state = fmt.Sprintf("%d pending (run `fenceq migrate up`)", len(rep.Migrations)-applied(rep))
		}
		fmt.Fprintf(w, "version %d of %d, %s\n\n", rep.Version, migrations.Latest(), state)
		rows := make([][]string, 0, len(rep.Migrations))
		for _, m := range rep.Migrations {
			st := "pending"
			if m.Applied {
				st = "applied"
			}
			rows = append(rows, []string{strconv.FormatUint(uint64(m.Version), 10), m.Name, st})
		}
		return table(w, []string{"VERSION", "NAME", "STATE"}, rows)
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
