package email_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/jobs/email/emailtest"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

type relayBundle struct {
	db      *fenceqtest.DB
	ctx     context.Context
	smtp    *emailtest.Server
	mailer  *email.SMTPMailer
	metrics *countingMetrics
}

func setupRelay(t *testing.T, opts ...emailtest.Options) *relayBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	b := &relayBundle{db: fenceqtest.New(t, &fenceqtest.Options{MaxConns: 4}), ctx: ctx, metrics: newCountingMetrics()}
	b.smtp = emailtest.Start(t, opts...)
	b.mailer = newSMTP(t, email.SMTPConfig{Addr: b.smtp.Addr, StartTLS: email.StartTLSOff})
	return b
}

type countingMetrics struct {
	mu                         sync.Mutex
	delivered, retried, failed map[string]int
}

func newCountingMetrics() *countingMetrics {
	return &countingMetrics{delivered: map[string]int{}, retried: map[string]int{}, failed: map[string]int{}}
}

func (m *countingMetrics) Delivered(topic string) { m.mu.Lock(); m.delivered[topic]++; m.mu.Unlock() }
func (m *countingMetrics) Retried(topic string)   { m.mu.Lock(); m.retried[topic]++; m.mu.Unlock() }
func (m *countingMetrics) Failed(topic string)    { m.mu.Lock(); m.failed[topic]++; m.mu.Unlock() }

func (m *countingMetrics) counts() (delivered, retried, failed int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.delivered[email.TopicEmail], m.retried[email.TopicEmail], m.failed[email.TopicEmail]
}

type mailerFunc func(ctx context.Context, m email.Message) error

func (f mailerFunc) Send(ctx context.Context, m email.Message) error { return f(ctx, m) }

// startRelay runs a worker that serves only the outbox queue with the relay.
func (b *relayBundle) startRelay(t *testing.T, pool *pgxpool.Pool, id string, mailer email.Mailer, lease time.Duration,
	tune ...func(*outbox.RelayConfig)) *fenceq.Worker {
	t.Helper()
	hs := fenceq.NewHandlers()
	cfg := outbox.RelayConfig{Pool: pool, Logger: fenceqtest.QuietLogger(), Metrics: b.metrics,
		Backoff: &queue.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond}}
	for _, f := range tune {
		f(&cfg)
	}
	_, err := email.RegisterRelay(hs, cfg, email.DelivererConfig{Mailer: mailer})
	if err != nil {
		t.Fatalf("register relay: %v", err)
	}
	return fenceqtest.StartWorker(b.ctx, t, pool, fenceq.Config{
		Handlers: hs, ID: id, Queues: map[string]fenceq.QueueConfig{outbox.Queue: {MaxWorkers: 4}},
		LeaseDuration: lease, ReaperInterval: lease / 4, PollInterval: 50 * time.Millisecond, Logger: fenceqtest.QuietLogger(),
	})
}

// insertEmails writes n email outbox rows in one transaction, as a job's commit would.
func (b *relayBundle) insertEmails(t *testing.T, maxAttempts int, payloads ...string) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		for i, p := range payloads {
			res, err := outbox.Insert(b.ctx, tx, outbox.Message{Topic: email.TopicEmail,
				DedupeKey: fmt.Sprintf("test-email:%d:%d", time.Now().UnixNano(), i), Payload: []byte(p), MaxAttempts: maxAttempts})
			if err != nil {
				return err
			}
			ids = append(ids, res.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("insert outbox rows: %v", err)
	}
	return ids
}

func (b *relayBundle) row(t *testing.T, id int64) *outbox.Row {
	t.Helper()
	o, err := outbox.Get(b.ctx, b.db.Pool, id)
	if err != nil {
		t.Fatalf("get outbox row %d: %v", id, err)
	}
	return o
}

