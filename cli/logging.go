package cli

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

func logFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
		&ucli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json (log/slog records on stderr)"},
	}
}

// newLogger builds the command's slog logger on stderr.
func newLogger(c *ucli.Context) (*slog.Logger, error) {
	return makeLogger(stderr(c), c.String("log-level"), c.String("log-format"))
}

func makeLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError{fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", level)}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("invalid --log-format %q: want text or json", format)}
}
