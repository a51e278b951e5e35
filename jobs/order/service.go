package order

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/jobs/email"
	"github.com/fenceq/fenceq/outbox"
	"github.com/fenceq/fenceq/queue"
)

// Defaults of Config.
const (
	DefaultInflightWait = idempotency.DefaultWait
	DefaultKeyTTL       = idempotency.DefaultTTL
	DefaultWriteTimeout = 30 * time.Second
)

// Email of the order confirmation, written to the outbox in the order's transaction.
const (
	// EmailTopic is the outbox topic of confirmation emails: the email relay's.
	EmailTopic = email.TopicEmail
	// EmailDedupePrefix + the order id is the outbox dedupe key, and so the idempotency
	// key of every delivery attempt of the email.
	EmailDedupePrefix = "order-email:"
)

// Config configures a Service.
type Config struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// KeyTTL is how long an idempotency key is remembered after its order was placed.
	// Retries after that still find the order through orders.idempotency_key. Defaults
	// to 24h.
	KeyTTL time.Duration
	// InflightWait bounds how long a retry waits for the first request's transaction
	// before giving up with idempotency.ErrKeyInFlight (HTTP 409). Defaults to 2s.
	InflightWait time.Duration
	// WriteTimeout bounds the transaction of Place. Once started, that transaction is
	// not cancelled with the caller's context (a client hanging up must not turn a
	// placement its retry could replay into a rollback). Defaults to 30s.
	WriteTimeout time.Duration
	// Metrics counts replays, conflicts, in-flight waits and created orders. Defaults
	// to NopMetrics.
	Metrics Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// BeforeCommit, if set, runs in Place just before COMMIT of a transaction that
	// placed an order (not of a replay): a fault-injection hook for tests and demos
	// (delay the commit, or fail to roll back). It does not run in PlaceTx.
	BeforeCommit func(ctx context.Context) error
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Pool == nil {
		return out, errors.New("order config: Pool is required")
	}
	if out.KeyTTL == 0 {
		out.KeyTTL = DefaultKeyTTL
	}
	if out.KeyTTL < time.Millisecond {
		return out, fmt.Errorf("order config: KeyTTL %s is shorter than 1ms", out.KeyTTL)
	}
	if out.InflightWait == 0 {
		out.InflightWait = DefaultInflightWait
	}
	if out.InflightWait < time.Millisecond {
		return out, fmt.Errorf("order config: InflightWait %s is shorter than 1ms", out.InflightWait)
	}
	if out.WriteTimeout == 0 {
		out.WriteTimeout = DefaultWriteTimeout
	}
	if out.WriteTimeout <= out.InflightWait {
		return out, fmt.Errorf("order config: WriteTimeout %s must be longer than InflightWait %s", out.WriteTimeout, out.InflightWait)
	}
	if out.Metrics == nil {
		out.Metrics = NopMetrics{}
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}

// Service places and reads orders.
type Service struct {
	cfg   Config
	log   *slog.Logger
	scope *idempotency.Scope
}

// NewService checks cfg and returns a Service.
func NewService(cfg Config) (*Service, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Service{cfg: c, log: c.Logger.With("component", "order"),
		scope: &idempotency.Scope{Name: Scope, TTL: c.KeyTTL, Wait: c.InflightWait, Metrics: c.Metrics}}, nil
}

// Result is the outcome of a placement.
type Result struct {
	// Order is the placed order (the first request's order on a replay).
	Order *Order
	// Status and Body are the stored response: 201 and the order's JSON, identical
	// byte for byte on every replay.
	Status int
	Body   []byte
	// Replayed is true when the order was placed by an earlier request with this key.
	Replayed bool
}

// Place places req once per idempotency key (see the package documentation), in a
// transaction of its own. Errors: queue.ErrInvalid for a bad key or request (a
// *queue.ValidationError naming the field), idempotency.ErrKeyReuse for a key used with
// a different request, idempotency.ErrKeyInFlight when the key's first request is still
// in flight after Config.InflightWait. Any other error leaves nothing behind; the client
// may retry with the same key.
func (s *Service) Place(ctx context.Context, key string, req Request) (*Result, error) {
	hash, err := checkRequest(key, &req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.WriteTimeout)
	defer cancel()
	res, err := s.run(ctx, key, &req, hash, nil, func(ctx context.Context, w work) (*idempotency.Result, error) {
		return s.scope.Do(ctx, s.cfg.Pool, key, hash, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
			resp, err := w(ctx, tx)
			if err == nil && s.cfg.BeforeCommit != nil {
				if err := s.cfg.BeforeCommit(ctx); err != nil {
					return resp, fmt.Errorf("before commit: %w", err)
				}
			}
			return resp, err
		})
	})
	if err != nil {
		return nil, err
	}
	if !res.Replayed {
		s.cfg.Metrics.Created()
		s.log.Info("order placed", "order_id", res.Order.ID, "idempotency_key", key, "total_cents", res.Order.TotalCents)
	}
	return res, nil
}

