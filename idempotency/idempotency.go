// Package idempotency makes a retried request return the first request's result instead of
// doing the work again. The decision is one atomic conditional write in the transaction
// that does the work:
//
//	BEGIN;
//	INSERT INTO fenceq_idempotency_keys … ON CONFLICT (scope, key) DO NOTHING RETURNING …;
//	-- inserted: this transaction owns the key; do the work, then Finish.
//	-- conflict: read the stored row; same request hash: replay its response,
//	--           different hash: ErrKeyReuse.
//	COMMIT;
//
// Under READ COMMITTED a concurrent owner's uncommitted insert of the same key makes the
// INSERT wait for that transaction: if it commits, the INSERT conflicts and the stored
// result is read; if it rolls back (its process died), the INSERT succeeds and this
// request becomes the owner. The wait is bounded by ClaimParams.Wait (lock_timeout);
// past it the claim fails with ErrKeyInFlight and the transaction is aborted.
//
// Keys expire TTL after they were finished; an expired key behaves as absent (the next
// claim takes it over). DeleteExpired removes expired finished keys and
// never an in-flight one.
//
// Do and DoTx wrap the whole decision in one call: claim the key, run the work if this
// request owns it, store its response, or replay the stored one.
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// ErrKeyInFlight means the idempotency key is held by a request that has not finished:
// its owner's transaction did not commit within the wait, or an owner working in
// separate transactions has not finished the key yet. Retry later with the same key.
var ErrKeyInFlight = errors.New("idempotency key is in flight: the first request with this key has not finished")

// ErrKeyReuse means an idempotency key was reused with a different request.
var ErrKeyReuse = errors.New("idempotency key reused with a different request")

// ErrNotOwned means a finish or release came from a claim that no longer owns the key:
// the key expired and was taken over, or was released.
var ErrNotOwned = errors.New("idempotency key is no longer owned by this claim")

// Defaults and limits.
const (
	// DefaultTTL is how long a finished key is kept.
	DefaultTTL = 24 * time.Hour
	// DefaultWait bounds how long a claim waits for an in-flight owner.
	DefaultWait = 2 * time.Second
	// MaxScopeLen bounds a scope name.
	MaxScopeLen = 128
	// MaxRequestHashLen bounds a request hash (a SHA-512 fits).
	MaxRequestHashLen = 64
)

// State is the state of an idempotency key.
type State string

// Idempotency key states.
const (
	// StateInFlight: the owner has not stored a result yet.
	StateInFlight State = "in_flight"
	// StateFinished: the result is stored and is replayed to retries until the key expires.
	StateFinished State = "finished"
)

// Record is one row of fenceq_idempotency_keys.
type Record struct {
	Scope       string
	Key         string
	RequestHash []byte
	State       State
	// Gen is the ownership generation; it grows when an expired key is taken over.
	// Finish and Release are fenced by it.
	Gen        int64
	ResourceID string
	// ResponseStatus and Response are what the owner stored (e.g. an HTTP status and
	// body), replayed byte for byte.
	ResponseStatus int
	Response       []byte
	CreatedAt      time.Time
	FinishedAt     *time.Time
	ExpiresAt      time.Time
	// Expired is expires_at < now() by the database's clock when the row was read.
	Expired bool
}

// ClaimParams describes one claim of an idempotency key.
type ClaimParams struct {
	// Scope separates key spaces (e.g. "orders"): 1–128 characters of letters, digits
	// and "_ . : -".
	Scope string
	// Key is the client's idempotency key: 1–255 printable characters.
	Key string
	// RequestHash identifies the request (1–64 bytes, e.g. HashRequest of its canonical
	// form). A retry must send the same request; another one is ErrKeyReuse.
	RequestHash []byte
	// TTL is how long the key lives. Defaults to DefaultTTL.
	TTL time.Duration
	// Wait bounds how long the claim waits for an uncommitted owner of the same key,
	// through a transaction-local lock_timeout that is restored afterwards. Defaults to
	// DefaultWait; negative leaves lock_timeout as the session has it.
	Wait time.Duration
}

// ClaimResult is the outcome of Claim.
type ClaimResult struct {
	// Record is the key's row as this transaction sees it.
	Record *Record
	// Owned is true when this transaction holds the key: do the work and call
	// Finish before COMMIT (or in a later transaction). When false, the
	// key is finished with the same request hash: replay Record's response.
	Owned bool
	// Waited is true when another owner held the key, uncommitted, as the claim arrived
	// and committed while the claim waited for it. (A claim whose wait ended in the other
	// owner's rollback owns the key and cannot tell that it waited.)
	Waited bool
	// TookOver is true when the key existed but had expired, and was claimed anew.
	TookOver bool
}

