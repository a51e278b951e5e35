package fenceqweb

import (
	"net/http"
	"strings"
)

// actor names who takes an action in the audit trail (queue.AuditRecord.Actor): the
// basic-auth user, "token" for the bearer token, or "loopback" when the dashboard has no
// auth (it then listens on loopback only). The request passed the auth check already.
func (h *Handler) actor(r *http.Request) string {
	if !h.cfg.Auth.Configured() {
		return "dashboard:loopback"
	}
	if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		return "dashboard:token"
	}
	if user, pass, ok := r.BasicAuth(); ok {
		if h.cfg.Auth.Token != "" && equal(pass, h.cfg.Auth.Token) {
			return "dashboard:token"
		}
		return "dashboard:" + user
	}
	return "dashboard"
}
