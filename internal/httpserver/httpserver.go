// Package httpserver serves an http.Handler on a listener in the background until it is
// stopped: the orders API and metrics endpoints of the fenceq command and its demo.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Server is a listener serving a handler until stopped.
type Server struct {
	// Addr is the bound address, e.g. 127.0.0.1:43121 for 127.0.0.1:0.
	Addr string

	srv  *http.Server
	done chan struct{} // closed when Serve returned
	err  error         // what Serve returned, if not ErrServerClosed; read after done
}

// Start listens on addr and serves h in the background. It logs the bound address as
// "serving <what>".
func Start(addr string, h http.Handler, log *slog.Logger, what string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for %s on %s: %w", what, addr, err)
	}
	return Serve(ln, h, log, what), nil
}

// Serve serves h on ln in the background, for a listener the caller opened itself
// (the dashboard refuses some addresses before listening). It logs like Start.
func Serve(ln net.Listener, h http.Handler, log *slog.Logger, what string) *Server {
	s := &Server{Addr: ln.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	log.Info("serving "+what, "addr", s.Addr)
	return s
}

// Done is closed when the server stopped serving: after Stop, or on its own when
// serving failed (then Err says why).
func (s *Server) Done() <-chan struct{} { return s.done }

// Err is the error that ended serving, once Done is closed; nil after a clean Stop.
func (s *Server) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Stop shuts the server down, waiting up to timeout for requests in flight. A nil
// Server is stopped already.
func (s *Server) Stop(timeout time.Duration) error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return errors.Join(err, s.err)
}