func (p *ClaimParams) normalize() error {
	if err := queue.ValidateName("scope", p.Scope, MaxScopeLen); err != nil {
		return err
	}
	if err := queue.ValidateUniqueKey("idempotency_key", p.Key); err != nil {
		return err
	}
	if len(p.RequestHash) == 0 || len(p.RequestHash) > MaxRequestHashLen {
		return invalid("request_hash", "is %d bytes; want 1–%d", len(p.RequestHash), MaxRequestHashLen)
	}
	if p.TTL < 0 {
		return invalid("ttl", "%s is negative", p.TTL)
	}
	if p.TTL == 0 {
		p.TTL = DefaultTTL
	}
	if p.TTL < time.Microsecond {
		return invalid("ttl", "%s is shorter than a microsecond", p.TTL)
	}
	if p.Wait == 0 {
		p.Wait = DefaultWait
	}
	return nil
}

// lockTimeout renders a wait as a lock_timeout value; PostgreSQL's 0 would mean "no
// limit", so the shortest wait is 1 ms.
func lockTimeout(d time.Duration) string {
	return fmt.Sprintf("%dms", max(1, d.Milliseconds()))
}

// Claim decides, atomically, whether this transaction owns the key (see
// the package documentation on idempotency keys). Results:
//
//   - Owned: do the work in tx, then Finish.
//   - not Owned, nil error: the key is finished with the same request hash; replay
//     Record.ResponseStatus / Record.Response.
//   - ErrKeyReuse: the key is finished with a different request hash (Record set).
//   - ErrKeyInFlight: the owner did not finish within p.Wait (Record set when an owner
//     working in separate transactions left the key in flight). When the wait timed
//     out, the transaction is aborted; on any error, roll tx back.
//
// tx must run at READ COMMITTED (PostgreSQL's default) so that a conflicting insert
// sees the owner's committed row. The common cases take one round trip: the statements
// are sent as one pipelined batch.
func Claim(ctx context.Context, tx pgx.Tx, p ClaimParams) (*ClaimResult, error) {
	if err := p.normalize(); err != nil {
		return nil, err
	}
	what := fmt.Sprintf("claim idempotency key %q in scope %q", queue.StorableText(p.Key, 64), p.Scope)
	// A key can be deleted by cleanup, or taken over by another request, between our
	// insert and our read; then the claim simply starts again. Each turn follows a
	// change of the row by someone else, so a few turns are plenty.
	for try := 0; try < 5; try++ {
		var committedBefore bool
		var inserted, current *Record
		b := &pgx.Batch{}
		if err := queueWithWait(ctx, tx, b, p.Wait, func(b *pgx.Batch) {
			b.Queue(sqlIdemProbe, p.Scope, p.Key).QueryRow(func(row pgx.Row) error {
				return row.Scan(&committedBefore)
			})
			b.Queue(sqlIdemInsert, p.Scope, p.Key, p.RequestHash, p.TTL.Microseconds()).QueryRow(func(row pgx.Row) error {
				var err error
				inserted, err = scanIdemOptional(row)
				return err
			})
			b.Queue(sqlIdemGet, p.Scope, p.Key).QueryRow(func(row pgx.Row) error {
				var err error
				current, err = scanIdemOptional(row)
				return err
			})
		}); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			if store.PgCode(err) == store.CodeLockNotAvailable {
				return nil, fmt.Errorf("%s: waited %s for the owner's transaction: %w", what, p.Wait, ErrKeyInFlight)
			}
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		// The key was in flight when we arrived if the probe did not see it committed
		// but the insert then conflicted: the insert waited for the owner's COMMIT.
		waited := !committedBefore && inserted == nil
		switch {
		case inserted != nil:
			return &ClaimResult{Record: inserted, Owned: true}, nil
		case current == nil:
			continue // deleted by cleanup since our insert conflicted
		case current.Expired:
			took, err := takeOver(ctx, tx, p)
			if err != nil {
				return nil, fmt.Errorf("%s: take over the expired key: %w", what, err)
			}
			if took == nil {
				continue // another request took it over or cleanup deleted it first
			}
			return &ClaimResult{Record: took, Owned: true, Waited: waited, TookOver: true}, nil
		case current.State == StateInFlight:
			return &ClaimResult{Record: current, Waited: waited},
				fmt.Errorf("%s: its owner has not finished it: %w", what, ErrKeyInFlight)
		case !bytes.Equal(current.RequestHash, p.RequestHash):
			return &ClaimResult{Record: current, Waited: waited},
				fmt.Errorf("%s: %w", what, ErrKeyReuse)
		default:
			return &ClaimResult{Record: current, Waited: waited}, nil
		}
	}
	return nil, fmt.Errorf("%s: the key kept changing under concurrent claims and cleanup", what)
}

