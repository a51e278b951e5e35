package queue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits enforced before anything reaches the database.
const (
	MaxQueueLen     = 64
	MaxKindLen      = 128
	MaxUniqueKeyLen = 255
	// DefaultMaxArgsBytes is the default limit on the size of a job's JSON args.
	DefaultMaxArgsBytes = 1 << 20
	// MaxMetadataBytes is the limit on the size of a job's JSON metadata.
	MaxMetadataBytes = 64 << 10
	// MaxOutputBytes is the limit on the size of a job's recorded output: its JSON
	// encoding, written with the job's completion.
	MaxOutputBytes = 256 << 10
	MinPriority    = 0
	MaxPriority    = 100
	MaxMaxAttempts = 1000
	// MaxTags bounds the tags of one job, MaxTagLen the length of each.
	MaxTags   = 20
	MaxTagLen = 64
)

// ValidateQueue checks a queue name: 1–64 characters of ASCII letters, digits and
// "_ . : -", starting with a letter or digit.
func ValidateQueue(name string) error { return ValidateName("queue", name, MaxQueueLen) }

// ValidateKind checks a job kind with the same charset as queue names, up to 128
// characters.
func ValidateKind(kind string) error { return ValidateName("kind", kind, MaxKindLen) }

// ValidateName checks a name of up to max characters: ASCII letters, digits and
// "_ . : -", starting with a letter or digit. Errors name field.
func ValidateName(field, s string, max int) error {
	if s == "" {
		return invalid(field, "must not be empty")
	}
	if len(s) > max {
		return invalid(field, "%q is %d characters, longer than %d", StorableText(s, 40), len(s), max)
	}
	for i, r := range s {
		ok := r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			(i > 0 && (r == '_' || r == '.' || r == ':' || r == '-')))
		if !ok {
			return invalid(field, "%q: character %q at position %d is not allowed (use letters, digits and _ . : -, starting with a letter or digit)",
				StorableText(s, 40), r, i)
		}
	}
	return nil
}

// ValidateTag checks a tag: 1–64 characters of ASCII letters, digits and "_ . : -",
// starting with a letter or digit, like a queue name.
func ValidateTag(tag string) error { return ValidateName("tags", tag, MaxTagLen) }

// ValidateTags checks tags and returns them without duplicates, in their first order.
func ValidateTags(tags []string) ([]string, error) {
	if len(tags) == 0 {
		return nil, nil
	}
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		if err := ValidateTag(t); err != nil {
			return nil, err
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	if len(out) > MaxTags {
		return nil, invalid("tags", "%d tags, more than %d", len(out), MaxTags)
	}
	return out, nil
}

// ValidateUniqueKey checks a unique or idempotency key: 1–255 printable characters.
func ValidateUniqueKey(field, key string) error {
	if key == "" {
		return invalid(field, "must not be empty")
	}
	if len(key) > MaxUniqueKeyLen {
		return invalid(field, "is %d bytes, longer than %d", len(key), MaxUniqueKeyLen)
	}
	if !utf8.ValidString(key) {
		return invalid(field, "is not valid UTF-8")
	}
	for _, r := range key {
		if !unicode.IsPrint(r) {
			return invalid(field, "contains the non-printable character %U", r)
		}
	}
	return nil
}

// ValidateArgs checks that args are one JSON object, at most maxBytes long (0 means
// DefaultMaxArgsBytes), and free of \u0000, which PostgreSQL's jsonb cannot store.
func ValidateArgs(args []byte, maxBytes int) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxArgsBytes
	}
	return validateObject("args", args, maxBytes)
}

// ValidateOutput checks a job's output as the completions write it: nil (no output) or
// one JSON value of at most MaxOutputBytes that jsonb can store (no NUL in a string, no
// lone surrogate, numbers within numeric's range).
func ValidateOutput(b []byte) error {
	if b == nil {
		return nil
	}
	if len(b) > MaxOutputBytes {
		return invalid("output", "%d bytes, over the limit of %d", len(b), MaxOutputBytes)
	}
	if !json.Valid(b) {
		return invalid("output", "not one JSON value")
	}
	if reason := jsonbUnstorable(b); reason != "" {
		return invalid("output", "%s", reason)
	}
	return nil
}

// validateObject checks that b is one JSON object of at most maxBytes that jsonb can
// store; errors name field.
func validateObject(field string, b []byte, maxBytes int) error {
	if len(b) > maxBytes {
		return invalid(field, "%d bytes, over the limit of %d", len(b), maxBytes)
	}
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) == 0 {
		return invalid(field, "empty; want a JSON object such as {}")
	}
	if !json.Valid(trimmed) {
		var v any
		err := json.Unmarshal(trimmed, &v)
		return invalid(field, "malformed JSON: %v", err)
	}
	if trimmed[0] != '{' {
		return invalid(field, "must be a JSON object, got %s", jsonKind(trimmed[0]))
	}
	if reason := jsonbUnstorable(trimmed); reason != "" {
		return invalid(field, "%s", reason)
	}
	return nil
}