func (b *relayBundle) waitRow(t *testing.T, id int64, want outbox.State, within time.Duration) *outbox.Row {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		o := b.row(t, id)
		if o.State == want {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox row %d is %s after %s, want %s (last error %v, job %s)", id, o.State, within, want,
				deref(o.LastError), o.DeliveryJobState)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func payload(to string) string {
	return `{"to": "` + to + `", "subject": "Your invoice", "text": "Total: 10.00 USD"}`
}

func TestRelayDeliversWithDerivedHeadersAndRetriesTransientErrors(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.smtp.RejectRecipient("flaky@example.com", 451, "greylisted, try again", 1)
	b.startRelay(t, b.db.NewPool(t, 4), "relay-1", b.mailer, 2*time.Second)
	ids := b.insertEmails(t, 0, payload("ada@example.com"), payload("flaky@example.com"))

	ok := b.waitRow(t, ids[0], outbox.StateDelivered, 10*time.Second)
	flaky := b.waitRow(t, ids[1], outbox.StateDelivered, 10*time.Second)
	if ok.Attempt != 1 || ok.LeasedBy == nil || *ok.LeasedBy != "relay-1" || ok.DeliveryJobState != queue.StateCompleted {
		t.Fatalf("delivered row: %+v", ok)
	}
	if flaky.Attempt != 2 || flaky.LastError != nil {
		t.Fatalf("row delivered after a 451: attempt %d, last error %q", flaky.Attempt, deref(flaky.LastError))
	}
	job, err := store.GetJob(b.ctx, b.db.Pool, *flaky.DeliveryJobID)
	if err != nil || len(job.Errors) != 1 || !strings.Contains(job.Errors[0].Error, "451") {
		t.Fatalf("delivery job of the flaky row: %v %+v", err, job)
	}
	got := b.smtp.Received()
	if len(got) != 2 {
		t.Fatalf("server accepted %d messages, want 2", len(got))
	}
	for _, r := range got {
		var row *outbox.Row
		for _, o := range []*outbox.Row{ok, flaky} {
			if r.MessageID == email.MessageIDFor(o.DedupeKey, "") {
				row = o
			}
		}
		if row == nil || r.IdempotencyKey != outbox.DeliveryKey(row.DedupeKey) || r.Subject != "Your invoice" {
			t.Fatalf("message %+v does not carry its row's derived headers", r.Header)
		}
	}
	if d, r, f := b.metrics.counts(); d != 2 || r != 1 || f != 0 {
		t.Fatalf("metrics delivered=%d retried=%d failed=%d, want 2 1 0", d, r, f)
	}
}

func TestRelayMarksPermanentRejectionsAndLastAttemptsFailed(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.smtp.RejectRecipient("nobody@example.com", 550, "no such user here", -1)
	b.smtp.RejectRecipient("full@example.com", 452, "mailbox full", -1)
	b.startRelay(t, b.db.NewPool(t, 4), "relay-1", b.mailer, 2*time.Second)
	perm := b.insertEmails(t, 0, payload("nobody@example.com"), `{"to": ["not an address"], "subject": "x"}`)
	last := b.insertEmails(t, 2, payload("full@example.com"))

	rejected := b.waitRow(t, perm[0], outbox.StateFailed, 10*time.Second)
	// The row is marked failed under the lease, then the job is discarded: not retried.
	fenceqtest.WaitState(t, b.db.Pool, *rejected.DeliveryJobID, queue.StateDiscarded, 10*time.Second)
	if rejected.Attempt != 1 || !strings.Contains(deref(rejected.LastError), "550") ||
		!strings.Contains(deref(rejected.LastError), "no such user here") {
		t.Fatalf("permanently rejected row: %+v (last error %q)", rejected, deref(rejected.LastError))
	}
	invalid := b.waitRow(t, perm[1], outbox.StateFailed, 10*time.Second)
	if !strings.Contains(deref(invalid.LastError), "to[0]") {
		t.Fatalf("invalid payload row: last error %q", deref(invalid.LastError))
	}
	exhausted := b.waitRow(t, last[0], outbox.StateFailed, 10*time.Second)
	if exhausted.Attempt != 2 || !strings.Contains(deref(exhausted.LastError), "attempt 2 of 2") ||
		!strings.Contains(deref(exhausted.LastError), "mailbox full") {
		t.Fatalf("row past its attempts: %+v (last error %q)", exhausted, deref(exhausted.LastError))
	}
	// Each delivery job ends after its row is marked failed (and counted): discarded.
	// Until then the relay's handler may still be running, its metrics not yet counted,
	// and an operator's retry refused.
	for _, row := range []*outbox.Row{invalid, exhausted} {
		fenceqtest.WaitState(t, b.db.Pool, *row.DeliveryJobID, queue.StateDiscarded, 10*time.Second)
	}
	if n := len(b.smtp.Received()); n != 0 {
		t.Fatalf("server accepted %d messages, want 0", n)
	}
	if d, r, f := b.metrics.counts(); d != 0 || r != 1 || f != 3 {
		t.Fatalf("metrics delivered=%d retried=%d failed=%d, want 0 1 3", d, r, f)
	}
	st, err := outbox.Stats(b.ctx, b.db.Pool)
	if err != nil || st.Failed != 3 || st.Pending != 0 {
		t.Fatalf("outbox stats: %+v %v", st, err)
	}
	// Failed rows are kept and can be retried by an operator once the cause is fixed.
	b.smtp.RejectRecipient("full@example.com", 452, "mailbox full", 0)
	if _, err := outbox.Retry(b.ctx, b.db.Pool, last[0]); err != nil {
		t.Fatalf("retry: %v", err)
	}
	retried := b.waitRow(t, last[0], outbox.StateDelivered, 10*time.Second)
	if retried.Attempt != 3 {
		t.Fatalf("retried row: attempt %d, want 3", retried.Attempt)
	}
}

// The relay is killed after the SMTP server accepted a message but
// before the row was marked delivered. The next holder delivers it again with the same
// Message-ID; a receiver deduplicating by Message-ID sees one message; the killed
// relay's late mark is rejected by the fence.
func TestRelayKilledAfterAcceptRedeliversWithSameMessageID(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	lease := time.Second
	poolA, cutA := b.db.PartitionedPool(t, 4)
	accepted := make(chan email.Message, 1)
	resume := make(chan struct{})
	var resumeOnce sync.Once
	var crashed atomic.Bool
	mailerA := mailerFunc(func(ctx context.Context, m email.Message) error {
		err := b.mailer.Send(ctx, m)
		if err == nil && crashed.CompareAndSwap(false, true) {
			// The server said 250; the relay dies before it can write anything.
			cutA.Store(true)
			accepted <- m
			<-resume
		}
		return err
	})
	b.startRelay(t, poolA, "relay-A", mailerA, lease)
	t.Cleanup(func() { resumeOnce.Do(func() { close(resume) }) })
	id := b.insertEmails(t, 0, payload("ada@example.com"))[0]

	var sent email.Message
	select {
	case sent = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("relay A never sent the message")
	}
	before := b.row(t, id)
	if before.State != outbox.StatePending || before.LeasedBy == nil || *before.LeasedBy != "relay-A" || before.Attempt != 1 {
		t.Fatalf("row after A's send: %+v", before)
	}
	genA := before.LeaseGen
	if n := len(b.smtp.Received()); n != 1 {
		t.Fatalf("server accepted %d messages before the crash, want 1", n)
	}

	// Another relay takes over once A's lease expires.
	b.startRelay(t, b.db.NewPool(t, 4), "relay-B", b.mailer, lease)
	after := b.waitRow(t, id, outbox.StateDelivered, 15*time.Second)
	if after.LeasedBy == nil || *after.LeasedBy != "relay-B" || after.LeaseGen <= genA || after.Attempt != 2 {
		t.Fatalf("row delivered by B: %+v (A held generation %d)", after, genA)
	}
	var revoked int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_lease_events WHERE job_id = $1 AND lease_gen = $2 AND kind = 'revoked'`,
		*after.DeliveryJobID, genA).Scan(&revoked); err != nil || revoked != 1 {
		t.Fatalf("revocation of A's lease: %d events, %v", revoked, err)
	}

	got := b.smtp.Received()
	if len(got) != 2 {
		t.Fatalf("server accepted %d messages, want 2 (the original and the redelivery)", len(got))
	}
	if got[0].MessageID != sent.MessageID || got[1].MessageID != sent.MessageID ||
		got[0].IdempotencyKey != got[1].IdempotencyKey || !bytes.Equal(got[0].Raw, got[1].Raw) {
		t.Fatalf("redelivery differs: %q/%q vs %q/%q", got[0].MessageID, got[0].IdempotencyKey, got[1].MessageID, got[1].IdempotencyKey)
	}
	if d := b.smtp.Deduped(); len(d) != 1 || d[0].MessageID != sent.MessageID {
		t.Fatalf("receiver dedupe by Message-ID kept %d messages, want 1", len(d))
	}

	// A comes back and tries to mark the row delivered: the fence rejects it.
	cutA.Store(false)
	resumeOnce.Do(func() { close(resume) })
	fenceqtest.WaitFor(t, "relay A's late write to be rejected", 10*time.Second, func() bool {
		var n int64
		err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM fenceq_lease_events
			WHERE job_id = $1 AND lease_gen = $2 AND worker_id = 'relay-A' AND kind = $3`,
			*after.DeliveryJobID, genA, queue.EventStaleWriteRejected).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if final := b.row(t, id); final.State != outbox.StateDelivered || final.LeaseGen != after.LeaseGen || final.Attempt != 2 {
		t.Fatalf("row changed after A's rejected write: %+v", final)
	}
}