// takeOver claims an expired key anew. It returns nil when the key is no longer expired
// (another request took it over) or gone (cleanup deleted it).
func takeOver(ctx context.Context, tx pgx.Tx, p ClaimParams) (*Record, error) {
	var rec *Record
	b := &pgx.Batch{}
	if err := queueWithWait(ctx, tx, b, p.Wait, func(b *pgx.Batch) {
		b.Queue(sqlIdemTakeOver, p.Scope, p.Key, p.RequestHash, p.TTL.Microseconds()).QueryRow(func(row pgx.Row) error {
			var err error
			rec, err = scanIdemOptional(row)
			return err
		})
	}); err != nil {
		return nil, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		if store.PgCode(err) == store.CodeLockNotAvailable {
			return nil, fmt.Errorf("waited %s for a concurrent takeover: %w", p.Wait, ErrKeyInFlight)
		}
		return nil, err
	}
	return rec, nil
}

// queueWithWait queues body's statements between setting lock_timeout to wait and
// restoring the transaction's previous value, all in the same batch: the previous value
// is kept in a transaction-local custom setting.
//
// On a Citus coordinator (store.Distributed) the wait must bound the lock taken on the
// worker node that holds the table, and set_config() reaches only the coordinator: there
// the settings are changed with SET LOCAL, which Citus passes on to the transaction's
// worker connections while citus.propagate_set_commands is 'local'. SET takes no
// expression, so the previous values are read first, in a round trip of their own.
func queueWithWait(ctx context.Context, tx pgx.Tx, b *pgx.Batch, wait time.Duration, body func(b *pgx.Batch)) error {
	if wait <= 0 {
		body(b)
		return nil
	}
	dist, err := store.Distributed(ctx, tx)
	if err != nil {
		return err
	}
	if !dist {
		b.Queue(sqlSaveLockTimeout)
		b.Queue(sqlSetLockTimeout, lockTimeout(wait))
		body(b)
		b.Queue(sqlRestoreLockTimeout)
		return nil
	}
	var prevTimeout, prevPropagate string
	if err := tx.QueryRow(ctx, sqlReadCitusSettings).Scan(&prevTimeout, &prevPropagate); err != nil {
		return fmt.Errorf("read lock_timeout: %w", err)
	}
	b.Queue("SET LOCAL citus.propagate_set_commands = 'local'")
	b.Queue("SET LOCAL lock_timeout = " + lit(lockTimeout(wait)))
	body(b)
	b.Queue("SET LOCAL lock_timeout = " + lit(prevTimeout))
	b.Queue("SET LOCAL citus.propagate_set_commands = " + lit(prevPropagate))
	return nil
}

// Response is the result an owner stores with its key.
type Response struct {
	// ResourceID names what the request created, e.g. an order id.
	ResourceID string
	// Status is the response status to replay, e.g. an HTTP status code; 0 stores none.
	Status int
	// Body is the response to replay, byte for byte.
	Body []byte
}

// Finish stores the owner's result and marks the key finished; its TTL
// restarts now. Call it in the transaction that wrote the result (or, for a key claimed
// in an earlier transaction, in the one that completes the work). It returns an error
// matching ErrNotOwned when rec's generation no longer owns an in-flight key: the key
// expired and was taken over, or was released.
func Finish(ctx context.Context, db queue.DBTX, rec *Record, resp Response) (*Record, error) {
	var status *int32
	if resp.Status != 0 {
		s := int32(resp.Status)
		status = &s
	}
	out, err := scanIdemOptional(db.QueryRow(ctx, sqlIdemFinish, rec.Scope, rec.Key, rec.Gen,
		nullString(resp.ResourceID), status, resp.Body))
	if err != nil {
		return nil, fmt.Errorf("finish idempotency key %q in scope %q: %w", queue.StorableText(rec.Key, 64), rec.Scope, err)
	}
	if out == nil {
		return nil, fmt.Errorf("finish idempotency key %q in scope %q at generation %d: no longer owned: %w",
			queue.StorableText(rec.Key, 64), rec.Scope, rec.Gen, ErrNotOwned)
	}
	return out, nil
}

