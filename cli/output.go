package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/fenceq/fenceq/health"
)

// keyValues writes "key: value" lines with the values aligned.
func keyValues(w io.Writer, kv [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for _, p := range kv {
		fmt.Fprintf(tw, "%s:\t%s\n", p[0], p[1])
	}
	return tw.Flush()
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
