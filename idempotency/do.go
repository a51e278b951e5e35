package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/queue"
)

// Metrics counts what the mechanism decides, so that operators can alert on it firing
// (conflicts, in-flight waits) rather than on its symptoms. Methods must be fast and
// safe for concurrent use: they are called on the request path.
type Metrics interface {
	// Replay counts a request answered with the stored response of an earlier one.
	Replay(scope string)
	// Conflict counts a key reused with a different request.
	Conflict(scope string)
	// InflightWait counts a request that found its key held by a request still in
	// flight: it waited for that transaction and then replayed its result, or gave up
	// past the wait. (A request that waited for an owner that then rolled back becomes
	// the owner and is not counted: it cannot tell.)
	InflightWait(scope string)
}

// NopMetrics counts nothing.
type NopMetrics struct{}

// Replay implements Metrics.
func (NopMetrics) Replay(string) {}

// Conflict implements Metrics.
func (NopMetrics) Conflict(string) {}

// InflightWait implements Metrics.
func (NopMetrics) InflightWait(string) {}

var _ Metrics = NopMetrics{}

// Scope is one key space and how its keys behave. Its methods run a request under a key
// in one call. The zero values of TTL, Wait and Metrics take the defaults.
type Scope struct {
	// Name separates key spaces, e.g. "orders": 1–128 characters of letters, digits and
	// "_ . : -".
	Name string
	// TTL is how long a finished key is remembered. Defaults to DefaultTTL.
	TTL time.Duration
	// Wait bounds how long a request waits for an uncommitted first request with its
	// key. Defaults to DefaultWait.
	Wait time.Duration
	// Metrics defaults to NopMetrics.
	Metrics Metrics
}

// Work does a request's work in tx, as the owner of its key, and returns the response
// that every retry with the key gets back. An error rolls everything back, the key
// included; return one matching ErrKeyReuse when the work itself finds that the key
// belongs to another request (it is counted as a conflict).
type Work func(ctx context.Context, tx pgx.Tx) (Response, error)

// Result is the outcome of a request run under a key.
type Result struct {
	// Response is the work's response, or on a replay the stored one.
	Response Response
	// Replayed is true when the key was finished by an earlier request with the same
	// hash: the work did not run.
	Replayed bool
	// Waited is true when the key's first request was still uncommitted as this one
	// arrived, and this one waited for it.
	Waited bool
	// Record is the key's row: as finished by this request, or as stored.
	Record *Record
}

func (s *Scope) metrics() Metrics {
	if s.Metrics == nil {
		return NopMetrics{}
	}
	return s.Metrics
}

// DoTx runs a request under key in the caller's transaction (for example a job's
// fenced Commit): it claims the key, runs work if this request owns it and stores the
// response with the key, all in tx, or replays the stored response. hash identifies the
// request (HashRequest of its canonical form). Errors: ErrKeyReuse (the key was used
// with another hash; Result.Record is the stored key), ErrKeyInFlight (the first
// request did not finish within Wait), a validation error matching queue.ErrInvalid,
// or work's error. On any error roll tx back. tx must run at READ COMMITTED.
func (s *Scope) DoTx(ctx context.Context, tx pgx.Tx, key string, hash []byte, work Work) (*Result, error) {
	m := s.metrics()
	claim, err := Claim(ctx, tx, ClaimParams{Scope: s.Name, Key: key, RequestHash: hash, TTL: s.TTL, Wait: s.Wait})
	switch {
	case errors.Is(err, ErrKeyInFlight):
		m.InflightWait(s.Name)
		return nil, err
	case errors.Is(err, ErrKeyReuse):
		m.Conflict(s.Name)
		return &Result{Record: claim.Record, Waited: claim.Waited}, err
	case err != nil:
		return nil, err
	}
	if claim.Waited {
		m.InflightWait(s.Name)
	}
	if !claim.Owned {
		m.Replay(s.Name)
		rec := claim.Record
		return &Result{Replayed: true, Waited: claim.Waited, Record: rec, Response: Response{
			ResourceID: rec.ResourceID, Status: rec.ResponseStatus, Body: rec.Response}}, nil
	}
	resp, err := work(ctx, tx)
	if err != nil {
		if errors.Is(err, ErrKeyReuse) {
			m.Conflict(s.Name)
		}
		return nil, err
	}
	rec, err := Finish(ctx, tx, claim.Record, resp)
	if err != nil {
		return nil, err
	}
	return &Result{Response: resp, Waited: claim.Waited, Record: rec}, nil
}

// Do is DoTx in a transaction of its own on db, committed when the request is done or
// replayed and rolled back on any error.
func (s *Scope) Do(ctx context.Context, db queue.Beginner, key string, hash []byte, work Work) (*Result, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("idempotency key %q in scope %q: begin: %w", queue.StorableText(key, 64), s.Name, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := s.DoTx(ctx, tx, key, hash, work)
	if err != nil {
		return res, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("idempotency key %q in scope %q: commit: %w", queue.StorableText(key, 64), s.Name, err)
	}
	return res, nil
}
