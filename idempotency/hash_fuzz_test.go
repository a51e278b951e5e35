package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/internal/jsontest"
	"github.com/fenceq/fenceq/queue"
)

type fuzzRequest struct {
	Customer string            `json:"customer"`
	Labels   map[string]string `json:"labels"`
	Lines    []string          `json:"lines"`
}

// FuzzHashRequest fingerprints fuzzed requests. A request decoded from a JSON body has
// one hash whatever the body's key order and whitespace; requests that differ have
// different hashes, strings that differ only in invalid UTF-8 included (they are a
// ValidationError naming the request, never a shared hash).
func FuzzHashRequest(f *testing.F) {
	for _, s := range []struct{ body, other string }{
		{`{"customer_email":"ada@example.com","currency":"EUR","items":[{"sku":"A-1","quantity":2}]}`, "x"},
		{`{"b":1,"a":{"d":[1,2,{"z":null,"y":true}],"c":"é"}}`, "\uFFFD"},
		{`{}`, ""}, {`[]`, "a"}, {`"s"`, "s"}, {`1.5e3`, "1500"}, {`null`, "null"},
		{`{"a":"\ufffd"}`, "\xff"}, {`{"\u00e9":1}`, "\xfe"}, {`{"a":"<&>"}`, "\u2028"},
		{`{"a":1,"a":2}`, "a"}, {`{"a":`, "\xff\xfe"}, {"\xff", "\xc3\x28"},
	} {
		f.Add([]byte(s.body), s.other)
	}
	f.Fuzz(func(t *testing.T, body []byte, other string) {
		// Strings: a hash each, or a ValidationError for invalid UTF-8; never one hash
		// for two different strings.
		hashes := map[string]string{}
		for _, s := range []string{other, string(body), other + "\xff", other + "\xfe"} {
			h, err := idempotency.HashRequest(fuzzRequest{Customer: s, Labels: map[string]string{s: "v"}, Lines: []string{s}})
			if err != nil {
				var ve *queue.ValidationError
				if utf8.ValidString(s) || !errors.As(err, &ve) || ve.Field != "request" {
					t.Fatalf("HashRequest of %q: %v, want a hash or a ValidationError naming request for invalid UTF-8", s, err)
				}
				continue
			}
			if !utf8.ValidString(s) {
				t.Fatalf("HashRequest of %q, invalid UTF-8, gave a hash", s)
			}
			if len(h) != 32 {
				t.Fatalf("HashRequest of %q: %d bytes, want 32", s, len(h))
			}
			if prev, dup := hashes[string(h)]; dup && prev != s {
				t.Fatalf("%q and %q have one hash", prev, s)
			}
			hashes[string(h)] = s
		}

		// A JSON body: one hash whatever the key order and whitespace.
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			return
		}
		h1, err := idempotency.HashRequest(v)
		if err != nil {
			t.Fatalf("HashRequest of the decoded %q: %v", body, err)
		}
		again := jsontest.Reordered(v)
		var v2 any
		if err := json.Unmarshal(again, &v2); err != nil {
			t.Fatalf("re-encoded %q as %q, which does not decode: %v", body, again, err)
		}
		if h2, err := idempotency.HashRequest(v2); err != nil || !bytes.Equal(h1, h2) {
			t.Fatalf("%q and %q, one request, hash %x and %x (%v)", body, again, h1, h2, err)
		}
		// And a different request, a different hash.
		ha, errA := idempotency.HashRequest(map[string]any{"request": v, "extra": other})
		hb, errB := idempotency.HashRequest(map[string]any{"request": v, "extra": other + "!"})
		if utf8.ValidString(other) && (errA != nil || errB != nil || bytes.Equal(ha, hb)) {
			t.Fatalf("requests differing in extra %q and %q: hashes %x and %x (%v, %v)", other, other+"!", ha, hb, errA, errB)
		}
		if hc, err := idempotency.HashRequest([]any{v}); err != nil || bytes.Equal(hc, h1) {
			t.Fatalf("%q and [%q] hash alike: %x (%v)", body, body, hc, err)
		}
		if n, err := strconv.Atoi(string(body)); err == nil {
			// A number and the same digits as a string are different requests.
			if hs, err := idempotency.HashRequest(strconv.Itoa(n)); err != nil || bytes.Equal(hs, h1) {
				t.Fatalf("%d and %q hash alike (%v)", n, strconv.Itoa(n), err)
			}
		}
	})
}

// A field JSON leaves out does not take part in the hash, so its bytes do not matter; an
// encoded field's invalid UTF-8 is named in the error.
func TestHashRequestUTF8Check(t *testing.T) {
	type req struct {
		Name   string `json:"name"`
		Secret string `json:"-"`
	}
	a, errA := idempotency.HashRequest(req{Name: "ada", Secret: "\xff"})
	b, errB := idempotency.HashRequest(req{Name: "ada", Secret: "\xfe"})
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		t.Fatalf("requests differing in a field JSON leaves out: %x, %x (%v, %v), want one hash", a, b, errA, errB)
	}
	_, err := idempotency.HashRequest(map[string][]req{"lines": {{Name: "\xff"}}})
	var ve *queue.ValidationError
	if !errors.As(err, &ve) || ve.Field != "request" || !strings.Contains(err.Error(), `request["lines"][0].Name`) {
		t.Fatalf("invalid UTF-8 in a nested field: %v, want a ValidationError naming request[\"lines\"][0].Name", err)
	}
}
