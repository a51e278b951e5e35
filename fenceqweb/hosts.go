package fenceqweb

import (
	"net"
	"net/http"
	"strconv"
	"strings"
)

// hostPolicy decides which Host headers the dashboard answers to (Config.AllowedHosts).
// A page of another site can have its DNS name rebound to 127.0.0.1 and then send
// same-origin requests to a dashboard on loopback: those requests carry the other
// site's name in Host, which this check refuses before any handler runs.
type hostPolicy struct {
	// any allows every host: the entry "*", or Auth without AllowedHosts.
	any     bool
	allowed []hostEntry
}

// hostEntry is one AllowedHosts entry: a lower-case name or address without brackets,
// and a port, or "" for any port.
type hostEntry struct {
	host, port string
}

func newHostPolicy(cfg Config) (*hostPolicy, error) {
	entries, err := parseAllowedHosts(cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	p := &hostPolicy{allowed: entries}
	if cfg.Auth.Configured() && len(cfg.AllowedHosts) == 0 {
		p.any = true
	}
	for _, e := range entries {
		if e.host == "*" {
			p.any = true
		}
	}
	return p, nil
}

// parseAllowedHosts checks and normalizes Config.AllowedHosts.
func parseAllowedHosts(hosts []string) ([]hostEntry, error) {
	out := make([]hostEntry, 0, len(hosts))
	for _, raw := range hosts {
		e, ok := parseHostEntry(raw)
		if !ok {
			return nil, invalid("AllowedHosts", "%q: want a host name or IP address, optionally with :PORT "+
				"(such as dash.example.com, dash.example.com:8443, 10.0.0.5 or [fd00::5]:8081), or *", raw)
		}
		out = append(out, e)
	}
	return out, nil
}

func parseHostEntry(raw string) (hostEntry, bool) {
	s := strings.TrimSpace(raw)
	if s == "*" {
		return hostEntry{host: "*"}, true
	}
	host, port := splitHostPort(s)
	if host == "" || (port == "" && strings.HasSuffix(s, ":")) {
		return hostEntry{}, false
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return hostEntry{}, false
		}
	}
	if net.ParseIP(host) == nil && !validHostName(host) {
		return hostEntry{}, false
	}
	return hostEntry{host: host, port: port}, true
}

// validHostName reports whether s is made of DNS labels: letters, digits, '-' and '_'
// between dots.
func validHostName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// splitHostPort splits a Host header or an AllowedHosts entry into its lower-case host
// (brackets and one trailing dot removed) and its port ("" when it has none). An IPv6
// address without brackets is a host without a port.
func splitHostPort(s string) (host, port string) {
	host = s
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	return host, port
}

// isLoopbackHost reports whether host names this machine whatever DNS says: localhost
// and its subdomains (RFC 6761; browsers resolve them to loopback themselves, so no
// other site can rebind them), or a loopback address.
func isLoopbackHost(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// allows reports whether the request's Host header is one the dashboard answers to.
func (p *hostPolicy) allows(r *http.Request) bool {
	if p.any {
		return true
	}
	host, port := splitHostPort(r.Host)
	if host == "" {
		return false
	}
	if isLoopbackHost(host) {
		return true
	}
	for _, e := range p.allowed {
		if e.host == host && (e.port == "" || e.port == port) {
			return true
		}
	}
	return false
}
