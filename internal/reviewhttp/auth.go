package reviewhttp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
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

// The two admission webhooks a credential may be bound to.
const (
	WebhookCommitRequests = "commitrequests"
	WebhookAttribution    = "attribution"
)

// Auth authenticates the callers of kubescribe's admission webhooks and binds them to routes,
// with the same credential -> routes rules as the audit endpoint (audit.Authenticator), and to
// webhooks:
//   - a client certificate the listener verified, bound by its Subject common name to routes
//     (Callers.CertRoutes) and to the webhooks CertWebhooks lists for it (both when unlisted:
//     the apiserver presents one certificate per host, and it never appears in a URL);
//   - a webhook token (WebhookToken): derived from a secret of the token file for one webhook,
//     accepted by that webhook only, in the last segment of the webhook's URL path (for
//     managed clusters, whose apiserver presents no client certificate) or as a bearer token.
//     A URL leaks (the apiserver puts it in errors it returns to the user whose request
//     called the webhook), so a token in a URL opens one webhook at most;
//   - a secret of the token file itself, as a bearer token only (the apiserver's
//     AdmissionConfiguration kubeconfig sends it in a header, to both webhooks of the host),
//     never in a URL path.
//
// A nil *Auth authenticates nobody.
type Auth struct {
	// Callers holds the verified certificates' routes and the token file's secrets.
	Callers audit.Authenticator
	// CertWebhooks binds verified client certificates, by Subject common name, to the webhooks
	// they may call; a common name not listed may call both.
	CertWebhooks map[string][]string
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
	refusedWebhookNotBound = "webhook_not_bound"
)

// NewAuthMetrics registers kubescribe_admission_refused_total with reg.
func NewAuthMetrics(reg prometheus.Registerer) *AuthMetrics {
	m := &AuthMetrics{refused: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "kubescribe_admission_refused_total",
		Help: "Admission webhook requests refused before their body was read, by webhook (commitrequests, attribution) and reason: unauthenticated (401: no credential, or a token of the other webhook), route_not_bound (403) or webhook_not_bound (403: a client certificate bound to the other webhook).",
	}, []string{"webhook", "reason"})}
	for _, w := range []string{WebhookCommitRequests, WebhookAttribution} {
		for _, r := range []string{refusedUnauthenticated, refusedRouteNotBound, refusedWebhookNotBound} {
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

// ValidatePathTokens checks that the token file's secrets hold only unreserved characters
// (RFC 3986: letters, digits, '-', '.', '_', '~'), so that they travel unchanged in a bearer
// header (and, before webhook tokens, in a URL path). The error names the token file line,
// never the token.
func ValidatePathTokens(path string, tokens []audit.Token) error {
	for _, t := range tokens {
		for _, c := range t.Value {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~') {
				return fmt.Errorf("admission token file %q line %d: a token may hold only letters, digits, '-', '.', '_' and '~': `openssl rand -hex 32` makes one", path, t.Line)
			}
		}
	}
	return nil
}

// errNoAuth is what a nil Auth answers; errSecretInPath what a token file's secret in a URL
// path gets (an upgrade's leftover: the webhook must be registered again with its token).
var (
	errNoAuth       = errors.New("no authenticator configured")
	errSecretInPath = errors.New("the URL path holds a secret of the admission token file itself, which is accepted as a bearer token only: register the webhook again (kubescribe admission-webhook-config or attribution-webhook-config) to put its own webhook token there, and replace the secret, which has been in a URL")
)

// webhookTokenLabel is what WebhookToken's HMAC is computed over, before the webhook's name.
const webhookTokenLabel = "kubescribe admission webhook token v1\x00"

// WebhookToken is the token of webhook (WebhookCommitRequests or WebhookAttribution) derived
// from secret, a token of the admission token file: HMAC-SHA-256(secret, label + webhook), in
// hex. It is bound to the secret's routes and accepted by that webhook only; the secret
// cannot be recovered from it, nor the other webhook's token.
func WebhookToken(secret []byte, webhook string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(webhookTokenLabel + webhook))
	return hex.EncodeToString(m.Sum(nil))
}

// WebhookTokens are the tokens of webhook derived from secrets (WebhookToken), bound to the
// same routes; each is named after its secret's line.
func WebhookTokens(secrets []audit.Token, webhook string) []audit.Token {
	out := make([]audit.Token, len(secrets))
	for i, t := range secrets {
		out[i] = audit.Token{Value: []byte(WebhookToken(t.Value, webhook)), Routes: t.Routes, Line: t.Line}
	}
	return out
}

// secrets are the token file's tokens in force.
func (a *Auth) secrets() []audit.Token {
	if a.Callers.TokenFile != nil {
		return a.Callers.TokenFile.Tokens()
	}
	return a.Callers.Tokens
}

// webhookToken authenticates token as webhook's own token.
func (a *Auth) webhookToken(webhook string, token []byte) (audit.Caller, bool) {
	derived := audit.Authenticator{Tokens: WebhookTokens(a.secrets(), webhook)}
	c, ok := derived.AuthenticateToken(token)
	if ok {
		c.Name += " (" + webhook + " token)"
	}
	return c, ok
}

