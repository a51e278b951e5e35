package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

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

// httpServer is a listener serving a handler until stopped.
type httpServer struct {
	Addr string // the bound address, e.g. 127.0.0.1:43121
	srv  *http.Server
	done chan error
}

// startHTTP listens on addr and serves h in the background.
func startHTTP(addr string, h http.Handler, log *slog.Logger, what string) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for %s on %s: %w", what, addr, err)
	}
	return serveHTTP(ln, h, log, what), nil
}

// serveHTTP serves h on ln in the background.
func serveHTTP(ln net.Listener, h http.Handler, log *slog.Logger, what string) *httpServer {
	s := &httpServer{Addr: ln.Addr().String(), done: make(chan error, 1),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	log.Info("serving "+what, "addr", s.Addr)
	return s
}

// Stop shuts the server down, waiting up to timeout for requests in flight.
func (s *httpServer) Stop(timeout time.Duration) error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; serr != nil {
		err = errors.Join(err, serr)
	}
	return err
}

func contextWithTimeout(r *http.Request, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), d)
}
