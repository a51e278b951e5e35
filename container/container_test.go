// Package container_test builds the fenceq image with container/build.sh and runs the
// worker in it with podman against the test database: the image holds what it should,
// the worker in it completes jobs, answers its health check, and on SIGTERM gives its
// leases back and exits 0.
package container_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqhttp"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/internal/syncbuf"
	"github.com/fenceq/fenceq/jobs/builtin"
	"github.com/fenceq/fenceq/jobs/diag"
	"github.com/fenceq/fenceq/queue"
)

// TestMain removes the throwaway cluster a test may have started.
func TestMain(m *testing.M) { fenceqtest.Main(m) }

// The packages the test needs on Debian; CI installs them.
const debianPackages = "podman runc"

// hostCABundle is the CA bundle build.sh copies into the image by default.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

// The kinds the worker in the container runs: one it runs by POSTing to an endpoint the
// test serves (worker --http) and a built-in one that runs until it is cancelled
// (holdArgs: far longer than any test).
const (
	doneKind = "app.hook"
	holdKind = diag.SleepKind
	holdArgs = `{"duration": "10m"}`
)

// workerArgs is the command line of the worker in the container: the default queue
// only, no periodic schedules, a short shutdown timeout (the held job is cancelled and
// released rather than waited for), metrics and /healthz on a port of its choosing.
func workerArgs(id string, extra ...string) []string {
	return append([]string{"worker", "--id", id, "--queues", queue.DefaultQueue, "--no-periodic",
		"--poll", "200ms", "--shutdown-timeout", "1s", "--metrics-addr", "127.0.0.1:0"}, extra...)
}

// workerEnv is the worker's environment beyond DATABASE_URL: emails to stdout.
var workerEnv = []string{"FENCEQ_MAILER=file:-"}

// runFlags are podman's flags for every container of the test: the host's network, so
// that the worker reaches the test database and the test reaches the worker's port on
// 127.0.0.1; runc (crun refuses some hosts' cgroups) with limits it may set.
var runFlags = []string{"--network", "host", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}

// requirePodman ends the test when podman or runc is missing or podman cannot work:
// in CI (FENCEQ_CI set) it fails, naming the Debian packages; elsewhere it skips.
func requirePodman(t *testing.T) {
	t.Helper()
	var missing []string
	for _, tool := range strings.Fields(debianPackages) {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	var problem string
	if len(missing) > 0 {
		problem = strings.Join(missing, " and ") + " not found"
	} else if out, err := exec.Command("podman", "--runtime", "runc", "info").CombinedOutput(); err != nil {
		problem = fmt.Sprintf("podman info: %v: %s", err, lastLine(out))
	}
	if problem == "" {
		return
	}
	msg := fmt.Sprintf("%s: the container test needs the Debian packages %s (apt-get install -y %s; run as root)",
		problem, debianPackages, debianPackages)
	if os.Getenv("FENCEQ_CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

func TestContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image (a go build without cache: minutes): not with -short")
	}
	requirePodman(t)
	image := buildImage(t)

	t.Run("image", func(t *testing.T) {
		t.Parallel()
		checkImage(t, image)
	})
	t.Run("worker completes a job", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		db := fenceqtest.New(t, &fenceqtest.Options{Migrations: builtin.Migrations()})
		// The endpoint the worker in the container calls, on the host's loopback (the
		// container shares the host's network). It answers only requests signed with
		// the secret the worker got from its environment.
		secret := randomHex(16)
		var calls atomic.Int32
		endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if err := fenceqhttp.Verify([]byte(secret), r, body); err != nil {
				http.Error(w, err.Error(), http.StatusUnauthorized)
				return
			}
			calls.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"greeted": true}`)
		}))
		t.Cleanup(endpoint.Close)
		res, err := fenceq.Enqueue(ctx, db.Pool, fenceq.RawArgs{KindName: doneKind, JSON: json.RawMessage(`{"name": "ada"}`)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := "container-" + randomHex(4)
		c := runWorker(t, image, db.URL, id, []string{"FENCEQ_HTTP_SECRET=" + secret},
			"--http", doneKind+"="+endpoint.URL)
		if got := get(t, "http://"+c.metricsAddr(t)+"/healthz"); got != "ok\n" {
			t.Errorf("/healthz = %q, want ok", got)
		}
		// FENCEQ_MAILER reached the worker: emails go to stdout, not the default file.
		if logs := c.stderr.String(); !strings.Contains(logs, `msg="emails are written as JSON lines to -"`) {
			t.Errorf("the worker did not read FENCEQ_MAILER=file:-:\n%s", logs)
		}
		var j *queue.JobRow
		fenceqtest.WaitFor(t, "the job to complete", 30*time.Second, func() bool {
			j, err = store.GetJob(ctx, db.Pool, res.Job.ID)
			return err == nil && j.State == queue.StateCompleted
		})
		if j.LeasedBy == nil || *j.LeasedBy != id || j.Attempt != 1 {
			t.Errorf("job completed by %v at attempt %d, want by %s at attempt 1", deref(j.LeasedBy), j.Attempt, id)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("the endpoint took %d signed calls, want 1", n)
		}
		if string(j.Output) != `{"greeted": true}` {
			t.Errorf("job output %s, want the endpoint's answer", j.Output)
		}
		c.signal(t, "TERM")
		if code := c.wait(t); code != 0 {
			t.Fatalf("container exit %d after SIGTERM, want 0\n%s", code, c.stderr.String())
		}
	})
	t.Run("SIGTERM gives the lease back", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		db := fenceqtest.New(t, &fenceqtest.Options{Migrations: builtin.Migrations()})
		res, err := fenceq.Enqueue(ctx, db.Pool, fenceq.RawArgs{KindName: holdKind, JSON: json.RawMessage(holdArgs)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := "container-" + randomHex(4)
		c := runWorker(t, image, db.URL, id, nil)
		var held *queue.JobRow
		fenceqtest.WaitFor(t, "the worker in the container to hold the job's lease", 30*time.Second, func() bool {
			held, err = store.GetJob(ctx, db.Pool, res.Job.ID)
			return err == nil && held.State == queue.StateRunning && held.LeasedBy != nil && *held.LeasedBy == id
		})
		if n := countWorkers(t, ctx, db, id); n != 1 {
			t.Fatalf("worker %s registered %d times while running, want 1", id, n)
		}

		c.signal(t, "TERM")
		code := c.wait(t)
		logs := c.stderr.String()
		// The signal reached the worker and it shut down on its own, rather than being killed.
		for _, want := range []string{`msg="shutting down: no new claims`, `msg="worker shut down gracefully"`} {
			if !strings.Contains(logs, want) {
				t.Errorf("the worker's log lacks %s:\n%s", want, logs)
			}
		}
		if code != 0 {
			t.Fatalf("container exit %d after SIGTERM, want 0\n%s", code, logs)
		}

		j, err := store.GetJob(ctx, db.Pool, res.Job.ID)
		if err != nil {
			t.Fatal(err)
		}
		// store.Release: available again, the attempt given back, the same generation.
		if j.State != queue.StateAvailable || j.Attempt != held.Attempt-1 || j.LeaseGen != held.LeaseGen ||
			j.LeasedBy != nil || j.LeaseExpiresAt != nil {
			t.Errorf("job after SIGTERM: state %s attempt %d gen %d leased_by %v expires %v; "+
				"want available, attempt %d, gen %d, no holder, no expiry",
				j.State, j.Attempt, j.LeaseGen, deref(j.LeasedBy), j.LeaseExpiresAt, held.Attempt-1, held.LeaseGen)
		}
		if n := countWorkers(t, ctx, db, id); n != 0 {
			t.Errorf("worker %s still registered after shutdown", id)
		}
	})
}