// Test 3, second half: two relays side by side never deliver one row concurrently, and
// in healthy operation each row is sent exactly once.
func TestTwoRelaysNeverDeliverOneRowConcurrently(t *testing.T) {
	t.Parallel()
	b := setupRelay(t, emailtest.Options{DataDelay: 20 * time.Millisecond})
	const n = 40
	payloads := make([]string, n)
	for i := range payloads {
		payloads[i] = payload(fmt.Sprintf("c%d@example.com", i))
	}
	ids := b.insertEmails(t, 0, payloads...)
	b.startRelay(t, b.db.NewPool(t, 3), "relay-A", b.mailer, 2*time.Second)
	b.startRelay(t, b.db.NewPool(t, 3), "relay-B", b.mailer, 2*time.Second)

	by := map[string]int{}
	for _, id := range ids {
		o := b.waitRow(t, id, outbox.StateDelivered, 20*time.Second)
		if o.Attempt != 1 || o.LeasedBy == nil {
			t.Fatalf("row %d: %+v", id, o)
		}
		by[*o.LeasedBy]++
	}
	if by["relay-A"] == 0 || by["relay-B"] == 0 {
		t.Fatalf("both relays should have delivered rows: %v", by)
	}
	if c := b.smtp.MaxConcurrentPerMessageID(); c != 1 {
		t.Fatalf("a message was in DATA %d times at once", c)
	}
	counts := b.smtp.CountByMessageID()
	if len(counts) != n {
		t.Fatalf("%d distinct Message-IDs, want %d", len(counts), n)
	}
	for id, c := range counts {
		if c != 1 {
			t.Fatalf("Message-ID %s accepted %d times", id, c)
		}
	}
}

