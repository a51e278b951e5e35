package cli_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/fenceqhttp"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/syncbuf"
	"github.com/fenceq/fenceq/queue"
)

// `fenceq worker --http KIND=URL` runs KIND by POSTing its args to URL, signed with the
// secret; the response counts in fenceq_http_responses_total.
func TestWorkerHTTPKind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const secret = "cli secret"
	var verified, refused atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := fenceqhttp.Verify([]byte(secret), r, body); err != nil {
			refused.Add(1)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		verified.Add(1)
		_, _ = io.WriteString(w, `{"echo": `+string(body)+`}`)
	}))
	defer srv.Close()
	res, err := fenceq.Enqueue(b.ctx, b.db.Pool, fenceq.RawArgs{KindName: "remote.echo", JSON: []byte(`{"n": 3}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWithWriters(ctx, &stderr, "worker", "--database-url", b.db.URL, "--metrics-addr", "127.0.0.1:0",
			"--queues", "default", "--poll", "100ms", "--no-periodic", "--shutdown-timeout", "1s",
			"--mailer", "file:"+filepath.Join(t.TempDir(), "mail.jsonl"),
			"--http", "remote.echo="+srv.URL+"/echo", "--http-secret", secret, "--http-timeout", "10s")
	}()
	j := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 20*time.Second)
	if string(j.Output) != `{"echo": {"n": 3}}` || verified.Load() != 1 || refused.Load() != 0 {
		t.Fatalf("output %s, %d verified and %d refused requests; want the echo of one signed request",
			j.Output, verified.Load(), refused.Load())
	}
	var addr string
	if m := metricsAddrRe.FindStringSubmatch(stderr.String()); m != nil {
		addr = m[1]
	}
	if body := get(t, "http://"+addr+"/metrics"); !strings.Contains(body, "\n"+`fenceq_http_responses_total{class="2xx",kind="remote.echo"} 1`+"\n") {
		t.Errorf("/metrics lacks the HTTP kind's response:\n%s", body)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("worker exit %d\n%s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
}

// --http is refused, before any connection, without a secret or with a malformed kind,
// URL or override.
func TestWorkerHTTPRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http", "k=http://127.0.0.1:1/run"}, "--http needs a secret to sign its requests: set FENCEQ_HTTP_SECRET"},
		{[]string{"--http", "k", "--http-secret", "s"}, `invalid --http "k": want KIND=URL`},
		{[]string{"--http", "k=/run", "--http-secret", "s"}, "want an absolute http or https URL"},
		{[]string{"--http", "k=http://a/", "--http", "k=http://b/", "--http-secret", "s"}, `kind "k" is already registered`},
		{[]string{"--http-retry-4xx", "k"}, "--http-retry-4xx k: no --http kind"},
		{[]string{"--http", "k=http://a/", "--http-retry-4xx", "j", "--http-secret", "s"}, `--http-retry-4xx j: no --http kind "j"`},
		{[]string{"--http", "k=http://a/", "--http-timeout", "-1s", "--http-secret", "s"}, "invalid --http-timeout"},
	} {
		r := runCLI(t.Context(), append(append([]string{"worker"}, tc.args...), "--database-url", "postgres://u@127.0.0.1:1/x")...)
		oneErrorLine(t, r, tc.want)
		if r.code != cli.ExitUsage {
			t.Errorf("fenceq worker %s: exit %d, want %d", strings.Join(tc.args, " "), r.code, cli.ExitUsage)
		}
	}
}
