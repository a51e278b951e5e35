// Package fenceqhttp runs kinds of jobs by POSTing their args to HTTP endpoints, for
// workers whose job code is not Go: the standalone `fenceq worker --http KIND=URL`, or
// any Go worker that adds such kinds with Add.
//
// The worker claims, heartbeats, times out and retries an HTTP kind's jobs as it does a
// Go handler's; the request is the handler. Each request is a POST of the job's args
// (Content-Type application/json) with these headers:
//
//	Fenceq-Job-Id      the job's id
//	Fenceq-Lease-Gen   the generation of the lease the attempt runs under
//	Fenceq-Attempt     the attempt's number, from 1
//	Fenceq-Deadline    RFC 3339: the lease's local deadline, or the kind's timeout when sooner
//	Fenceq-Signature   sha256=<hex of HMAC-SHA256(secret, "<job id>.<lease gen>.<body>")>
//
// The request runs under the job's context: it is cancelled when the lease is lost,
// when its local deadline passes without a confirmed renewal, and at the kind's
// timeout. The response decides the attempt's outcome:
//
//   - 2xx: the job is completed. An endpoint that writes results calls the SQL function
//     fenceq_complete(job_id, lease_gen) in the transaction of its result rows, before it
//     answers: the rows and the completion commit together, and only under the lease. The
//     worker's own completion then finds the job completed under the same generation and
//     writes nothing more. Otherwise the worker completes the job and records the body
//     as its output (fenceq.RecordOutput): as JSON when it is JSON that jsonb can store,
//     else as a JSON string (NUL bytes replaced), cut to fit queue.MaxOutputBytes.
//   - 429 or 503 with Retry-After (seconds or an HTTP date): the job is snoozed for that
//     long (fenceq.JobSnooze); no attempt is used up.
//   - any other 4xx: the job is discarded (fenceq.JobDiscard), the status and the start
//     of the body in its errors; with Endpoint.RetryClientErrors it is retried instead.
//   - 5xx, 3xx (redirects are not followed), 429 and 503 without a valid Retry-After,
//     timeouts and connection errors: the attempt fails and the job is retried under
//     the kind's policy.
//
// TLS certificates are always verified.
package fenceqhttp

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// The headers of every request.
const (
	HeaderJobID     = "Fenceq-Job-Id"
	HeaderLeaseGen  = "Fenceq-Lease-Gen"
	HeaderAttempt   = "Fenceq-Attempt"
	HeaderDeadline  = "Fenceq-Deadline"
	HeaderSignature = "Fenceq-Signature"
)

// signaturePrefix names the algorithm in HeaderSignature.
const signaturePrefix = "sha256="

// deadlineFormat is RFC 3339 with milliseconds, which every language's parser takes.
const deadlineFormat = "2006-01-02T15:04:05.000Z07:00"

// maxErrorBody bounds the part of a response body kept in a failed attempt's error.
const maxErrorBody = 1024

// maxRetryAfter bounds the snooze a Retry-After header can ask for.
const maxRetryAfter = 30 * 24 * time.Hour

// ErrSignature is matched (errors.Is) by every error of Verify.
var ErrSignature = errors.New("fenceqhttp: request not signed by the worker")

// Metrics counts the endpoints' responses. fenceqprom's Metrics.HTTP implements it.
// Methods must be fast and safe for concurrent use.
type Metrics interface {
	// Response counts one request of kind: its HTTP status, or 0 when no response came
	// (connection error, timeout, cancelled job).
	Response(kind string, status int)
}

// Endpoint is one kind of job run by an HTTP endpoint.
type Endpoint struct {
	// Kind is the kind of job the endpoint runs.
	Kind string
	// URL is where the args are POSTed: http or https.
	URL string
	// Secret signs every request (HeaderSignature). It must not be empty.
	Secret []byte
	// RetryClientErrors makes a 4xx response (other than 429 or 503 with Retry-After)
	// fail the attempt, retried under the kind's policy, instead of discarding the job.
	RetryClientErrors bool
	// Opts tunes the kind as for a Go handler: Timeout bounds each request, Backoff and
	// NextRetry the retries. Nil takes the worker's defaults.
	Opts *fenceq.HandlerOpts
	// Client sends the requests; nil takes a client of its own. Its redirects are not
	// followed: a 3xx fails the attempt.
	Client *http.Client
	// Metrics, when set, counts the responses.
	Metrics Metrics
}