// A delivery job discarded by the reaper without any handler running (its holder crashed
// at every attempt) leaves its row pending: the orphan sweep marks it failed with the
// reason, and an operator retry delivers it. Rows are never dropped.
func TestRelayOrphanedRowIsFailedThenRetried(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	id := b.insertEmails(t, 1, payload("ada@example.com"))[0]
	jobs, err := store.Claim(b.ctx, b.db.Pool, store.ClaimParams{Queue: outbox.Queue, WorkerID: "crashed", Limit: 1, Lease: time.Minute})
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim: %v %d", err, len(jobs))
	}
	if _, err := b.db.Pool.Exec(b.ctx, `UPDATE fenceq_jobs_hot SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, jobs[0].ID); err != nil {
		t.Fatal(err)
	}
	if revs, err := store.Reap(b.ctx, b.db.Pool, store.ReapParams{HolderFresh: time.Second}); err != nil || len(revs) != 1 || revs[0].State != queue.StateDiscarded {
		t.Fatalf("reap: %v %+v", err, revs)
	}
	if st, _ := outbox.Stats(b.ctx, b.db.Pool); st.Orphaned != 1 || st.Pending != 1 {
		t.Fatalf("stats: %+v", st)
	}
	if swept, err := outbox.FailOrphaned(b.ctx, b.db.Pool, 10); err != nil || len(swept) != 1 {
		t.Fatalf("sweep: %v %v", swept, err)
	}
	if o := b.row(t, id); o.State != outbox.StateFailed || !strings.Contains(deref(o.LastError), "discarded") {
		t.Fatalf("swept row: %+v", o)
	}
	b.startRelay(t, b.db.NewPool(t, 4), "relay-1", b.mailer, 2*time.Second)
	if _, err := outbox.Retry(b.ctx, b.db.Pool, id); err != nil {
		t.Fatal(err)
	}
	b.waitRow(t, id, outbox.StateDelivered, 10*time.Second)
	if n := len(b.smtp.Received()); n != 1 {
		t.Fatalf("server accepted %d messages, want 1", n)
	}
}

func TestRegisterValidatesConfig(t *testing.T) {
	t.Parallel()
	hs := fenceq.NewHandlers()
	if _, err := email.RegisterRelay(hs, outbox.RelayConfig{}, email.DelivererConfig{}); err == nil || !strings.Contains(err.Error(), "Pool") {
		t.Fatalf("no pool: %v", err)
	}
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 1, NoMigrate: true})
	if _, err := email.RegisterRelay(hs, outbox.RelayConfig{Pool: db.Pool}, email.DelivererConfig{}); err == nil || !strings.Contains(err.Error(), "Mailer") {
		t.Fatalf("no mailer: %v", err)
	}
	fm, err := email.NewFileMailer("-")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := email.RegisterRelay(hs, outbox.RelayConfig{Pool: db.Pool}, email.DelivererConfig{Mailer: fm}); err != nil {
		t.Fatal(err)
	}
	if _, err := email.RegisterRelay(hs, outbox.RelayConfig{Pool: db.Pool}, email.DelivererConfig{Mailer: fm}); err == nil {
		t.Fatal("registered the relay twice")
	}
}

// A send slower than the relay's WriteTimeout must still be recorded: the write after it
// gets its own timeout. With the clock started before the send, marking the row
// delivered failed every time and each retry sent the message again.
func TestRelaySlowSendIsStillMarkedDelivered(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	const writeTimeout, sendTakes = 200 * time.Millisecond, 600 * time.Millisecond
	var sends atomic.Int32
	slow := mailerFunc(func(ctx context.Context, m email.Message) error {
		sends.Add(1)
		select {
		case <-time.After(sendTakes):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	b.startRelay(t, b.db.Pool, "slow-relay", slow, 10*time.Second, func(c *outbox.RelayConfig) { c.WriteTimeout = writeTimeout })
	ids := b.insertEmails(t, 3, payload("slow@example.com"))
	b.waitRow(t, ids[0], outbox.StateDelivered, 20*time.Second)
	if n := sends.Load(); n != 1 {
		t.Fatalf("message sent %d times, want once", n)
	}
}
