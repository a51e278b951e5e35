package fenceq

import "testing"

// jsonEqual compares JSON documents as jsonb does: key order, spacing and the spelling
// of a number do not matter; values do.
func TestJSONEqual(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{`{"n":1}`, `{"n": 1}`, true},
		{`{"a":1,"b":[true,null,"x"]}`, `{"b": [true, null, "x"], "a": 1}`, true},
		{`{"f":1.0}`, `{"f": 1}`, true},
		{`{"f":1e+21}`, `{"f": 1000000000000000000000}`, true},
		{`{"n":1}`, `{"n": 2}`, false},
		{`{"n":1}`, `{"n": "1"}`, false},
		{`{"n":1}`, `{"n": 1, "m": 1}`, false},
		{`{"l":[1,2]}`, `{"l": [2, 1]}`, false},
		{`{"s":"a"}`, `{"s": "b"}`, false},
		{`{}`, `{}`, true},
	} {
		if got := jsonEqual([]byte(c.a), []byte(c.b)); got != c.want {
			t.Errorf("jsonEqual(%s, %s) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
