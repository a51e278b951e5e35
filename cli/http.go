package cli

import (
	"fmt"
	"slices"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqhttp"
)

// httpFlags are the worker's flags for kinds run by HTTP endpoints (fenceqhttp).
func httpFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringSliceFlag{Name: "http", Usage: "run kind KIND by POSTing its args to URL, signed with --http-secret: " +
			"KIND=URL, repeatable (see docs/other-languages.md)"},
		&ucli.StringFlag{Name: "http-secret", EnvVars: []string{"FENCEQ_HTTP_SECRET"},
			Usage: "the shared secret that signs every --http request (required with --http; prefer the environment variable)"},
		&ucli.DurationFlag{Name: "http-timeout", Usage: "bound on each --http request (default none: the lease bounds it)"},
		&ucli.StringSliceFlag{Name: "http-retry-4xx", Usage: "an --http KIND whose 4xx answers are retried rather than discarded, repeatable"},
	}
}

// httpEndpoints reads the kinds of --http, before the worker connects. It refuses a
// malformed --http or URL, a kind given twice, an --http without --http-secret, and
// --http-retry-4xx naming a kind --http does not give.
func httpEndpoints(c *ucli.Context) ([]fenceqhttp.Endpoint, error) {
	specs := c.StringSlice("http")
	retry := c.StringSlice("http-retry-4xx")
	if len(specs) == 0 {
		if len(retry) > 0 {
			return nil, usageError{Err: fmt.Errorf("--http-retry-4xx %s: no --http kind", retry[0])}
		}
		return nil, nil
	}
	secret := c.String("http-secret")
	if secret == "" {
		return nil, usageError{Err: fmt.Errorf("--http needs a secret to sign its requests: set FENCEQ_HTTP_SECRET (or --http-secret)")}
	}
	if c.Duration("http-timeout") < 0 {
		return nil, usageError{Err: fmt.Errorf("invalid --http-timeout %s: must not be negative", c.Duration("http-timeout"))}
	}
	check := fenceq.NewHandlers() // finds bad kinds, URLs and duplicates before connecting
	var eps []fenceqhttp.Endpoint
	for _, spec := range specs {
		kind, url, ok := strings.Cut(spec, "=")
		if !ok || kind == "" || url == "" {
			return nil, usageError{Err: fmt.Errorf("invalid --http %q: want KIND=URL", spec)}
		}
		ep := fenceqhttp.Endpoint{Kind: kind, URL: url, Secret: []byte(secret),
			RetryClientErrors: slices.Contains(retry, kind),
			Opts:              &fenceq.HandlerOpts{Timeout: c.Duration("http-timeout")}}
		if err := fenceqhttp.Add(check, ep); err != nil {
			return nil, usageError{Err: fmt.Errorf("--http %s: %w", kind, err)}
		}
		eps = append(eps, ep)
	}
	for _, k := range retry {
		if !slices.ContainsFunc(eps, func(ep fenceqhttp.Endpoint) bool { return ep.Kind == k }) {
			return nil, usageError{Err: fmt.Errorf("--http-retry-4xx %s: no --http kind %q", k, k)}
		}
	}
	return eps, nil
}

// addHTTPKinds registers eps on hs, their responses counted by metrics. It fails for a
// kind registered already (a built-in kind).
func addHTTPKinds(hs *fenceq.Handlers, eps []fenceqhttp.Endpoint, metrics fenceqhttp.Metrics) error {
	for _, ep := range eps {
		ep.Metrics = metrics
		if err := fenceqhttp.Add(hs, ep); err != nil {
			return usageError{Err: fmt.Errorf("--http %s: %w", ep.Kind, err)}
		}
	}
	return nil
}
