// Package jsontest holds helpers for tests of code that reads JSON from clients.
package jsontest

import (
	"bytes"
	"encoding/json"
	"slices"
)

// Reordered encodes v, a decoded JSON value (map[string]any, []any and scalars, as
// encoding/json decodes into any), with every object's keys in reverse order and
// whitespace around every token: the same value as another client could send it.
func Reordered(v any) []byte {
	var b bytes.Buffer
	var enc func(v any)
	enc = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			slices.Reverse(keys)
			b.WriteString("{ ")
			for i, k := range keys {
				if i > 0 {
					b.WriteString(" ,\n ")
				}
				kb, _ := json.Marshal(k)
				b.Write(kb)
				b.WriteString(" :\t")
				enc(x[k])
			}
			b.WriteString(" }")
		case []any:
			b.WriteString("[ ")
			for i, e := range x {
				if i > 0 {
					b.WriteString(" , ")
				}
				enc(e)
			}
			b.WriteString(" ]")
		default:
			vb, _ := json.Marshal(x)
			b.Write(vb)
		}
	}
	enc(v)
	return b.Bytes()
}