// Release deletes an in-flight key its owner gives up on, so that a retry
// can claim it at once. It matches ErrNotOwned when rec's generation no longer owns an
// in-flight key. (A key claimed and worked in one transaction needs no release: rolling
// back removes it.)
func Release(ctx context.Context, db queue.DBTX, rec *Record) error {
	tag, err := db.Exec(ctx, sqlIdemRelease, rec.Scope, rec.Key, rec.Gen)
	if err != nil {
		return fmt.Errorf("release idempotency key %q in scope %q: %w", queue.StorableText(rec.Key, 64), rec.Scope, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("release idempotency key %q in scope %q at generation %d: no longer owned: %w",
			queue.StorableText(rec.Key, 64), rec.Scope, rec.Gen, ErrNotOwned)
	}
	return nil
}

// Get reads one key, or returns an error matching queue.ErrNotFound.
func Get(ctx context.Context, db queue.DBTX, scope, key string) (*Record, error) {
	rec, err := scanIdemOptional(db.QueryRow(ctx, sqlIdemGet, scope, key))
	if err != nil {
		return nil, fmt.Errorf("read idempotency key %q in scope %q: %w", queue.StorableText(key, 64), scope, err)
	}
	if rec == nil {
		return nil, fmt.Errorf("idempotency key %q in scope %q: %w", queue.StorableText(key, 64), scope, queue.ErrNotFound)
	}
	return rec, nil
}

// DeleteExpired deletes up to limit finished keys whose TTL passed by the
// database's clock and returns how many it deleted. In-flight keys are never deleted,
// whatever their expiry; keys being taken over at the same moment are skipped. Call it
// in a loop until it returns fewer than limit.
func DeleteExpired(ctx context.Context, db queue.DBTX, limit int) (int64, error) {
	if limit <= 0 {
		return 0, invalid("limit", "%d is not positive", limit)
	}
	tag, err := db.Exec(ctx, sqlIdemDeleteExpired, pgx.QueryExecModeCacheDescribe, limit)
	if err != nil {
		return 0, fmt.Errorf("delete expired idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}

// HashRequest returns the SHA-256 of v's JSON encoding: a canonical request hash when v
// is the strictly decoded request (struct fields encode in a fixed order and map keys
// sorted, so whitespace and key order of the client's body do not matter).
//
// A string of v that is not valid UTF-8 is an error (a *queue.ValidationError naming
// "request"): JSON encodes every invalid byte as U+FFFD, so two different requests
// would have one hash.
func HashRequest(v any) ([]byte, error) {
	if path, ok := invalidUTF8(reflect.ValueOf(v), "request", 0); ok {
		return nil, invalid("request", "%s is not valid UTF-8: its JSON encoding, and so its hash, would lose bytes", path)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("hash request: %w", err)
	}
	sum := sha256.Sum256(raw)
	return sum[:], nil
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// invalidUTF8 finds a string in v, as json.Marshal walks it, that is not valid UTF-8,
// and returns where it is. Values that encode themselves (json.Marshaler,
// encoding.TextMarshaler) are left to their encoding; depth bounds a cyclic value,
// which json.Marshal refuses anyway.
func invalidUTF8(v reflect.Value, path string, depth int) (string, bool) {
	if !v.IsValid() || depth > 100 {
		return "", false
	}
	if t := v.Type(); t.Implements(jsonMarshaler) || t.Implements(textMarshaler) {
		return "", false
	}
	switch v.Kind() {
	case reflect.String:
		return path, !utf8.ValidString(v.String())
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "", false
		}
		return invalidUTF8(v.Elem(), path, depth+1)
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			return "", false // []byte encodes as base64
		}
		for i := range v.Len() {
			if p, bad := invalidUTF8(v.Index(i), fmt.Sprintf("%s[%d]", path, i), depth+1); bad {
				return p, true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			k := it.Key()
			if k.Kind() == reflect.String && !utf8.ValidString(k.String()) {
				return path + " key " + strconv.QuoteToASCII(k.String()), true
			}
			if p, bad := invalidUTF8(it.Value(), path+"["+strconv.QuoteToASCII(fmt.Sprint(k))+"]", depth+1); bad {
				return p, true
			}
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			if f := t.Field(i); (f.IsExported() || f.Anonymous) && f.Tag.Get("json") != "-" {
				if p, bad := invalidUTF8(v.Field(i), path+"."+f.Name, depth+1); bad {
					return p, true
				}
			}
		}
	}
	return "", false
}

// scanIdemOptional scans one row, returning nil (and no error) when there is none.
func scanIdemOptional(row pgx.Row) (*Record, error) {
	var r Record
	var state string
	var resourceID *string
	var status *int32
	err := row.Scan(&r.Scope, &r.Key, &r.RequestHash, &state, &r.Gen, &resourceID, &status,
		&r.Response, &r.CreatedAt, &r.FinishedAt, &r.ExpiresAt, &r.Expired)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r.State = State(state)
	if resourceID != nil {
		r.ResourceID = *resourceID
	}
	if status != nil {
		r.ResponseStatus = int(*status)
	}
	return &r, nil
}

func invalid(field, format string, args ...any) error {
	return &queue.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
