package stockcli

import (
	"github.com/jackc/pgx/v5/pgxpool"
	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/internal/clikit"
	"github.com/fenceq/fenceq/internal/redact"
	"github.com/fenceq/fenceq/migrations"
)

// Short names for the helpers the stock commands share with package cli.
type (
	usageError  = clikit.UsageError
	silentError = clikit.SilentError
)

const flagDatabaseURL = clikit.FlagDatabaseURL

// DefaultDatabaseURL is the database used when neither --database-url nor DATABASE_URL
// is given: the local server.
const DefaultDatabaseURL = clikit.DefaultDatabaseURL

var (
	needArgs        = clikit.NeedArgs
	output          = clikit.Output
	jsonFlag        = clikit.JSONFlag
	databaseURLFlag = clikit.DatabaseURLFlag
	withReportFlags = clikit.WithReportFlags
	dbURL           = clikit.DBURL
	stderr          = clikit.Stderr
	logFlags        = clikit.LogFlags
	newLogger       = clikit.NewLogger
)

var (
	stdout   = clikit.Stdout
	flagJSON = clikit.FlagJSON
)

// RedactURL hides the password of a connection string.
func RedactURL(raw string) string { return redact.URL(raw) }

func wantJSON(c *ucli.Context) bool { return c.Bool(flagJSON) }

// openSchema connects and checks that the given migration sets are current.
func openSchema(c *ucli.Context, maxConns int32, sets ...migrations.Set) (*pgxpool.Pool, error) {
	return clikit.OpenSchema(c, maxConns, c.App.Name, sets...)
}