// PlaceTx is Place inside the caller's transaction, for a job's fenced Commit: the order,
// its items, the email outbox row and the idempotency record commit with tx. lease, if
// not nil, is recorded on the order (job_id, lease_gen) and the outbox row. On a
// replay nothing is written. On error, roll tx back. The caller commits and counts the
// order as created.
func (s *Service) PlaceTx(ctx context.Context, tx pgx.Tx, key string, req Request, lease *queue.Lease) (*Result, error) {
	hash, err := checkRequest(key, &req)
	if err != nil {
		return nil, err
	}
	return s.run(ctx, key, &req, hash, lease, func(ctx context.Context, w work) (*idempotency.Result, error) {
		return s.scope.DoTx(ctx, tx, key, hash, idempotency.Work(w))
	})
}

func checkRequest(key string, req *Request) ([]byte, error) {
	if err := queue.ValidateUniqueKey("idempotency_key", key); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return req.Hash()
}

// work is the owner's work: it writes the order (or finds it) in tx.
type work = func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error)

// run places one order under its key: do runs the work under the key, in a transaction
// of its own (Place) or the caller's (PlaceTx), and the outcome is read from the key's
// response.
func (s *Service) run(ctx context.Context, key string, req *Request, hash []byte, lease *queue.Lease,
	do func(ctx context.Context, w work) (*idempotency.Result, error)) (*Result, error) {
	log := s.log.With("idempotency_key", key)
	var placed *Order
	var fromTable bool // the order exists although the key's record had expired
	res, err := do(ctx, func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
		var err error
		placed, fromTable, err = s.create(ctx, tx, key, req, hash, lease)
		if err != nil {
			return idempotency.Response{}, err
		}
		body, err := encodeOrder(placed)
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{ResourceID: strconv.FormatInt(placed.ID, 10), Status: http.StatusCreated, Body: body}, nil
	})
	switch {
	case errors.Is(err, idempotency.ErrKeyInFlight):
		log.Warn("order request rejected: the first request with this key is still in flight", "waited", s.cfg.InflightWait)
		return nil, fmt.Errorf("place order: %w", err)
	case errors.Is(err, idempotency.ErrKeyReuse):
		log.Warn("idempotency key reused with a different order request")
		return nil, fmt.Errorf("place order: %w", err)
	case err != nil:
		return nil, fmt.Errorf("place order: %w", err)
	}
	if res.Waited {
		log.Info("order request waited for the in-flight first request with its key")
	}
	if res.Replayed {
		var o Order
		if err := json.Unmarshal(res.Response.Body, &o); err != nil {
			return nil, fmt.Errorf("replay order with key %q: decode stored response: %w", key, err)
		}
		log.Info("order request replayed", "order_id", o.ID)
		return &Result{Order: &o, Status: res.Response.Status, Body: res.Response.Body, Replayed: true}, nil
	}
	if fromTable {
		log.Info("order request replayed from the orders table (its idempotency record had expired)", "order_id", placed.ID)
	}
	return &Result{Order: placed, Status: res.Response.Status, Body: res.Response.Body, Replayed: fromTable}, nil
}

