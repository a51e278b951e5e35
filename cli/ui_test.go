package cli_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/syncbuf"
)

var dashboardAddrRe = regexp.MustCompile(`msg="serving dashboard" addr=(\S+)`)

// startUI runs `fenceq args…` in-process until the test ends and returns the address
// the dashboard serves on, read from the log.
func startUI(t *testing.T, b *testBundle, args ...string) (addr string, stderr *syncbuf.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	stderr = &syncbuf.Buffer{}
	done := make(chan int, 1)
	go func() { done <- runWithWriters(ctx, stderr, append(args, "--database-url", b.db.URL)...) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("fenceq %s: exit %d\n%s", args[0], code, stderr.String())
			}
		case <-time.After(20 * time.Second):
			t.Errorf("fenceq %s did not stop", args[0])
		}
	})
	fenceqtest.WaitFor(t, "the dashboard to serve", 20*time.Second, func() bool {
		if m := dashboardAddrRe.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr, stderr
}

func status(t *testing.T, req *http.Request) int {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

func TestUICommandServesTheDashboard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ok(t, "queues", "pause", "billing")
	addr, _ := startUI(t, b, "ui", "--addr", "127.0.0.1:0", "--read-only")
	body := get(t, "http://"+addr+"/")
	for _, want := range []string{"Overview", "billing", "paused", "read-only", "oldest open transaction"} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/queues/billing/resume", nil)
	if got := status(t, req); got != http.StatusForbidden {
		t.Errorf("POST in --read-only: %d; want 403", got)
	}
}

func TestUIRefusesNonLoopbackWithoutAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.run(t, "ui", "--addr", "0.0.0.0:0")
	oneErrorLine(t, r, "refusing to serve the dashboard on a non-loopback address without auth")
	if r.code != 2 {
		t.Errorf("exit %d; want 2 (a bad command line)", r.code)
	}
	oneErrorLine(t, b.run(t, "ui", "--auth-basic", "no-colon"), "want USER:PASSWORD")

	// With a token it serves every interface; the token is required and never printed.
	const secret = "tok-9f8e7d6c5b4a"
	addr, stderr := startUI(t, b, "ui", "--addr", "0.0.0.0:0", "--auth-token", secret)
	port := addr[strings.LastIndex(addr, ":"):]
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1"+port+"/", nil)
	if got := status(t, req); got != http.StatusUnauthorized {
		t.Errorf("without the token: %d; want 401", got)
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	if got := status(t, req); got != http.StatusOK {
		t.Errorf("with the token: %d; want 200", got)
	}
	if strings.Contains(stderr.String(), secret) {
		t.Errorf("the log shows the token:\n%s", stderr.String())
	}
}

func TestWorkerServesTheDashboard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	addr, _ := startUI(t, b, "worker", "--ui-addr", "127.0.0.1:0", "--id", "ui-test-worker", "--queues", "default",
		"--shutdown-timeout", "200ms", "--mailer", "file:"+t.TempDir()+"/mail.jsonl")
	fenceqtest.WaitFor(t, "the worker on the workers page", 10*time.Second, func() bool {
		return strings.Contains(get(t, "http://"+addr+"/workers"), "ui-test-worker")
	})
	r := b.run(t, "worker", "--ui-addr", ":0", "--id", "w2")
	oneErrorLine(t, r, "--ui-addr :0: refusing to serve the dashboard")
}
