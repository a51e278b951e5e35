// Package connstr edits PostgreSQL connection strings, in URL or key=value form.
package connstr

import "net/url"

// WithSearchPath sets search_path to schema: a query parameter of a URL
// (postgres://…?search_path=s), or one more setting of a key=value string. pgx sends it
// to the server as a run-time parameter, so every connection uses that schema.
func WithSearchPath(raw, schema string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return raw + " search_path=" + schema
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