// buildImage runs container/build.sh once for the whole test, with a tag of its own,
// and removes the image when the test ends. A cold Go build cache makes it slow.
func buildImage(t *testing.T) string {
	t.Helper()
	image := "localhost/fenceq-test:" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "./build.sh", image)
	cmd.Env = append(os.Environ(), "CONTAINER_ENGINE=podman")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("container/build.sh %s: %v\n%s", image, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("podman", "rmi", "--force", image).CombinedOutput(); err != nil {
			t.Errorf("podman rmi %s: %v: %s", image, err, out)
		}
	})
	return image
}

// checkImage asserts what the image is: the fenceq binary and the host's CA bundle and
// nothing else but the user files and /tmp, run as 65532:65532 with `worker` as the
// default command, and a binary that runs there (it reports the release of this tree).
func checkImage(t *testing.T, image string) {
	out := podman(t, "image", "inspect", "--format", "{{json .Config}}", image)
	var cfg struct {
		User       string
		Entrypoint []string
		Cmd        []string
		StopSignal string
	}
	if err := json.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatalf("decode the image config %q: %v", out, err)
	}
	if cfg.User != "65532:65532" || !slices.Equal(cfg.Entrypoint, []string{"/usr/local/bin/fenceq"}) ||
		!slices.Equal(cfg.Cmd, []string{"worker"}) || cfg.StopSignal != "SIGTERM" {
		t.Errorf("image config: user %q entrypoint %q cmd %q stop signal %q; "+
			"want 65532:65532, [/usr/local/bin/fenceq], [worker], SIGTERM", cfg.User, cfg.Entrypoint, cfg.Cmd, cfg.StopSignal)
	}

	files := exportFiles(t, image)
	var names []string
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	want := []string{"etc/group", "etc/passwd", "etc/ssl/certs/ca-certificates.crt", "tmp/", "usr/local/bin/fenceq"}
	if !slices.Equal(names, want) {
		t.Errorf("files in the image: %q, want %q", names, want)
	}
	if f := files["tmp/"]; f.mode&0o7777 != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777 (writable by the non-root user)", f.mode&0o7777)
	}
	if f := files["usr/local/bin/fenceq"]; f.mode&0o111 == 0 {
		t.Errorf("/usr/local/bin/fenceq mode %o: not executable", f.mode)
	}
	hostCA, err := os.ReadFile(hostCABundle)
	if err != nil {
		t.Fatalf("read the host's CA bundle: %v", err)
	}
	if !bytes.Equal(files["etc/ssl/certs/ca-certificates.crt"].data, hostCA) {
		t.Errorf("the image's CA bundle differs from %s", hostCABundle)
	}
	if !strings.Contains(string(files["etc/passwd"].data), ":65532:65532:") {
		t.Errorf("/etc/passwd has no user 65532:\n%s", files["etc/passwd"].data)
	}

	out = podman(t, append(append([]string{"--runtime", "runc", "run", "--rm"}, runFlags...), image, "version", "--json")...)
	var v struct{ Version string }
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decode `fenceq version --json` in the container %q: %v", out, err)
	}
	if v.Version != fenceq.Version {
		t.Errorf("fenceq version in the container: %q, want %q", v.Version, fenceq.Version)
	}
}

