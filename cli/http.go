package cli

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

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
		&ucli.StringFlag{Name: "http-config", EnvVars: []string{"FENCEQ_HTTP_CONFIG"}, Usage: "a file of HTTP kinds, one a line: " +
			"KIND=URL [timeout=DURATION] [retry-4xx]; # starts a comment (added to --http)"},
	}
}

// httpSpec is one HTTP kind as --http or a line of --http-config gives it.
type httpSpec struct {
	kind, url string
	timeout   time.Duration // 0: --http-timeout
	retry4xx  bool
	where     string // "--http" or "FILE:LINE", for errors
}

// readHTTPConfig reads --http-config: one kind a line, KIND=URL followed by the options
// timeout=DURATION and retry-4xx; blank lines and text after # are ignored.
func readHTTPConfig(path string) ([]httpSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usageError{Err: fmt.Errorf("--http-config: %w", err)}
	}
	var out []httpSpec
	for i, line := range strings.Split(string(data), "\n") {
		where := fmt.Sprintf("%s:%d", path, i+1)
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		kind, url, ok := strings.Cut(fields[0], "=")
		if !ok || kind == "" || url == "" {
			return nil, usageError{Err: fmt.Errorf("%s: %q: want KIND=URL [timeout=DURATION] [retry-4xx]", where, fields[0])}
		}
		sp := httpSpec{kind: kind, url: url, where: where}
		for _, opt := range fields[1:] {
			switch name, val, _ := strings.Cut(opt, "="); name {
			case "timeout":
				d, err := time.ParseDuration(val)
				if err != nil || d <= 0 {
					return nil, usageError{Err: fmt.Errorf("%s: invalid timeout %q: want a positive duration such as 30s", where, val)}
				}
				sp.timeout = d
			case "retry-4xx":
				if val != "" {
					return nil, usageError{Err: fmt.Errorf("%s: retry-4xx takes no value", where)}
				}
				sp.retry4xx = true
			default:
				return nil, usageError{Err: fmt.Errorf("%s: unknown option %q (want timeout=DURATION or retry-4xx)", where, opt)}
			}
		}
		out = append(out, sp)
	}
	return out, nil
}

// httpEndpoints reads the kinds of --http, before the worker connects. It refuses a
// malformed --http or URL, a kind given twice, an --http without --http-secret, and
// --http-retry-4xx naming a kind --http does not give.
func httpEndpoints(c *ucli.Context) ([]fenceqhttp.Endpoint, error) {
	var specs []httpSpec
	for _, spec := range c.StringSlice("http") {
		kind, url, ok := strings.Cut(spec, "=")
		if !ok || kind == "" || url == "" {
			return nil, usageError{Err: fmt.Errorf("invalid --http %q: want KIND=URL", spec)}
		}
		specs = append(specs, httpSpec{kind: kind, url: url, where: "--http"})
	}
	if path := c.String("http-config"); path != "" {
		fromFile, err := readHTTPConfig(path)
		if err != nil {
			return nil, err
		}
		specs = append(specs, fromFile...)
	}
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
	for _, sp := range specs {
		timeout := sp.timeout
		if timeout == 0 {
			timeout = c.Duration("http-timeout")
		}
		ep := fenceqhttp.Endpoint{Kind: sp.kind, URL: sp.url, Secret: []byte(secret),
			RetryClientErrors: sp.retry4xx || slices.Contains(retry, sp.kind),
			Opts:              &fenceq.HandlerOpts{Timeout: timeout}}
		if err := fenceqhttp.Add(check, ep); err != nil {
			return nil, usageError{Err: fmt.Errorf("%s %s: %w", sp.where, sp.kind, err)}
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
