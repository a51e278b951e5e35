package demo

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The demo's logger writes every record to the worker log and only the important ones
// to stderr.
func TestFanout(t *testing.T) {
	t.Parallel()
	var all, errs bytes.Buffer
	log := slog.New(fanout{
		slog.NewTextHandler(&all, &slog.HandlerOptions{Level: slog.LevelDebug}),
		slog.NewTextHandler(&errs, &slog.HandlerOptions{Level: slog.LevelError}),
	}).With("worker", "w1")
	log.Debug("claimed")
	log.WithGroup("job").Error("lease expired", "id", 7)
	if n := strings.Count(all.String(), "\n"); n != 2 || !strings.Contains(all.String(), "worker=w1") {
		t.Errorf("worker log:\n%s", all.String())
	}
	if s := errs.String(); strings.Count(s, "\n") != 1 || !strings.Contains(s, "worker=w1") || !strings.Contains(s, "job.id=7") {
		t.Errorf("stderr:\n%s", s)
	}
}