// Add registers ep's kind on hs (fenceq.AddRawHandler). It fails for an invalid kind or
// URL, an empty secret, or a kind already registered.
func Add(hs *fenceq.Handlers, ep Endpoint) error {
	u, err := url.Parse(ep.URL)
	if err != nil {
		return fmt.Errorf("fenceqhttp: kind %q: URL: %w", ep.Kind, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("fenceqhttp: kind %q: URL %q: want an absolute http or https URL", ep.Kind, u.Redacted())
	}
	if len(ep.Secret) == 0 {
		return fmt.Errorf("fenceqhttp: kind %q: empty secret: every request must be signed", ep.Kind)
	}
	c := &caller{ep: ep, url: u.String(), shown: u.Redacted()}
	c.ep.Secret = bytes.Clone(ep.Secret)
	client := http.Client{Transport: http.DefaultTransport}
	if ep.Client != nil {
		client = *ep.Client
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.client = &client
	if err := fenceq.AddRawHandler(hs, ep.Kind, c.work, ep.Opts); err != nil {
		return fmt.Errorf("fenceqhttp: %w", err)
	}
	return nil
}

type caller struct {
	ep     Endpoint
	url    string
	shown  string // the URL with any password redacted, for errors
	client *http.Client
}

// work is the kind's handler: one request, its response mapped to the attempt's outcome.
func (c *caller) work(ctx context.Context, job *fenceq.Job[fenceq.RawArgs]) error {
	body, err := job.Args.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode args: %w", err)
	}
	lease := job.Lease()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("POST %s: %w", c.shown, err)
	}
	deadline := job.LeaseDeadline()
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "fenceq/"+fenceq.Version)
	req.Header.Set(HeaderJobID, strconv.FormatInt(lease.JobID, 10))
	req.Header.Set(HeaderLeaseGen, strconv.FormatInt(lease.Gen, 10))
	req.Header.Set(HeaderAttempt, strconv.Itoa(job.Attempt))
	req.Header.Set(HeaderDeadline, deadline.UTC().Format(deadlineFormat))
	req.Header.Set(HeaderSignature, sign(c.ep.Secret, lease.JobID, lease.Gen, body))

	resp, err := c.client.Do(req)
	if err != nil {
		c.count(0)
		return err // a *url.Error: the method, the URL (password redacted) and the cause
	}
	defer resp.Body.Close()
	c.count(resp.StatusCode)
	return c.outcome(ctx, resp)
}

func (c *caller) count(status int) {
	if c.ep.Metrics != nil {
		c.ep.Metrics.Response(c.ep.Kind, status)
	}
}

// outcome maps a response to the attempt's outcome (see the package doc).
func (c *caller) outcome(ctx context.Context, resp *http.Response) error {
	status := resp.StatusCode
	switch {
	case status >= 200 && status < 300:
		b, err := io.ReadAll(io.LimitReader(resp.Body, queue.MaxOutputBytes+1))
		if err != nil {
			// The endpoint answered 2xx: the job is done whatever became of its body.
			return nil
		}
		if out := output(b); out != nil {
			if err := fenceq.RecordOutput(ctx, out); err != nil {
				return fmt.Errorf("record the response of %s as output: %w", c.shown, err)
			}
		}
		return nil
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return fenceq.JobSnooze(d)
		}
		return c.statusError(resp, " (no valid Retry-After)")
	case status >= 400 && status < 500:
		err := c.statusError(resp, "")
		if c.ep.RetryClientErrors {
			return err
		}
		return fenceq.JobDiscard(err)
	case status >= 300 && status < 400:
		return c.statusError(resp, fmt.Sprintf(" (redirect to %q not followed)", resp.Header.Get("Location")))
	default:
		return c.statusError(resp, "")
	}
}

