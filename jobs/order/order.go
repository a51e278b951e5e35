// Package order places orders exactly once per idempotency key, however often a client
// retries. It is the order incident fenceq is built against: an idempotency check that
// reads an eventually consistent index before writing lets retries that arrive faster
// than the index catches up (every 300 ms against 400–600 ms of lag) create duplicate
// orders. Here the check and the write are one atomic conditional insert.
//
// # How a placement decides
//
// Place runs one transaction:
//
//	INSERT INTO fenceq_idempotency_keys … ON CONFLICT DO NOTHING RETURNING …  (idempotency.Scope.Do)
//	  inserted  → INSERT orders, order_items, the confirmation email outbox row,
//	              store the response (201 + body) on the key
//	  conflict  → same request hash: replay the stored status and body
//	              different hash:    idempotency.ErrKeyReuse (HTTP 422)
//	  owner still uncommitted after Config.InflightWait: idempotency.ErrKeyInFlight (HTTP 409)
//	COMMIT
//
// A retry that arrives while the first request's transaction is open waits for it in
// the INSERT (PostgreSQL's unique index, no read-then-write); if that transaction dies,
// the retry becomes the owner. orders.idempotency_key is UNIQUE as the last line of
// defence, and answers retries of a key whose idempotency record already expired.
//
// The request hash is the SHA-256 of the strictly decoded request re-encoded as JSON, so
// whitespace and key order of the client's body do not matter.
package order

import (
	"fmt"
	"net/mail"
	"regexp"
	"time"
	"unicode"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/queue"
)

// Scope is the idempotency-key scope of order placements.
const Scope = "orders"

// Limits on a request.
const (
	MaxItems          = 100
	MaxQuantity       = 10_000
	MaxUnitPriceCents = 100_000_000_000 // 1 billion in major units
	MaxSKULen         = 64
	MaxEmailLen       = 254
)

// Request is the body of POST /orders. Money is in integer minor units (cents) of
// Currency.
type Request struct {
	CustomerEmail string `json:"customer_email"`
	// Currency is an ISO 4217 code in upper case, e.g. "EUR".
	Currency string `json:"currency"`
	Items    []Item `json:"items"`
}

// Item is one line of a request.
type Item struct {
	SKU            string `json:"sku"`
	Quantity       int64  `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

// Order is a placed order, as stored and as returned by the API.
type Order struct {
	ID             int64     `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	CustomerEmail  string    `json:"customer_email"`
	Currency       string    `json:"currency"`
	TotalCents     int64     `json:"total_cents"`
	Status         string    `json:"status"`
	CreatedAt      time.Time `json:"created_at"`
	Items          []Item    `json:"items"`
	// JobID and LeaseGen name the order.place job lease that placed the order, if any.
	JobID    *int64 `json:"job_id,omitempty"`
	LeaseGen *int64 `json:"lease_gen,omitempty"`
}

// StatusPlaced is the status of a new order.
const StatusPlaced = "placed"

var currencyRe = regexp.MustCompile(`^[A-Z]{3}$`)

func invalid(field, format string, args ...any) error {
	return &queue.ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks a request; the error names the first field that is wrong and matches
// queue.ErrInvalid.
func (r *Request) Validate() error {
	if r.CustomerEmail == "" {
		return invalid("customer_email", "must not be empty")
	}
	if len(r.CustomerEmail) > MaxEmailLen {
		return invalid("customer_email", "is %d bytes, longer than %d", len(r.CustomerEmail), MaxEmailLen)
	}
	if a, err := mail.ParseAddress(r.CustomerEmail); err != nil || a.Address != r.CustomerEmail || a.Name != "" {
		return invalid("customer_email", "%q is not a plain email address like name@example.com", r.CustomerEmail)
	}
	if !currencyRe.MatchString(r.Currency) {
		return invalid("currency", "%q is not a three-letter upper-case ISO 4217 code such as EUR", r.Currency)
	}
	if len(r.Items) == 0 {
		return invalid("items", "must not be empty")
	}
	if len(r.Items) > MaxItems {
		return invalid("items", "has %d lines, more than %d", len(r.Items), MaxItems)
	}
	for i, it := range r.Items {
		field := fmt.Sprintf("items[%d]", i)
		if err := validateSKU(field+".sku", it.SKU); err != nil {
			return err
		}
		if it.Quantity <= 0 || it.Quantity > MaxQuantity {
			return invalid(field+".quantity", "%d is outside 1–%d", it.Quantity, MaxQuantity)
		}
		if it.UnitPriceCents < 0 || it.UnitPriceCents > MaxUnitPriceCents {
			return invalid(field+".unit_price_cents", "%d is outside 0–%d", it.UnitPriceCents, int64(MaxUnitPriceCents))
		}
	}
	return nil
}

func validateSKU(field, s string) error {
	if s == "" {
		return invalid(field, "must not be empty")
	}
	if len(s) > MaxSKULen {
		return invalid(field, "is %d bytes, longer than %d", len(s), MaxSKULen)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return invalid(field, "%q contains %U; use printable characters without spaces", s, r)
		}
	}
	return nil
}

// Total is the order total in minor units. The limits keep it far from overflow:
// 100 lines × 10,000 × 10^11 < 2^63.
func (r *Request) Total() int64 {
	var t int64
	for _, it := range r.Items {
		t += it.Quantity * it.UnitPriceCents
	}
	return t
}

// Hash is the canonical request hash stored with the idempotency key.
func (r *Request) Hash() ([]byte, error) {
	return idempotency.HashRequest(struct {
		V int `json:"v"`
		*Request
	}{V: 1, Request: r})
}
