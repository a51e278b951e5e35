package connstr

import "testing"

func TestWithSearchPath(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"postgres://u@h:5432/db?sslmode=disable", "postgres://u@h:5432/db?search_path=s1&sslmode=disable"},
		{"postgres://u@h/db?search_path=old", "postgres://u@h/db?search_path=s1"},
		{"host=h dbname=db", "host=h dbname=db search_path=s1"},
	} {
		if got := WithSearchPath(c.in, "s1"); got != c.want {
			t.Errorf("WithSearchPath(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
