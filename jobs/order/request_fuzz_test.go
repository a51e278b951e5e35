package order

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/fenceq/fenceq/internal/jsontest"
	"github.com/fenceq/fenceq/queue"
)

// FuzzRequestHash decodes fuzzed order bodies as POST /orders does and fingerprints the
// valid ones. A body that does not decode gets an error code and a message; a request
// that does not validate is a ValidationError naming the field; a valid request's hash
// is the same for the body with its keys in another order and other whitespace, and
// differs from the hash of the request with one more unit of its first line.
func FuzzRequestHash(f *testing.F) {
	for _, s := range []string{
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A-1","quantity":2,"unit_price_cents":1999}]}`,
		`{"items":[{"unit_price_cents":0,"quantity":10000,"sku":"Z"}],"currency":"USD","customer_email":"b@example.org"}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A-1","quantity":9999,"unit_price_cents":1}]}`,
		`{"Customer_Email":"ada@example.com","CURRENCY":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","currency":"USD","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`,
		`{"CURRENCY":"USD","customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`,
		``, `{}`, `[]`, `null`, `{"customer_email":1}`, `{"x":1}`, `{} {}`, `{"customer_email":"a@b.c"} x`,
		`{"customer_email":"Ada <ada@example.com>","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`,
		`{"customer_email":"ada@example.com","currency":"eur","items":[{"sku":"A","quantity":1,"unit_price_cents":1}]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A B","quantity":1,"unit_price_cents":1}]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A","quantity":0,"unit_price_cents":1}]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A","quantity":1,"unit_price_cents":-1}]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A","quantity":1.5,"unit_price_cents":1}]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A","quantity":9223372036854775808,"unit_price_cents":1}]}`,
		`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"\ud800","quantity":1,"unit_price_cents":1}]}`,
		"{\"customer_email\":\"ada@example.com\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"\xff\",\"quantity\":1,\"unit_price_cents\":1}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, code, msg := decodeBody(body)
		if code != "" {
			if msg == "" {
				t.Fatalf("body %q refused with code %s and no message", body, code)
			}
			return
		}
		if err := req.Validate(); err != nil {
			var ve *queue.ValidationError
			if !errors.As(err, &ve) || ve.Field == "" || !errors.Is(err, queue.ErrInvalid) {
				t.Fatalf("Validate of %q: %v (%T), want a ValidationError naming the field", body, err, err)
			}
			return
		}
		h1, err := req.Hash()
		if err != nil {
			t.Fatalf("Hash of the valid request %q: %v", body, err)
		}
		var generic any
		if err := json.Unmarshal(body, &generic); err != nil {
			t.Fatalf("a body the handler decoded does not decode as JSON: %v", err)
		}
		again := jsontest.Reordered(generic)
		req2, code, msg := decodeBody(again)
		if code != "" {
			t.Fatalf("body %q re-encoded as %q is refused: %s %s", body, again, code, msg)
		}
		if h2, err := req2.Hash(); err != nil || !bytes.Equal(h1, h2) {
			t.Fatalf("%q and %q, one order, hash %x and %x (%v)", body, again, h1, h2, err)
		}
		other := req
		other.Items = slices.Clone(req.Items)
		other.Items[0].Quantity++
		if h3, err := other.Hash(); err != nil || bytes.Equal(h1, h3) {
			t.Fatalf("orders of %d and %d units hash alike: %x (%v)", req.Items[0].Quantity, other.Items[0].Quantity, h1, err)
		}
	})
}

// decodeBody decodes body as the order handler does.
func decodeBody(body []byte) (Request, string, string) {
	r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(body))
	return decodeRequest(httptest.NewRecorder(), r)
}