// PostgreSQL numeric's limits (numeric.c): at most this many decimal digits after the
// point, a most significant digit at most this far before it, and an exponent within
// ±INT_MAX/2.
const (
	pgNumericMaxScale  = 16383
	pgNumericMaxWeight = 131071
	pgNumericMaxExp    = 1<<30 - 1
)

// jsonbUnstorable says why PostgreSQL's jsonb would refuse b, valid JSON, or returns ""
// when it would not: invalid UTF-8, the escape \u0000 (jsonb text cannot hold NUL), a
// lone UTF-16 surrogate escape, or a number outside numeric's range. encoding/json
// accepts all of them, and the insert would fail with a database error.
func jsonbUnstorable(b []byte) string {
	if !utf8.Valid(b) {
		return "is not valid UTF-8"
	}
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			end, reason := scanJSONString(b, i)
			if reason != "" {
				return reason
			}
			i = end
		case c == '-' || c >= '0' && c <= '9':
			end := i + 1
			for end < len(b) && bytes.IndexByte([]byte("0123456789+-.eE"), b[end]) >= 0 {
				end++
			}
			if !numericStorable(b[i:end]) {
				return fmt.Sprintf("the number %s is outside the range PostgreSQL numeric can store",
					StorableText(string(b[i:end]), 40))
			}
			i = end
		default:
			i++
		}
	}
	return ""
}

// scanJSONString returns the index after the JSON string starting at b[i] (a '"'), or
// why jsonb cannot store it.
func scanJSONString(b []byte, i int) (int, string) {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '"':
			return i + 1, ""
		case '\\':
			i++
			if i >= len(b) || b[i] != 'u' || i+4 >= len(b) {
				continue
			}
			r := hex4(b[i+1 : i+5])
			i += 4
			switch {
			case r == 0:
				return 0, `contains \u0000, which PostgreSQL jsonb cannot store`
			case r >= 0xD800 && r < 0xDC00: // a high surrogate: a low one must follow
				if i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
					if lo := hex4(b[i+3 : i+7]); lo >= 0xDC00 && lo < 0xE000 {
						i += 6
						continue
					}
				}
				return 0, fmt.Sprintf(`contains the lone UTF-16 surrogate \u%04x, which PostgreSQL jsonb cannot store`, r)
			case r >= 0xDC00 && r < 0xE000:
				return 0, fmt.Sprintf(`contains the lone UTF-16 surrogate \u%04x, which PostgreSQL jsonb cannot store`, r)
			}
		}
	}
	return len(b), ""
}

// hex4 decodes four hex digits (valid JSON guarantees them after \u).
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// numericStorable reports whether the JSON number n fits PostgreSQL numeric: its scale
// (digits after the point, less the exponent) and the position of its most significant
// digit within numeric's limits.
func numericStorable(n []byte) bool {
	s := string(bytes.TrimPrefix(n, []byte("-")))
	mant, expText, _ := strings.Cut(strings.ToLower(s), "e")
	exp := 0
	if expText != "" {
		digits := strings.TrimLeft(strings.TrimLeft(expText, "+-"), "0")
		if len(digits) > 10 {
			return false
		}
		e, err := strconv.Atoi(strings.TrimLeft(expText, "+"))
		if err != nil || e >= pgNumericMaxExp || e <= -pgNumericMaxExp {
			return false
		}
		exp = e
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	if len(frac)-exp > pgNumericMaxScale {
		return false
	}
	// The decimal weight of the most significant non-zero digit; zero has none.
	if lead := strings.TrimLeft(intPart, "0"); lead != "" {
		return len(lead)-1+exp <= pgNumericMaxWeight
	}
	if lead := strings.TrimLeft(frac, "0"); lead != "" {
		return -(len(frac)-len(lead))-1+exp <= pgNumericMaxWeight
	}
	return true
}

func jsonKind(b byte) string {
	switch b {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// StorableText makes s storable in a text column and at most n bytes (plus "…"): invalid
// UTF-8 becomes U+FFFD and NUL bytes are dropped (PostgreSQL rejects both, and a failure
// whose error text held them could not be recorded), and a cut never splits a character.
func StorableText(s string, n int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// ValidatePriority and ValidateMaxAttempts keep numbers within what the schema and the
// retry policy expect.
func ValidatePriority(p int) error {
	if p < MinPriority || p > MaxPriority {
		return invalid("priority", "%d is outside %d–%d", p, MinPriority, MaxPriority)
	}
	return nil
}

func ValidateMaxAttempts(n int) error {
	if n < 1 || n > MaxMaxAttempts {
		return invalid("max_attempts", "%d is outside 1–%d", n, MaxMaxAttempts)
	}
	return nil
}

// ValidateMetadata checks a job's metadata: a JSON object of at most MaxMetadataBytes.
func ValidateMetadata(b []byte) error { return validateObject("metadata", b, MaxMetadataBytes) }
