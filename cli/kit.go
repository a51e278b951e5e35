package cli

import (
	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/clikit"
	"github.com/fenceq/fenceq/migrations"
)

// The helpers every command shares live in internal/clikit, where the stock binary's
// own commands reach them too; these names keep the commands' code short.
type (
	usageError  = clikit.UsageError
	silentError = clikit.SilentError
)

var (
	needArgs        = clikit.NeedArgs
	output          = clikit.Output
	table           = clikit.Table
	jsonFlag        = clikit.JSONFlag
	databaseURLFlag = clikit.DatabaseURLFlag
	withReportFlags = clikit.WithReportFlags
	dbURL           = clikit.DBURL
	openPool        = clikit.OpenPool
	stdout          = clikit.Stdout
	logFlags        = clikit.LogFlags
	newLogger       = clikit.NewLogger
	oneLine         = clikit.OneLine
)

// openSchema connects and checks that the given migration sets (the core's when none)
// are current: what every admin command starts with.
func openSchema(c *ucli.Context, maxConns int32, sets ...migrations.Set) (*pgxpool.Pool, error) {
	return clikit.OpenSchema(c, maxConns, c.App.Name, sets...)
}
