package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/health"
)

// table writes rows as aligned columns under upper-case headers.
func table(w io.Writer, headers []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(headers, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// keyValues writes "key: value" lines with the values aligned.
func keyValues(w io.Writer, kv [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, p := range kv {
		fmt.Fprintf(tw, "%s:\t%s\n", p[0], p[1])
	}
	return tw.Flush()
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func wantJSON(c *ucli.Context) bool { return c.Bool(flagJSON) }

func stdout(c *ucli.Context) io.Writer { return c.App.Writer }
func stderr(c *ucli.Context) io.Writer { return c.App.ErrWriter }

// output prints v as JSON with --json, else calls human.
func output(c *ucli.Context, v any, human func(w io.Writer) error) error {
	if wantJSON(c) {
		return printJSON(stdout(c), v)
	}
	return human(stdout(c))
}

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func fmtStr(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

// fmtAge prints a duration rounded for humans: 850ms, 12s, 3m4s, 2h5m.
func fmtAge(d time.Duration) string { return health.Age(d) }

func truncate(s string, n int) string {
	s = oneLine(s)
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
