package app

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
)

// metricsPath is the one path of the metrics listener, and the non-resource URL a caller must
// be allowed to get.
const metricsPath = "/metrics"

// The reviews of the metrics listener. Answers are cached briefly, so that a scraper costs the
// apiserver a TokenReview and a SubjectAccessReview now and then, not at every scrape, and a
// revoked token or binding stops working within seconds. Failed reviews are not cached. The
// caches are bounded: a flood of distinct tokens does not grow memory. A token the apiserver
// refused is cached apart from the accepted ones, so a flood of random tokens evicts only other
// refused tokens, never a scraper's accepted one.
const (
	metricsTokenCacheTTL       = 30 * time.Second
	metricsTokenDenyCacheTTL   = 5 * time.Second
	metricsAllowCacheTTL       = 30 * time.Second
	metricsDenyCacheTTL        = 5 * time.Second
	metricsReviewTimeout       = 10 * time.Second
	metricsTokenCacheSize      = 4096
	metricsTokenDenyCacheSize  = 4096
	metricsUserCacheSize       = 1024
	metricsSourceCacheSize     = 1024
	metricsSourceCacheTTL      = 10 * time.Minute
	metricsSourceReviewsPerSec = 1.0
	metricsSourceReviewBurst   = 10.0
)

// metricsThrottleLogInterval bounds how often requests refused for their source's rate are
// logged: a flood would otherwise flood the log.
const metricsThrottleLogInterval = 10 * time.Second

// metricsReviewBackoff: a review the apiserver could not answer (a 5xx, 429, a reset
// connection) is tried again a few times within a second or so; then the request is refused.
var metricsReviewBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}

// Reasons of kubescribe_metrics_refused_total.
const (
	metricsRefusedUnauthenticated = "unauthenticated"
	metricsRefusedThrottled       = "throttled"
	metricsRefusedForbidden       = "forbidden"
	metricsRefusedError           = "error"
)

// errInvalidBearerToken is why a token the TokenReview did not accept, without saying why, is
// refused.
var errInvalidBearerToken = errors.New("invalid bearer token")

// errReviewThrottled is why a token is not reviewed: its source asked for too many TokenReviews.
var errReviewThrottled = errors.New("too many TokenReviews from this source")

// metricsAuth authenticates every request to the metrics listener with a TokenReview of its
// bearer token and authorizes its user with a SubjectAccessReview for `get` on the
// non-resource URL /metrics, both asked of the Kubernetes API with kubescribe's own
// credentials through client-go, as k8s.io/apiserver's delegating authenticator and authorizer
// would (which kubescribe does not link: they bring webhook plugins, CEL, gRPC and
// OpenTelemetry, and double the binary).
type metricsAuth struct {
	kube kubernetes.Interface
	// tokens holds the users of accepted tokens and denied the refused tokens (briefly), both
	// keyed by tokenKey, never the token; access holds SubjectAccessReviewStatuses, keyed by a
	// hash of their spec.
	tokens, denied, access *cache.LRUExpireCache
	// sources holds a *reviewBucket per source (sourceKey): the TokenReviews it may still ask.
	sources   *cache.LRUExpireCache
	sourcesMu sync.Mutex
	clock     clock.PassiveClock
	// salt keys tokenKey's hash, drawn at start.
	salt    []byte
	log     *slog.Logger
	refused *prometheus.CounterVec
	// lastThrottleLog is the unix nanoseconds of the last throttled request logged.
	lastThrottleLog atomic.Int64
}

// newMetricsAuth reviews on kube, and registers kubescribe_metrics_refused_total with reg.
func newMetricsAuth(kube kubernetes.Interface, log *slog.Logger, reg prometheus.Registerer) *metricsAuth {
	return newMetricsAuthWithClock(kube, log, reg, clock.RealClock{})
}

// newMetricsAuthWithClock is newMetricsAuth whose caches and rates follow clk (tests).
func newMetricsAuthWithClock(kube kubernetes.Interface, log *slog.Logger, reg prometheus.Registerer, clk clock.PassiveClock) *metricsAuth {
	m := &metricsAuth{
		kube:    kube,
		tokens:  cache.NewLRUExpireCacheWithClock(metricsTokenCacheSize, clk),
		denied:  cache.NewLRUExpireCacheWithClock(metricsTokenDenyCacheSize, clk),
		access:  cache.NewLRUExpireCacheWithClock(metricsUserCacheSize, clk),
		sources: cache.NewLRUExpireCacheWithClock(metricsSourceCacheSize, clk),
		clock:   clk,
		salt:    make([]byte, 32),
		log:     log,
		refused: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_metrics_refused_total",
			Help: "Requests to the metrics listener refused, by reason: unauthenticated (401: no bearer token, or one the TokenReview did not accept), throttled (429: its source asked for too many TokenReviews), forbidden (403: the user may not get /metrics) or error (500: the SubjectAccessReview failed).",
		}, []string{"reason"}),
	}
	_, _ = rand.Read(m.salt) // never fails (crypto/rand)
	for _, r := range []string{metricsRefusedUnauthenticated, metricsRefusedThrottled, metricsRefusedForbidden, metricsRefusedError} {
		m.refused.WithLabelValues(r)
	}
	return m
}