// secret authenticates token as a secret of the token file (bound to both webhooks).
func (a *Auth) secret(token []byte) (audit.Caller, bool) {
	secrets := audit.Authenticator{Tokens: a.secrets()}
	return secrets.AuthenticateToken(token)
}

// Authenticate identifies the caller of r for webhook, before anything of its body is read: by
// its verified client certificate, else pathToken (the URL path's token segment, "" for none:
// webhook's own token only), else a bearer token (webhook's own token, or a secret of the
// token file). It answers 401 (nothing identifies the caller for this webhook) or 403 (a
// certificate bound to the other webhook) itself, logs and counts it, and returns false.
// webhook names the webhook in logs and metrics too.
func (a *Auth) Authenticate(w http.ResponseWriter, r *http.Request, log *slog.Logger, webhook, pathToken string) (audit.Caller, bool) {
	var err error
	bearer, hasBearer := bearerToken(r)
	if a == nil {
		err = errNoAuth
	} else {
		if c, ok := a.Callers.ClientCert(r); ok {
			if hooks, listed := a.CertWebhooks[c.Name]; listed && !slices.Contains(hooks, webhook) {
				log.Warn("admission client certificate not bound to the webhook", "webhook", webhook, "remote", r.RemoteAddr, "credential", c.Name)
				a.Metrics.count(webhook, refusedWebhookNotBound)
				http.Error(w, fmt.Sprintf("forbidden: this client certificate may not call the %s webhook", webhook), http.StatusForbidden)
				return audit.Caller{}, false
			}
			return c, true
		}
		switch {
		case pathToken != "":
			if c, ok := a.webhookToken(webhook, []byte(pathToken)); ok {
				return c, true
			}
			if _, ok := a.secret([]byte(pathToken)); ok {
				err = errSecretInPath
			}
		case hasBearer:
			if c, ok := a.webhookToken(webhook, bearer); ok {
				return c, true
			}
			if c, ok := a.secret(bearer); ok {
				return c, true
			}
		case r.Header.Get("Authorization") == "" && a.AllowUnauthenticated:
			return audit.Caller{Method: audit.AuthAnonymous, Name: "anonymous", Routes: []string{a.Callers.LocalRoute}}, true
		}
	}
	// Say what was presented, never what it was (the path is not logged: it may hold a token).
	log.Warn("unauthenticated admission request", "webhook", webhook, "remote", r.RemoteAddr, "tls", r.TLS != nil,
		"pathToken", pathToken != "", "bearer", r.Header.Get("Authorization") != "", "err", err)
	if a != nil {
		a.Metrics.count(webhook, refusedUnauthenticated)
	}
	http.Error(w, "unauthenticated: present a client certificate signed by the admission client CA, or this webhook's token", http.StatusUnauthorized)
	return audit.Caller{}, false
}

// bearerToken returns the token of an "Authorization: Bearer <token>" header (the scheme is
// case-insensitive, RFC 7235).
func bearerToken(r *http.Request) ([]byte, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, false
	}
	token = strings.TrimSpace(token)
	return []byte(token), token != ""
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
// The token then appears wherever the apiserver logs or reports the webhook's URL
// (docs/security.md): give it a webhook token (PathTokenFor), never a secret of the file.
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

// PathTokenFor returns webhook's token (WebhookToken) derived from the first secret of
// tokens bound to route, "" when none is.
func PathTokenFor(tokens []audit.Token, route, webhook string) string {
	secret := TokenFor(tokens, route)
	if secret == "" {
		return ""
	}
	return WebhookToken([]byte(secret), webhook)
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

// ParseCertWebhooks reads client-certificate bindings to webhooks, each
// `<common name>=<webhook>[,<webhook>]` (the last '=' separates them), into a map for
// Auth.CertWebhooks. what names the flag in errors.
func ParseCertWebhooks(what string, bindings []string) (map[string][]string, error) {
	if len(bindings) == 0 {
		return nil, nil
	}
	m := make(map[string][]string, len(bindings))
	for _, b := range bindings {
		i := strings.LastIndexByte(b, '=')
		if i <= 0 {
			return nil, fmt.Errorf("%s %q: want <common name>=<webhook>[,<webhook>]", what, b)
		}
		cn := b[:i]
		if _, dup := m[cn]; dup {
			return nil, fmt.Errorf("%s: common name %q is bound twice; give all its webhooks in one binding", what, cn)
		}
		var hooks []string
		for _, h := range strings.Split(b[i+1:], ",") {
			if h != WebhookCommitRequests && h != WebhookAttribution {
				return nil, fmt.Errorf("%s %q: webhook %q: want %s or %s", what, b, h, WebhookCommitRequests, WebhookAttribution)
			}
			if !slices.Contains(hooks, h) {
				hooks = append(hooks, h)
			}
		}
		m[cn] = hooks
	}
	return m, nil
}
