package reviewhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// Auth authenticates the callers of kubescribe's admission webhooks and binds them to routes,
// with the same credential -> routes rules as the audit endpoint (audit.Authenticator): a
// client certificate the listener verified (bound by its Subject common name), else a token,
// given as the last segment of the webhook's URL path (for managed clusters, whose apiserver
// presents no client certificate) or as a bearer token. A nil *Auth authenticates nobody.
type Auth struct {
	Callers audit.Authenticator
	// AllowUnauthenticated serves a caller without any credential as one bound to
	// Callers.LocalRoute. Unsafe: anyone who reaches the listener is then trusted as the local
	// cluster's apiserver.
	AllowUnauthenticated bool
	// Metrics counts refusals; nil counts nowhere.
	Metrics *AuthMetrics
}

// AuthMetrics count the requests an Auth refused.
type AuthMetrics struct {
	refused *prometheus.CounterVec
}

// Reasons of kubescribe_admission_refused_total.
const (
	refusedUnauthenticated = "unauthenticated"
	refusedRouteNotBound   = "route_not_bound"
)

// NewAuthMetrics registers kubescribe_admission_refused_total with reg.
func NewAuthMetrics(reg prometheus.Registerer) *AuthMetrics {
	m := &AuthMetrics{refused: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "kubescribe_admission_refused_total",
		Help: "Admission webhook requests refused before their body was read, by webhook (commitrequests, attribution) and reason: unauthenticated (401) or route_not_bound (403).",
	}, []string{"webhook", "reason"})}
	for _, w := range []string{"commitrequests", "attribution"} {
		for _, r := range []string{refusedUnauthenticated, refusedRouteNotBound} {
			m.refused.WithLabelValues(w, r)
		}
	}
	return m
}

func (m *AuthMetrics) count(webhook, reason string) {
	if m != nil {
		m.refused.WithLabelValues(webhook, reason).Inc()
	}
}

// ValidatePathTokens checks that tokens can be given in a URL path segment: only unreserved
// characters (RFC 3986: letters, digits, '-', '.', '_', '~'), so the apiserver sends them as
// they are. The error names the token file line, never the token.
func ValidatePathTokens(path string, tokens []audit.Token) error {
	for _, t := range tokens {
		for _, c := range t.Value {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
				return fmt.Errorf("admission token file %q line %d: a token may hold only letters, digits, '-', '.', '_' and '~' (it is part of a URL path); `openssl rand -hex 32` makes one", path, t.Line)
			}
		}
	}
	return nil
}

// errNoAuth is what a nil Auth answers.
var errNoAuth = errors.New("no authenticator configured")

// Authenticate identifies the caller of r, before anything of its body is read: by its
// verified client certificate, else pathToken (the URL path's token segment, "" for none),
// else a bearer token. It answers 401 itself, logs and counts it, and returns false when
// nothing identifies the caller. webhook names the webhook in logs and metrics.
func (a *Auth) Authenticate(w http.ResponseWriter, r *http.Request, log *slog.Logger, webhook, pathToken string) (audit.Caller, bool) {
	var err error
	if a == nil {
		err = errNoAuth
	} else {
		if c, ok := a.Callers.ClientCert(r); ok {
			return c, true
		}
		if pathToken != "" {
			if c, ok := a.Callers.AuthenticateToken([]byte(pathToken)); ok {
				return c, true
			}
		} else if c, ok := a.Callers.Authenticate(r); ok {
			return c, true
		}
		if pathToken == "" && r.Header.Get("Authorization") == "" && a.AllowUnauthenticated {
			return audit.Caller{Method: audit.AuthAnonymous, Name: "anonymous", Routes: []string{a.Callers.LocalRoute}}, true
		}
	}
	// Say what was presented, never what it was (the path is not logged: it may hold a token).
	log.Warn("unauthenticated admission request", "webhook", webhook, "remote", r.RemoteAddr, "tls", r.TLS != nil,
		"pathToken", pathToken != "", "bearer", r.Header.Get("Authorization") != "", "err", err)
	if a != nil {
		a.Metrics.count(webhook, refusedUnauthenticated)
	}
	http.Error(w, "unauthenticated: present a client certificate signed by the admission client CA, or a valid token", http.StatusUnauthorized)
	return audit.Caller{}, false
}

// Permit answers 403 itself, logs and counts it, and returns false, unless caller may post for
// route.
func (a *Auth) Permit(w http.ResponseWriter, r *http.Request, log *slog.Logger, webhook string, caller audit.Caller, route string) bool {
	if caller.MayPost(route) {
		return true
	}
	log.Warn("admission credential not bound to the route", "webhook", webhook, "route", route, "remote", r.RemoteAddr,
		"method", string(caller.Method), "credential", caller.Name)
	if a != nil {
		a.Metrics.count(webhook, refusedRouteNotBound)
	}
	http.Error(w, fmt.Sprintf("forbidden: this credential may not post reviews for route %q", route), http.StatusForbidden)
	return false
}

// AddPathToken puts token into the path of a webhook's client configuration, as its last
// segment, so that an apiserver which presents no client certificate authenticates with it.
// The token then appears wherever the apiserver logs the webhook's URL (docs/security.md).
func AddPathToken(cc *admissionregistrationv1.WebhookClientConfig, token string) {
	if token == "" {
		return
	}
	if cc.URL != nil {
		u := strings.TrimRight(*cc.URL, "/") + "/" + token
		cc.URL = &u
	}
	if cc.Service != nil && cc.Service.Path != nil {
		p := strings.TrimRight(*cc.Service.Path, "/") + "/" + token
		cc.Service.Path = &p
	}
}

// TokenFor returns the first token of tokens bound to route, "" when none is.
func TokenFor(tokens []audit.Token, route string) string {
	for _, t := range tokens {
		if slices.Contains(t.Routes, route) {
			return string(t.Value)
		}
	}
	return ""
}