type imageFile struct {
	mode int64
	data []byte // the content of the files read: the small ones and the CA bundle
}

// exportFiles lists the image's files and directories (those holding nothing but other
// directories left out), from the file system of a container created from it.
func exportFiles(t *testing.T, image string) map[string]imageFile {
	t.Helper()
	ctr := strings.TrimSpace(podman(t, "create", image))
	defer podman(t, "rm", "--force", ctr)
	cmd := exec.Command("podman", "export", ctr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("podman export: %v", err)
	}
	files := map[string]imageFile{}
	tr := tar.NewReader(stdout)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("podman export: read the archive: %v", err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		f := imageFile{mode: h.Mode}
		if h.Typeflag == tar.TypeDir {
			if !strings.HasSuffix(name, "/") {
				name += "/"
			}
		} else if h.Size < 1<<20 {
			if f.data, err = io.ReadAll(tr); err != nil {
				t.Fatalf("podman export: read %s: %v", name, err)
			}
		}
		files[name] = f
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("podman export: %v: %s", err, stderr.String())
	}
	// A directory that only leads to other entries says nothing; /tmp is empty and stays.
	for name := range files {
		if !strings.HasSuffix(name, "/") {
			continue
		}
		for other := range files {
			if other != name && strings.HasPrefix(other, name) {
				delete(files, name)
				break
			}
		}
	}
	return files
}

// worker is `fenceq worker` running in a container, attached: the podman process's exit
// status is the container's.
type worker struct {
	name   string
	stderr *syncbuf.Buffer
	done   chan int
}

var metricsAddrRe = regexp.MustCompile(`msg="serving metrics" addr=(\S+)`)

// runWorker starts the worker in a container of the image with DATABASE_URL from the
// environment (podman's --env NAME passes the host's value), and removes the container
// when the test ends.
func runWorker(t *testing.T, image, databaseURL, id string, env []string, extraArgs ...string) *worker {
	t.Helper()
	w := &worker{name: "fenceq-test-" + randomHex(6), stderr: &syncbuf.Buffer{}, done: make(chan int, 1)}
	args := append([]string{"--runtime", "runc", "run", "--rm", "--name", w.name, "--env", "DATABASE_URL"}, runFlags...)
	for _, kv := range append(slices.Clone(workerEnv), env...) {
		args = append(args, "--env", kv)
	}
	cmd := exec.Command("podman", append(append(args, image), workerArgs(id, extraArgs...)...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	cmd.Stdout = w.stderr
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("podman run: %v", err)
	}
	go func() {
		err := cmd.Wait()
		var exit *exec.ExitError
		switch {
		case err == nil:
			w.done <- 0
		case errors.As(err, &exit):
			w.done <- exit.ExitCode()
		default:
			w.done <- -1
		}
	}()
	t.Cleanup(func() {
		// Gone already when the test waited for it; else it is killed now.
		if out, err := exec.Command("podman", "rm", "--force", "--ignore", w.name).CombinedOutput(); err != nil {
			t.Errorf("podman rm %s: %v: %s", w.name, err, out)
		}
		select {
		case <-w.done:
		case <-time.After(time.Minute):
			t.Errorf("podman run %s did not end", w.name)
		}
	})
	return w
}

// metricsAddr waits for the worker to log where it serves /metrics and /healthz.
func (w *worker) metricsAddr(t *testing.T) string {
	t.Helper()
	var addr string
	fenceqtest.WaitFor(t, "the worker's metrics server", time.Minute, func() bool {
		if m := metricsAddrRe.FindStringSubmatch(w.stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

// signal sends sig to the container's main process, the worker.
func (w *worker) signal(t *testing.T, sig string) {
	t.Helper()
	podman(t, "kill", "--signal", sig, w.name)
}

// wait returns the container's exit status once it has stopped.
func (w *worker) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-w.done:
		w.done <- code // for the cleanup
		return code
	case <-time.After(time.Minute):
		t.Fatalf("the container did not stop\n%s", w.stderr.String())
		return -1
	}
}

func podman(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("podman", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("podman %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func countWorkers(t *testing.T, ctx context.Context, db *fenceqtest.DB, id string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM fenceq_workers WHERE id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return string(b)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