// statusError is the error of an attempt whose endpoint answered with a status that is
// not 2xx, kept in the job's errors: the endpoint (its password redacted), the status,
// a note (a missing Retry-After, a redirect) and the start of the body.
type statusError struct {
	URL    string
	Status int
	Body   string
	Note   string
}

func (e *statusError) Error() string {
	msg := fmt.Sprintf("POST %s: %d %s%s", e.URL, e.Status, http.StatusText(e.Status), e.Note)
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

func (c *caller) statusError(resp *http.Response, note string) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return &statusError{URL: c.shown, Status: resp.StatusCode, Body: strings.ToValidUTF8(string(b), "\uFFFD"), Note: note}
}

// output returns a 2xx body as the job's output: the body itself when it is JSON that
// fits queue.MaxOutputBytes, else the body as a JSON string, cut to fit; nil for an
// empty body.
func output(b []byte) json.RawMessage {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if len(b) <= queue.MaxOutputBytes && json.Valid(b) && queue.ValidateOutput(b) == nil {
		return json.RawMessage(b)
	}
	// Else the body as text, in what jsonb can store: valid UTF-8 without NUL.
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	for {
		enc, err := json.Marshal(s)
		if err == nil && len(enc) <= queue.MaxOutputBytes {
			return enc
		}
		// Cut what is over (at least a tenth), at a rune boundary.
		over := max(len(enc)-queue.MaxOutputBytes, len(s)/10, 1)
		cut := max(len(s)-over, 0)
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
}

// retryAfter parses a Retry-After value: delay seconds or an HTTP date (taken against
// now). A date in the past is no delay. It reports false for a missing or malformed
// value, or one beyond 30 days.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > int64(maxRetryAfter/time.Second) {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := max(t.Sub(now), 0)
	if d > maxRetryAfter {
		return 0, false
	}
	return d, true
}

// sign returns the HeaderSignature value of a request: "sha256=" and the hex of
// HMAC-SHA256 under secret of the job id and lease generation in decimal and the body,
// joined by dots.
func sign(secret []byte, jobID, leaseGen int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "%d.%d.", jobID, leaseGen)
	m.Write(body)
	return signaturePrefix + hex.EncodeToString(m.Sum(nil))
}

// Verify checks, for a Go endpoint, that r was sent by a worker holding secret: that
// its HeaderSignature is the HMAC-SHA256 under secret of its HeaderJobID, its
// HeaderLeaseGen and body (the request body, read whole by the caller), as
// "<job id>.<lease gen>.<body>". Errors match ErrSignature and say what was wrong; answer
// them with 401 (a 4xx discards the job, so a worker with the wrong secret stops
// retrying). The signature proves the sender, not that the lease is still held: write
// results with fenceq_complete, which the database fences.
func Verify(secret []byte, r *http.Request, body []byte) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: empty secret", ErrSignature)
	}
	id, err := strconv.ParseInt(r.Header.Get(HeaderJobID), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: header %s: %q is not a job id", ErrSignature, HeaderJobID, r.Header.Get(HeaderJobID))
	}
	gen, err := strconv.ParseInt(r.Header.Get(HeaderLeaseGen), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: header %s: %q is not a lease generation", ErrSignature, HeaderLeaseGen, r.Header.Get(HeaderLeaseGen))
	}
	got := r.Header.Get(HeaderSignature)
	if got == "" {
		return fmt.Errorf("%w: header %s missing", ErrSignature, HeaderSignature)
	}
	if !strings.HasPrefix(got, signaturePrefix) {
		return fmt.Errorf("%w: header %s: want %s<hex>", ErrSignature, HeaderSignature, signaturePrefix)
	}
	if !hmac.Equal([]byte(got), []byte(sign(secret, id, gen, body))) {
		return fmt.Errorf("%w: header %s does not match job %d, lease generation %d and the body", ErrSignature, HeaderSignature, id, gen)
	}
	return nil
}
