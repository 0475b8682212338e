package app

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/util/wait"
	apiserverconfig "k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
)

// metricsPath is the one path of the metrics listener, and the non-resource URL a caller must
// be allowed to get.
const metricsPath = "/metrics"

// The reviews of the metrics listener. Answers are cached briefly, so that a scraper costs the
// apiserver a TokenReview and a SubjectAccessReview now and then, not at every scrape, and a
// revoked token or binding stops working within seconds. Failed reviews are not cached.
const (
	metricsTokenCacheTTL = 30 * time.Second
	metricsAllowCacheTTL = 30 * time.Second
	metricsDenyCacheTTL  = 5 * time.Second
	metricsReviewTimeout = 10 * time.Second
)

// Reasons of kubescribe_metrics_refused_total.
const (
	metricsRefusedUnauthenticated = "unauthenticated"
	metricsRefusedForbidden       = "forbidden"
	metricsRefusedError           = "error"
)

// metricsAuth authenticates every request to the metrics listener with a TokenReview of its
// bearer token and authorizes its user with a SubjectAccessReview for `get` on the
// non-resource URL /metrics, both asked of the Kubernetes API with kubescribe's own
// credentials, through k8s.io/apiserver's delegating authenticator and authorizer.
type metricsAuth struct {
	authn   authenticator.Request
	authz   authorizer.Authorizer
	log     *slog.Logger
	refused *prometheus.CounterVec
}

// newMetricsAuth builds the authenticator and authorizer on kube, and registers
// kubescribe_metrics_refused_total with reg.
func newMetricsAuth(kube kubernetes.Interface, log *slog.Logger, reg prometheus.Registerer) (*metricsAuth, error) {
	// A review the apiserver could not answer (a 5xx, a broken connection) is tried again a
	// few times within a second or so; then the request is refused.
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserverconfig.AnonymousAuthConfig{Enabled: false},
		TokenAccessReviewClient:  kube.AuthenticationV1(),
		TokenAccessReviewTimeout: metricsReviewTimeout,
		WebhookRetryBackoff:      &backoff,
		CacheTTL:                 metricsTokenCacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authentication: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             metricsAllowCacheTTL,
		DenyCacheTTL:              metricsDenyCacheTTL,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	m := &metricsAuth{authn: authn, authz: authz, log: log, refused: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "kubescribe_metrics_refused_total",
		Help: "Requests to the metrics listener refused, by reason: unauthenticated (401: no bearer token, or one the TokenReview did not accept), forbidden (403: the user may not get /metrics) or error (500: the SubjectAccessReview failed).",
	}, []string{"reason"})}
	for _, r := range []string{metricsRefusedUnauthenticated, metricsRefusedForbidden, metricsRefusedError} {
		m.refused.WithLabelValues(r)
	}
	return m, nil
}

// metricsHandler serves GET /metrics from reg. With auth, every request is authenticated
// first, whatever its path, and the user authorized before the page is served.
func metricsHandler(reg *prometheus.Registry, auth *metricsAuth) http.Handler {
	page := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var caller user.Info
		if auth != nil {
			var ok bool
			if caller, ok = auth.authenticate(w, r); !ok {
				return
			}
		}
		if r.URL.Path != metricsPath {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if auth != nil && !auth.authorize(w, r, caller) {
			return
		}
		page.ServeHTTP(w, r)
	})
}

// authenticate returns the user of r's bearer token, as a TokenReview of the Kubernetes API
// answers. Without one it answers 401 itself, logs and counts it, and returns false. The token
// is never logged.
func (m *metricsAuth) authenticate(w http.ResponseWriter, r *http.Request) (user.Info, bool) {
	resp, ok, err := m.authn.AuthenticateRequest(r)
	if ok {
		return resp.User, true
	}
	// err says why ("invalid bearer token", the TokenReview's error, or that the review could
	// not be made); it never holds the token.
	m.log.Warn("unauthenticated metrics request", "remote", r.RemoteAddr, "bearer", r.Header.Get("Authorization") != "", "err", err)
	m.refused.WithLabelValues(metricsRefusedUnauthenticated).Inc()
	w.Header().Set("WWW-Authenticate", `Bearer realm="kubescribe-metrics"`)
	http.Error(w, "unauthenticated: present a bearer token the Kubernetes API accepts (a ServiceAccount token)", http.StatusUnauthorized)
	return nil, false
}

// authorize reports whether caller may get /metrics, as a SubjectAccessReview of the
// Kubernetes API answers. Otherwise it answers 403 (or 500 when the review failed) itself,
// logs the user and counts it, and returns false.
func (m *metricsAuth) authorize(w http.ResponseWriter, r *http.Request, caller user.Info) bool {
	decision, _, err := m.authz.Authorize(r.Context(), authorizer.AttributesRecord{
		User: caller, Verb: "get", Path: metricsPath, ResourceRequest: false,
	})
	switch {
	case decision == authorizer.DecisionAllow:
		return true
	case err != nil:
		m.log.Error("metrics request: the SubjectAccessReview failed", "user", caller.GetName(), "remote", r.RemoteAddr, "err", err)
		m.refused.WithLabelValues(metricsRefusedError).Inc()
		http.Error(w, "the authorization check failed", http.StatusInternalServerError)
		return false
	default:
		m.log.Warn("metrics request forbidden", "user", caller.GetName(), "remote", r.RemoteAddr)
		m.refused.WithLabelValues(metricsRefusedForbidden).Inc()
		http.Error(w, fmt.Sprintf("forbidden: user %q may not get %s", caller.GetName(), metricsPath), http.StatusForbidden)
		return false
	}
}
