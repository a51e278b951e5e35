package queue_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fenceq/fenceq/queue"
)

// FuzzValidateArgs checks fuzzed job args. Rejected args get a ValidationError naming
// "args"; accepted args are one JSON object within the limit that PostgreSQL's jsonb can
// store (valid UTF-8, no NUL, no lone surrogate), and an object of plain strings and
// numbers of moderate size that jsonb can store is never rejected.
func FuzzValidateArgs(f *testing.F) {
	for _, s := range []string{
		// valid
		`{}`, ` { } `, "\n{\"a\":1}\n", `{"duration":"30s","n":[1,2.5,-3e2,null,true]}`,
		`{"nested":{"a":{"b":{"c":[{}]}}}}`, `{"emoji":"\ud83d\ude00","raw":"😀","e":"é"}`,
		`{"a":"\\u0000"}`, // a backslash followed by u0000: no NUL
		`{"a":"\\\\u0000"}`, `{"a":"\ufffd","b":"�"}`, `{"a":1e131071,"b":1.5e-16382,"c":0e200000}`,
		`{"a":-0,"b":0.1e131072,"c":1E+2}`, `{"a":"a","a":"b"}`,
		// boundary and invalid
		``, ` `, `null`, `[]`, `"{}"`, `1`, `true`, `{`, `{"a":}`, `{}{}`, `{} x`, `{"a":1,}`,
		`{"a":"\u0000"}`, `{"\u0000":1}`, `{"a":"x\u0000y"}`, `{"a":"\ud800"}`, `{"a":"\udc00"}`,
		`{"a":"\ud800\u0041"}`, `{"a":"\\ufffd","b":"\ud800"}`, `{"a":"\ufffd\ud800"}`, `{"a":"\ud83d"}`, "{\"a\":\"\xff\"}", "{\"a\":\"\xed\xa0\x80\"}",
		"\xef\xbb\xbf{}", `{"a":1e131072}`, `{"a":10e131071}`, `{"a":1e-16384}`, `{"a":0e-16384}`,
		`{"a":1e99999999999}`, `{"a":1.5e-16383}`,
	} {
		f.Add([]byte(s), 0)
	}
	f.Add([]byte(`{"a":"`+strings.Repeat("x", 100)+`"}`), 100)
	f.Add([]byte(`{"a":"`+strings.Repeat("x", 100)+`"}`), 108)
	f.Fuzz(func(t *testing.T, args []byte, maxBytes int) {
		maxBytes %= 1 << 16
		err := queue.ValidateArgs(args, maxBytes)
		limit := maxBytes
		if limit <= 0 {
			limit = queue.DefaultMaxArgsBytes
		}
		storable, why := plainObject(args)
		if err != nil {
			var ve *queue.ValidationError
			if !errors.As(err, &ve) || ve.Field != "args" || !errors.Is(err, queue.ErrInvalid) {
				t.Fatalf("ValidateArgs(%q) = %v (%T), want a *queue.ValidationError naming args", args, err, err)
			}
			if storable && len(args) <= limit {
				t.Fatalf("ValidateArgs(%q) rejected args jsonb can store: %v", args, err)
			}
			return
		}
		if len(args) > limit {
			t.Fatalf("ValidateArgs accepted %d bytes over the limit %d", len(args), limit)
		}
		trimmed := bytes.TrimSpace(args)
		if !json.Valid(trimmed) || trimmed[0] != '{' || !utf8.Valid(args) {
			t.Fatalf("ValidateArgs accepted %q: not one JSON object in UTF-8", args)
		}
		if why != "" {
			t.Fatalf("ValidateArgs accepted %q, which jsonb cannot store: %s", args, why)
		}
	})
}

// smallNumber reports whether the JSON number n is certainly within PostgreSQL numeric's
// range: at most 1000 characters, its exponent within ±1000.
func smallNumber(n string) bool {
	if len(n) > 1000 {
		return false
	}
	_, exp, found := strings.Cut(strings.ToLower(n), "e")
	if !found {
		return true
	}
	e, err := strconv.Atoi(exp)
	return err == nil && e >= -1000 && e <= 1000
}

// plainObject decodes b, a JSON object, independently of ValidateArgs. It reports
// whether b certainly fits jsonb (valid UTF-8, no NUL, no lone surrogate, every number
// small enough to be within numeric's range), and, when b is valid JSON, why jsonb
// cannot store it when one of its strings shows that.
func plainObject(b []byte) (storable bool, why string) {
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return false, ""
	}
	if !utf8.Valid(b) {
		return false, "invalid UTF-8"
	}
	// The decoder turns a lone surrogate escape into U+FFFD: more U+FFFD in the decoded
	// strings than the input holds (as such or escaped) means one came from a lone
	// surrogate.
	genuine, decoded := countFFFD(trimmed), 0
	storable = true
	// Tokens, not a decoded map: a duplicate key's earlier value counts too.
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch x := tok.(type) {
		case string:
			if strings.ContainsRune(x, 0) {
				why = "a NUL character"
			}
			decoded += strings.Count(x, "\uFFFD")
		case json.Number:
			if !smallNumber(string(x)) {
				storable = false
			}
		}
	}
	if decoded > genuine {
		why = "a lone surrogate"
	}
	return storable && why == "", why
}

// countFFFD counts the U+FFFD characters of the JSON text b's strings, written as such
// or escaped (\ufffd), reading the escapes as a JSON decoder does.
func countFFFD(b []byte) int {
	n := bytes.Count(b, []byte("\uFFFD")) // outside strings valid JSON has none
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			continue
		}
		if b[i+1] == 'u' && i+5 < len(b) && strings.EqualFold(string(b[i+2:i+6]), "fffd") {
			n++
		}
		i++ // the escaped character: a backslash escaping a backslash starts nothing
	}
	return n
}
