package cli_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
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

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 and its key, as PEM
// files, and returns their paths and a pool that trusts the certificate.
func writeSelfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fenceq test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// `fenceq ui --tls-cert --tls-key` serves HTTPS with a Secure __Host- session cookie;
// the two flags go together and a bad pair is a usage error.
func TestUIServesTLS(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cert, key, pool := writeSelfSigned(t)
	oneErrorLine(t, b.run(t, "ui", "--addr", "127.0.0.1:0", "--tls-cert", cert), "--tls-cert and --tls-key go together")
	oneErrorLine(t, b.run(t, "ui", "--addr", "127.0.0.1:0", "--tls-key", key), "--tls-cert and --tls-key go together")
	oneErrorLine(t, b.run(t, "ui", "--addr", "127.0.0.1:0", "--tls-cert", key, "--tls-key", cert), "--tls-cert")
	addr, _ := startUI(t, b, "ui", "--addr", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	res, err := client.Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET over TLS: %d", res.StatusCode)
	}
	ck := res.Header.Get("Set-Cookie")
	for _, want := range []string{"__Host-fenceq_session=", "Secure", "HttpOnly", "Path=/;"} {
		if !strings.Contains(ck, want) {
			t.Errorf("session cookie over TLS %q lacks %q", ck, want)
		}
	}
}

// Tokens and passwords shorter than 16 bytes are refused at start, saying why; a
// foreign Host is refused by `fenceq ui` without auth, and --allowed-hosts admits one.
func TestUIRefusesShortCredentialsAndForeignHosts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, args := range [][]string{{"--auth-token", "tok-9f8e7d6c5b4"}, {"--auth-basic", "ops:fifteen-bytes"}} {
		r := b.run(t, append([]string{"ui", "--addr", "127.0.0.1:0"}, args...)...)
		oneErrorLine(t, r, "brute force")
		if r.code != 2 || !strings.Contains(r.stderr, args[0]) {
			t.Errorf("%v: exit %d, %q; want 2 naming the flag", args, r.code, r.stderr)
		}
	}
	oneErrorLine(t, b.run(t, "ui", "--addr", "127.0.0.1:0", "--allowed-hosts", "http://dash.example.com"), "AllowedHosts")

	addr, _ := startUI(t, b, "ui", "--addr", "127.0.0.1:0", "--allowed-hosts", "dash.example.com,ops.example.com:8443")
	for host, want := range map[string]int{
		"rebind.example": http.StatusMisdirectedRequest, "ops.example.com": http.StatusMisdirectedRequest,
		"dash.example.com": http.StatusOK, "ops.example.com:8443": http.StatusOK, addr: http.StatusOK,
	} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/queues", nil)
		req.Host = host
		if got := status(t, req); got != want {
			t.Errorf("GET for host %s: %d; want %d", host, got, want)
		}
	}
}
