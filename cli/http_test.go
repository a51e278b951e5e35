package cli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
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
// secret; the response counts in fenceq_http_responses_total. A kind of --http-config
// runs the same way beside it.
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
	fromFile, err := fenceq.Enqueue(b.ctx, b.db.Pool, fenceq.RawArgs{KindName: "remote.file", JSON: []byte(`{"n": 4}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "http.conf")
	if err := os.WriteFile(config, []byte("# HTTP kinds\n\nremote.file="+srv.URL+"/file timeout=10s  # the same endpoint\n"), 0o600); err != nil {
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
			"--http", "remote.echo="+srv.URL+"/echo", "--http-secret", secret, "--http-timeout", "10s",
			"--http-config", config)
	}()
	j := fenceqtest.WaitState(t, b.db.Pool, res.Job.ID, queue.StateCompleted, 20*time.Second)
	jf := fenceqtest.WaitState(t, b.db.Pool, fromFile.Job.ID, queue.StateCompleted, 20*time.Second)
	if string(j.Output) != `{"echo": {"n": 3}}` || string(jf.Output) != `{"echo": {"n": 4}}` ||
		verified.Load() != 2 || refused.Load() != 0 {
		t.Fatalf("outputs %s and %s, %d verified and %d refused requests; want the echoes of two signed requests",
			j.Output, jf.Output, verified.Load(), refused.Load())
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
	dir := t.TempDir()
	n := 0
	conf := func(text string) string { // a --http-config file holding text
		n++
		path := filepath.Join(dir, fmt.Sprintf("%d.conf", n))
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
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
		{[]string{"--http-config", filepath.Join(dir, "missing.conf"), "--http-secret", "s"}, "--http-config: open"},
		{[]string{"--http-config", conf("k http://a/"), "--http-secret", "s"}, `:1: "k": want KIND=URL`},
		{[]string{"--http-config", conf("\nk=http://a/ timeout=-1s"), "--http-secret", "s"}, `:2: invalid timeout "-1s"`},
		{[]string{"--http-config", conf("k=http://a/ later"), "--http-secret", "s"}, `unknown option "later"`},
		{[]string{"--http-config", conf("k=http://a/ retry-4xx=yes"), "--http-secret", "s"}, "retry-4xx takes no value"},
		{[]string{"--http-config", conf("k=http://a/"), "--http", "k=http://b/", "--http-secret", "s"}, `kind "k" is already registered`},
		{[]string{"--http-config", conf("k=http://a/")}, "--http needs a secret"},
	} {
		r := runCLI(t.Context(), append(append([]string{"worker"}, tc.args...), "--database-url", "postgres://u@127.0.0.1:1/x")...)
		oneErrorLine(t, r, tc.want)
		if r.code != cli.ExitUsage {
			t.Errorf("fenceq worker %s: exit %d, want %d", strings.Join(tc.args, " "), r.code, cli.ExitUsage)
		}
	}
}
