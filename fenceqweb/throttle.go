package fenceqweb

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// maxThrottled bounds how many client addresses the login throttle remembers. When it
// is full, addresses whose window has ended are forgotten first, then the one whose
// window started first: memory stays bounded whatever number of addresses fail.
const maxThrottled = 10_000

// loginThrottle counts failed logins per client address over a fixed window: after
// limit failures the address is refused until its window ends. Requests that carry no
// credentials at all (a browser's first request, before it asks for them) are not
// failures; a successful login neither counts nor clears the count.
type loginThrottle struct {
	limit  int
	window time.Duration
	max    int
	now    func() time.Time // the clock, replaced in tests

	mu      sync.Mutex
	entries map[string]*loginFailures
}

type loginFailures struct {
	start time.Time // the first failure of the window
	n     int
}

func newLoginThrottle() *loginThrottle {
	return &loginThrottle{limit: LoginFailureLimit, window: LoginFailureWindow, max: maxThrottled, now: time.Now,
		entries: map[string]*loginFailures{}}
}

// retryAfter is how long key stays refused: 0 when it may try.
func (t *loginThrottle) retryAfter(key string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[key]
	if !ok {
		return 0
	}
	now := t.now()
	end := e.start.Add(t.window)
	if !now.Before(end) {
		delete(t.entries, key)
		return 0
	}
	if e.n < t.limit {
		return 0
	}
	return end.Sub(now)
}

// fail records a failed login of key.
func (t *loginThrottle) fail(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if e, ok := t.entries[key]; ok && now.Before(e.start.Add(t.window)) {
		e.n++
		return
	}
	delete(t.entries, key)
	if len(t.entries) >= t.max {
		t.evict(now)
	}
	t.entries[key] = &loginFailures{start: now, n: 1}
}

// evict forgets every address whose window has ended, or, when none has, the one
// whose window started first.
func (t *loginThrottle) evict(now time.Time) {
	var oldest string
	var oldestStart time.Time
	for k, e := range t.entries {
		if !now.Before(e.start.Add(t.window)) {
			delete(t.entries, k)
			continue
		}
		if oldest == "" || e.start.Before(oldestStart) {
			oldest, oldestStart = k, e.start
		}
	}
	if len(t.entries) >= t.max && oldest != "" {
		delete(t.entries, oldest)
	}
}

// size is how many addresses the throttle remembers.
func (t *loginThrottle) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}

// clientAddr is the address failed logins are counted by: the request's remote IP, or,
// with TrustProxy, the last X-Forwarded-For entry (the one the proxy in front of the
// dashboard added; entries before it are whatever the client sent).
func clientAddr(r *http.Request, trustProxy bool) string {
	if trustProxy {
		if vs := r.Header.Values("X-Forwarded-For"); len(vs) > 0 {
			parts := strings.Split(vs[len(vs)-1], ",")
			if ip := net.ParseIP(strings.TrimSpace(parts[len(parts)-1])); ip != nil {
				return ip.String()
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// throttleKey is what an address is counted under: an IPv4 address itself, an IPv6
// address by its /64 network, which one client usually holds whole.
func throttleKey(addr string) string {
	ip := net.ParseIP(addr)
	if ip == nil || ip.To4() != nil {
		return addr
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}
