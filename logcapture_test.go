package fenceq_test

import (
	"context"
	"log/slog"
	"sync"
)

// logCapture is a slog.Handler that keeps every record, for tests that assert what a
// worker logged. Attributes added with With are kept too, ahead of the record's own.
type logCapture struct {
	mu    *sync.Mutex
	recs  *[]slog.Record
	attrs []slog.Attr
}

func newLogCapture() *logCapture {
	return &logCapture{mu: &sync.Mutex{}, recs: &[]slog.Record{}}
}

func (h *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (h *logCapture) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	if len(h.attrs) > 0 {
		own := make([]slog.Attr, 0, r.NumAttrs())
		r.Attrs(func(a slog.Attr) bool { own = append(own, a); return true })
		r = slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
		r.AddAttrs(h.attrs...)
		r.AddAttrs(own...)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, r)
	return nil
}

func (h *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *logCapture) WithGroup(string) slog.Handler { return h }

// logger returns a logger writing to the capture.
func (h *logCapture) logger() *slog.Logger { return slog.New(h) }

// withMessage returns the records logged with the message msg.
func (h *logCapture) withMessage(msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range *h.recs {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// recordAttrs returns the attributes of r by key.
func recordAttrs(r slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Resolve()
		return true
	})
	return m
}
