package connect_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/connect"
)

func TestOpen(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := connect.Open(ctx, fenceqtest.RequireServerURL(t), 1)
	if err != nil {
		t.Fatalf("open the test server: %v", err)
	}
	var app string
	err = pool.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&app)
	pool.Close()
	if err != nil || app != "fenceq" {
		t.Fatalf("application_name %q, %v; want fenceq", app, err)
	}

	for _, c := range []struct{ raw, want string }{
		{"postgres://u:secret@127.0.0.1:1/x", "cannot connect to postgres://u:xxxxx@127.0.0.1:1/x: "},
		{"host=127.0.0.1 port=1 user=u password=secret", "cannot connect to host=127.0.0.1 port=1 user=u password=xxxxx: "},
		{"postgres://u:secret@127.0.0.1:notaport/x", "invalid database URL"},
	} {
		_, err := connect.Open(ctx, c.raw, 1)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "secret") ||
			strings.Contains(err.Error(), "\n") {
			t.Errorf("Open(%q) = %v, want one line containing %q without the password", c.raw, err, c.want)
		}
	}
}