// create writes the order as the key's owner: the order, its items and its confirmation
// email. When the orders table already has an order with the key (its idempotency
// record expired and was cleaned up or taken over), that order is the outcome: it is
// returned with existing set, or idempotency.ErrKeyReuse when it came from a different
// request.
func (s *Service) create(ctx context.Context, tx pgx.Tx, key string, req *Request, hash []byte, lease *queue.Lease) (*Order, bool, error) {
	o := &Order{IdempotencyKey: key, CustomerEmail: req.CustomerEmail, Currency: req.Currency,
		TotalCents: req.Total(), Items: append([]Item(nil), req.Items...)}
	var outboxJob int64
	if lease != nil {
		o.JobID, o.LeaseGen = &lease.JobID, &lease.Gen
		outboxJob = lease.JobID
	}
	err := tx.QueryRow(ctx, sqlInsertOrder, key, hash, o.CustomerEmail, o.Currency, o.TotalCents,
		o.JobID, o.LeaseGen).Scan(&o.ID, &o.Status, &o.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		existing, err := s.existing(ctx, tx, key, hash)
		return existing, true, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("insert order with key %q: %w", key, err)
	}
	n := len(o.Items)
	lines, skus, qty, prices := make([]int32, n), make([]string, n), make([]int32, n), make([]int64, n)
	for i, it := range o.Items {
		lines[i], skus[i], qty[i], prices[i] = int32(i+1), it.SKU, int32(it.Quantity), it.UnitPriceCents
	}
	if _, err := tx.Exec(ctx, sqlInsertItems, o.ID, lines, skus, qty, prices); err != nil {
		return nil, false, fmt.Errorf("insert items of order %d: %w", o.ID, err)
	}
	payload, err := json.Marshal(confirmationEmail(o))
	if err != nil {
		return nil, false, fmt.Errorf("encode confirmation email of order %d: %w", o.ID, err)
	}
	if _, err := outbox.Insert(ctx, tx, outbox.Message{
		Topic: EmailTopic, DedupeKey: EmailDedupePrefix + strconv.FormatInt(o.ID, 10), Payload: payload, JobID: outboxJob,
	}); err != nil {
		return nil, false, fmt.Errorf("confirmation email of order %d: %w", o.ID, err)
	}
	return o, false, nil
}

// existing reads the order the orders table holds for key: the table's unique key still
// decides after the key's idempotency record is gone.
func (s *Service) existing(ctx context.Context, tx pgx.Tx, key string, hash []byte) (*Order, error) {
	var storedHash []byte
	o, err := scanOrder(tx.QueryRow(ctx, sqlGetOrderByKey, key), &storedHash)
	if err != nil {
		return nil, fmt.Errorf("read order with key %q: %w", key, err)
	}
	if !bytes.Equal(storedHash, hash) {
		return nil, fmt.Errorf("key %q belongs to order %d: %w", key, o.ID, idempotency.ErrKeyReuse)
	}
	if o.Items, err = getItems(ctx, tx, o.ID); err != nil {
		return nil, err
	}
	s.cfg.Metrics.Replay(Scope)
	return o, nil
}

func encodeOrder(o *Order) ([]byte, error) {
	body, err := json.Marshal(o)
	if err != nil {
		return nil, fmt.Errorf("encode order %d: %w", o.ID, err)
	}
	return append(body, '\n'), nil
}

// confirmationEmail is the outbox payload of an order's confirmation (topic EmailTopic):
// the relay's own message type, so a payload it cannot read cannot be written.
func confirmationEmail(o *Order) email.Message {
	var b strings.Builder
	fmt.Fprintf(&b, "Thank you for your order %d.\n\n", o.ID)
	for _, it := range o.Items {
		fmt.Fprintf(&b, "%d × %s at %s\n", it.Quantity, it.SKU, money(it.UnitPriceCents, o.Currency))
	}
	fmt.Fprintf(&b, "\nTotal: %s\n", money(o.TotalCents, o.Currency))
	return email.Message{To: email.AddressList{o.CustomerEmail}, Subject: fmt.Sprintf("Order %d confirmed", o.ID), Text: b.String()}
}

// money renders minor units with two decimals, for display only.
func money(cents int64, currency string) string {
	return fmt.Sprintf("%d.%02d %s", cents/100, cents%100, currency)
}

// Get returns the order with the given id, or an error matching fenceq.ErrNotFound.
func (s *Service) Get(ctx context.Context, id int64) (*Order, error) {
	o, err := scanOrder(s.cfg.Pool.QueryRow(ctx, sqlGetOrder, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("order %d: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read order %d: %w", id, err)
	}
	if o.Items, err = getItems(ctx, s.cfg.Pool, id); err != nil {
		return nil, err
	}
	return o, nil
}

func scanOrder(row pgx.Row, extra ...any) (*Order, error) {
	var o Order
	dest := append([]any{&o.ID, &o.IdempotencyKey, &o.CustomerEmail, &o.Currency, &o.TotalCents,
		&o.Status, &o.CreatedAt, &o.JobID, &o.LeaseGen}, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	return &o, nil
}

func getItems(ctx context.Context, db queue.DBTX, id int64) ([]Item, error) {
	rows, err := db.Query(ctx, sqlGetItems, id)
	if err != nil {
		return nil, fmt.Errorf("read items of order %d: %w", id, err)
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Item, error) {
		var it Item
		err := row.Scan(&it.SKU, &it.Quantity, &it.UnitPriceCents)
		return it, err
	})
	if err != nil {
		return nil, fmt.Errorf("read items of order %d: %w", id, err)
	}
	return items, nil
}
