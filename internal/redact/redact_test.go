package redact_test

import (
	"strings"
	"testing"

	"github.com/fenceq/fenceq/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:s3cret@db:5432/x?search_path=a", "postgres://u:xxxxx@db:5432/x?search_path=a"},
		{"postgres://u@db/x", "postgres://u@db/x"},
		{"host=db user=u password=s3cret dbname=x", "host=db user=u password=xxxxx dbname=x"},
		{"host=db PASSWORD = 's3 cret' dbname=x", "host=db PASSWORD = xxxxx dbname=x"},
		{"postgres://u:s3cret@db:badport/x", "(unparseable database URL)"},
		{"smtp://user:s3cret@mail:587?from=a@b", "smtp://user:xxxxx@mail:587?from=a@b"},
	} {
		got := redact.URL(tc.in)
		if got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "s3cret") || strings.Contains(got, "s3 cret") {
			t.Errorf("URL(%q) = %q still shows the password", tc.in, got)
		}
	}
}