// metricsHandler serves GET /metrics from reg. With auth, every request is authenticated
// first, whatever its path, and the user authorized before the page is served.
func metricsHandler(reg *prometheus.Registry, auth *metricsAuth) http.Handler {
	page := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var caller *authenticationv1.UserInfo
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
func (m *metricsAuth) authenticate(w http.ResponseWriter, r *http.Request) (*authenticationv1.UserInfo, bool) {
	caller, err := m.userOf(r)
	if caller != nil {
		// Authenticated: the token goes no further into the handler.
		r.Header.Del("Authorization")
		return caller, true
	}
	if errors.Is(err, errReviewThrottled) {
		m.refused.WithLabelValues(metricsRefusedThrottled).Inc()
		now := m.clock.Now().UnixNano()
		if last := m.lastThrottleLog.Load(); now-last >= int64(metricsThrottleLogInterval) && m.lastThrottleLog.CompareAndSwap(last, now) {
			m.log.Warn("metrics requests throttled: too many TokenReviews from one source (logged at most every 10s)", "remote", r.RemoteAddr)
		}
		w.Header().Set("Retry-After", "1")
		http.Error(w, "too many requests with unknown bearer tokens from this address", http.StatusTooManyRequests)
		return nil, false
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
func (m *metricsAuth) authorize(w http.ResponseWriter, r *http.Request, caller *authenticationv1.UserInfo) bool {
	allowed, err := m.mayGetMetrics(r.Context(), caller)
	switch {
	case err != nil:
		m.log.Error("metrics request: the SubjectAccessReview failed", "user", caller.Username, "remote", r.RemoteAddr, "err", err)
		m.refused.WithLabelValues(metricsRefusedError).Inc()
		http.Error(w, "the authorization check failed", http.StatusInternalServerError)
		return false
	case !allowed:
		m.log.Warn("metrics request forbidden", "user", caller.Username, "remote", r.RemoteAddr)
		m.refused.WithLabelValues(metricsRefusedForbidden).Inc()
		http.Error(w, fmt.Sprintf("forbidden: user %q may not get %s", caller.Username, metricsPath), http.StatusForbidden)
		return false
	}
	return true
}

// userOf returns the user of r's bearer token, from the cache or a TokenReview, or nil with the
// reason (nil without a bearer token).
//
// The review leaves spec.audiences empty: the apiserver then accepts only tokens for its own
// audiences, so a token issued for another audience is refused. A review that failed is not
// cached. An accepted token is cached for metricsTokenCacheTTL; a refused one (with or without
// the answer's error) for metricsTokenDenyCacheTTL, in a cache of its own. A token in neither
// costs its source (sourceKey) a TokenReview of its bucket: past metricsSourceReviewBurst, one a
// second; without one, errReviewThrottled, and no review.
func (m *metricsAuth) userOf(r *http.Request) (*authenticationv1.UserInfo, error) {
	token := bearerToken(r)
	if token == "" {
		return nil, nil
	}
	key := m.tokenKey(token)
	if v, ok := m.tokens.Get(key); ok {
		return v.(*authenticationv1.UserInfo), nil
	}
	if v, ok := m.denied.Get(key); ok {
		return nil, v.(error)
	}
	if !m.bucketOf(sourceKey(r.RemoteAddr)).take(m.clock.Now()) {
		return nil, errReviewThrottled
	}
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	var answer *authenticationv1.TokenReview
	if err := askAPIServer(r.Context(), func(ctx context.Context) (err error) {
		answer, err = m.kube.AuthenticationV1().TokenReviews().Create(ctx, review, metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, fmt.Errorf("the TokenReview failed: %w", err)
	}
	status := answer.Status
	switch {
	case status.Authenticated:
		u := withAuthenticatedGroup(status.User)
		m.tokens.Add(key, &u, metricsTokenCacheTTL)
		return &u, nil
	case status.Error != "":
		err := errors.New(status.Error)
		m.denied.Add(key, err, metricsTokenDenyCacheTTL)
		return nil, err
	default:
		m.denied.Add(key, errInvalidBearerToken, metricsTokenDenyCacheTTL)
		return nil, errInvalidBearerToken
	}
}

// bucketOf is the TokenReview bucket of source, a new full one if it had none (or its entry
// was evicted, which only a flood from more than metricsSourceCacheSize sources causes).
func (m *metricsAuth) bucketOf(source string) *reviewBucket {
	m.sourcesMu.Lock()
	defer m.sourcesMu.Unlock()
	if v, ok := m.sources.Get(source); ok {
		return v.(*reviewBucket)
	}
	b := &reviewBucket{tokens: metricsSourceReviewBurst, last: m.clock.Now()}
	m.sources.Add(source, b, metricsSourceCacheTTL)
	return b
}

// reviewBucket is a token bucket of the TokenReviews one source may cause: it holds up to
// metricsSourceReviewBurst, refilled at metricsSourceReviewsPerSec.
type reviewBucket struct {
	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// take spends one review at now, or reports false when none is left.
func (b *reviewBucket) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(metricsSourceReviewBurst, b.tokens+elapsed.Seconds()*metricsSourceReviewsPerSec)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// sourceKey is the source a request's TokenReviews are counted against: its IPv4 address, or
// the /64 of its IPv6 address (one host usually holds a whole /64). The metrics listener is
// reached directly, so RemoteAddr is the peer's; no forwarding header is trusted.
func sourceKey(remoteAddr string) string {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	addr := ap.Addr().Unmap()
	if addr.Is4() {
		return addr.String()
	}
	return netip.PrefixFrom(addr.WithZone(""), 64).Masked().String()
}

// mayGetMetrics reports whether caller may get the non-resource URL /metrics, from the cache or
// a SubjectAccessReview.
func (m *metricsAuth) mayGetMetrics(ctx context.Context, caller *authenticationv1.UserInfo) (bool, error) {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:                  caller.Username,
		UID:                   caller.UID,
		Groups:                caller.Groups,
		Extra:                 accessReviewExtra(caller.Extra),
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: metricsPath, Verb: "get"},
	}}
	spec, err := json.Marshal(review.Spec)
	if err != nil {
		return false, err
	}
	key := sha256.Sum256(spec)
	var status authorizationv1.SubjectAccessReviewStatus
	if v, ok := m.access.Get(key); ok {
		status = v.(authorizationv1.SubjectAccessReviewStatus)
	} else {
		var answer *authorizationv1.SubjectAccessReview
		if err := askAPIServer(ctx, func(ctx context.Context) (err error) {
			answer, err = m.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			return err
		}); err != nil {
			return false, err
		}
		status = answer.Status
		ttl := metricsDenyCacheTTL
		if status.Allowed {
			ttl = metricsAllowCacheTTL
		}
		m.access.Add(key, status, ttl)
	}
	if status.Allowed && status.Denied {
		return false, errors.New("the SubjectAccessReview both allowed and denied")
	}
	return status.Allowed, nil
}

// tokenKey is the token cache's key for token: its HMAC-SHA-256 under a salt of the process, so
// that the cache never holds a token, nor a plain hash of one.
func (m *metricsAuth) tokenKey(token string) [sha256.Size]byte {
	h := hmac.New(sha256.New, m.salt)
	h.Write([]byte(token))
	return [sha256.Size]byte(h.Sum(nil))
}

// bearerToken is r's bearer token, read as k8s.io/apiserver reads it ("Bearer" in any case,
// then the token up to the next space), or "" when there is none.
func bearerToken(r *http.Request) string {
	parts := strings.SplitN(strings.TrimSpace(r.Header.Get("Authorization")), " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") {
		return ""
	}
	return parts[1]
}

// askAPIServer makes a review with call, within metricsReviewTimeout, trying it again on the
// errors after which the apiserver may well answer, as k8s.io/apiserver's webhooks do.
func askAPIServer(ctx context.Context, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, metricsReviewTimeout)
	defer cancel()
	return retry.OnError(metricsReviewBackoff, retriableReviewError, func() error { return call(ctx) })
}

// retriableReviewError is k8s.io/apiserver's webhook.DefaultShouldRetry: a reset or lost
// connection, a 500, a 504, a 429, or an answer asking to be asked again later.
func retriableReviewError(err error) bool {
	if utilnet.IsConnectionReset(err) || utilnet.IsHTTP2ConnectionLost(err) ||
		apierrors.IsInternalError(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) {
		return true
	}
	_, later := apierrors.SuggestsClientDelay(err)
	return later
}

// withAuthenticatedGroup is u in the group system:authenticated, as k8s.io/apiserver's
// authenticators put every authenticated user but the anonymous one.
func withAuthenticatedGroup(u authenticationv1.UserInfo) authenticationv1.UserInfo {
	const authenticated, unauthenticated = "system:authenticated", "system:unauthenticated"
	if u.Username == "system:anonymous" || slices.Contains(u.Groups, authenticated) || slices.Contains(u.Groups, unauthenticated) {
		return u
	}
	u.Groups = append(slices.Clip(u.Groups), authenticated)
	return u
}

// accessReviewExtra is a TokenReview's extra user information as a SubjectAccessReview's.
func accessReviewExtra(extra map[string]authenticationv1.ExtraValue) map[string]authorizationv1.ExtraValue {
	if extra == nil {
		return nil
	}
	out := make(map[string]authorizationv1.ExtraValue, len(extra))
	for k, v := range extra {
		out[k] = authorizationv1.ExtraValue(v)
	}
	return out
}
