package httpserver_test

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/fenceq/fenceq/internal/httpserver"
)

func TestStartStop(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := httpserver.Start("127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	}), log, "greetings")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello" {
		t.Fatalf("body %q", body)
	}
	if err := s.Stop(5 * time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done is open after Stop")
	}
	if s.Err() != nil {
		t.Fatalf("Err after a clean stop: %v", s.Err())
	}
	if _, err := httpserver.Start(s.Addr+"0", nil, log, "nothing"); err == nil {
		t.Fatal("Start on a bad address: no error")
	}
	var stopped *httpserver.Server
	if err := stopped.Stop(time.Second); err != nil {
		t.Fatalf("Stop of a nil server: %v", err)
	}
}
