package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubescribe/kubescribe/test/controlplane"
)

// Users of fakeReviewer's tokens.
const (
	readerUser   = "system:serviceaccount:monitoring:prometheus"
	strangerUser = "system:serviceaccount:shop:web"
	sarFailsUser = "breaks-the-authorizer"
)

// fakeReviewer answers TokenReviews and SubjectAccessReviews as an apiserver would: three
// tokens authenticate (the reader may get /metrics, the stranger may not, the third's
// SubjectAccessReview fails with a 500), and extraUserToken as extraUser; every other token is
// refused.
type fakeReviewer struct {
	tokenReviews, accessReviews atomic.Int32
	// lastToken and lastAccess are the specs of the last TokenReview and SubjectAccessReview.
	lastToken  atomic.Pointer[authenticationv1.TokenReviewSpec]
	lastAccess atomic.Pointer[authorizationv1.SubjectAccessReviewSpec]
	// failTokenReviews is how many TokenReviews to come fail with a 500.
	failTokenReviews atomic.Int32
}

// plainRefusalPrefix starts the tokens fakeReviewer refuses without an error in the answer.
const plainRefusalPrefix = "plain-"

var fakeTokens = map[string]string{"reader-token": readerUser, "stranger-token": strangerUser, "sar-fails-token": sarFailsUser}

// extraUser is the user of extraUserToken: with a UID and extra information, and, unlike the
// apiserver's users, not in system:authenticated.
const extraUserToken = "extra-user-token"

var extraUser = authenticationv1.UserInfo{Username: "extra-user", UID: "5b1f", Groups: []string{"team"},
	Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/credential-id": {"JTI=1"}}}

func (f *fakeReviewer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	var tr authenticationv1.TokenReview
	var sar authorizationv1.SubjectAccessReview
	switch r.URL.Path {
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		f.tokenReviews.Add(1)
		if decodeReview(r, &tr) != nil {
			break
		}
		f.lastToken.Store(&tr.Spec)
		if f.failTokenReviews.Load() > 0 {
			f.failTokenReviews.Add(-1)
			etcdIsDown(w)
			return
		}
		if name, ok := fakeTokens[tr.Spec.Token]; ok {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: name, Groups: []string{"system:authenticated"}}}
		} else if tr.Spec.Token == extraUserToken {
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: extraUser}
		} else if strings.HasPrefix(tr.Spec.Token, plainRefusalPrefix) {
			tr.Status = authenticationv1.TokenReviewStatus{} // not authenticated, no error given
		} else {
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		_ = json.NewEncoder(w).Encode(tr)
		return
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		f.accessReviews.Add(1)
		if decodeReview(r, &sar) != nil {
			break
		}
		f.lastAccess.Store(&sar.Spec)
		if sar.Spec.User == sarFailsUser {
			etcdIsDown(w)
			return
		}
		na := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == readerUser && sar.Spec.ResourceAttributes == nil && na != nil && na.Path == "/metrics" && na.Verb == "get"
		_ = json.NewEncoder(w).Encode(sar)
		return
	default:
		http.NotFound(w, r)
		return
	}
	http.Error(w, "undecodable review", http.StatusBadRequest)
}

// etcdIsDown answers as an apiserver that cannot reach its storage.
func etcdIsDown(w http.ResponseWriter) {
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd is down","code":500}`)
}

// decodeReview decodes r's body into review, in JSON or in protobuf (which client-go's typed
// clients send to the apiserver by default).
func decodeReview(r *http.Request, review runtime.Object) error {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	_, _, err = scheme.Codecs.UniversalDeserializer().Decode(b, nil, review)
	return err
}

// newFakeReviewer serves a fakeReviewer and returns it with a rest config reaching it.
func newFakeReviewer(t *testing.T) (*fakeReviewer, *rest.Config) {
	t.Helper()
	f := &fakeReviewer{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, &rest.Config{Host: srv.URL}
}

func newTestMetricsAuth(t *testing.T, cfg *rest.Config, logs io.Writer, reg *prometheus.Registry) *metricsAuth {
	t.Helper()
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return newMetricsAuth(kube, slog.New(slog.NewTextHandler(logs, nil)), reg)
}

func serveMetrics(h http.Handler, method, path, authorization string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if authorization != "" {
		r.Header.Set("Authorization", authorization)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// An attacker without a token the Kubernetes API accepts gets 401 on every path; a real user
// the API does not allow to get /metrics gets 403; neither sees a metric, and neither's token
// reaches the log. The allowed reader gets the page, which counts the refusals.
func TestMetricsAuthRefusesWhoeverMayNotRead(t *testing.T) {
	f, cfg := newFakeReviewer(t)
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	auth := newTestMetricsAuth(t, cfg, &logs, reg)
	h := metricsHandler(reg, auth)

	for _, tc := range []struct {
		name, method, path, authorization string
		want                              int
	}{
		{name: "no credential", path: "/metrics", want: http.StatusUnauthorized},
		{name: "no credential, another path", path: "/debug/pprof/", want: http.StatusUnauthorized},
		{name: "no credential, POST", method: http.MethodPost, path: "/metrics", want: http.StatusUnauthorized},
		{name: "basic auth", path: "/metrics", authorization: "Basic YWRtaW46YWRtaW4=", want: http.StatusUnauthorized},
		{name: "empty bearer", path: "/metrics", authorization: "Bearer ", want: http.StatusUnauthorized},
		{name: "garbage token", path: "/metrics", authorization: "Bearer garbage-token", want: http.StatusUnauthorized},
		{name: "forged JWT", path: "/metrics", authorization: "Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bW9uaXRvcmluZzpwcm9tZXRoZXVzIn0.Zm9yZ2Vk", want: http.StatusUnauthorized},
		{name: "real user without the grant", path: "/metrics", authorization: "Bearer stranger-token", want: http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			w := serveMetrics(h, method, tc.path, tc.authorization)
			require.Equal(t, tc.want, w.Code, w.Body.String())
			require.NotContains(t, w.Body.String(), "kubescribe_")
			if tc.want == http.StatusUnauthorized {
				require.Equal(t, `Bearer realm="kubescribe-metrics"`, w.Header().Get("WWW-Authenticate"))
			}
		})
	}
	require.Equal(t, 7.0, testutil.ToFloat64(auth.refused.WithLabelValues(metricsRefusedUnauthenticated)))
	require.Equal(t, 1.0, testutil.ToFloat64(auth.refused.WithLabelValues(metricsRefusedForbidden)))
	for _, secret := range []string{"garbage-token", "stranger-token", "YWRtaW46YWRtaW4=", "Zm9yZ2Vk"} {
		require.NotContains(t, logs.String(), secret, "a credential reached the log")
	}
	require.Contains(t, logs.String(), "unauthenticated metrics request")
	require.Contains(t, logs.String(), `msg="metrics request forbidden" user=`+strangerUser)

	// The reader: the SubjectAccessReview asks for get on the non-resource URL /metrics.
	w := serveMetrics(h, http.MethodGet, "/metrics", "Bearer reader-token")
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.Contains(t, w.Body.String(), `kubescribe_metrics_refused_total{reason="unauthenticated"} 7`)
	spec := f.lastAccess.Load()
	require.Equal(t, readerUser, spec.User)
	require.Nil(t, spec.ResourceAttributes)
	require.Equal(t, &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}, spec.NonResourceAttributes)

	// Answers are cached: another scrape costs no review.
	tokenReviews, accessReviews := f.tokenReviews.Load(), f.accessReviews.Load()
	require.Equal(t, http.StatusOK, serveMetrics(h, http.MethodHead, "/metrics", "Bearer reader-token").Code)
	require.Equal(t, tokenReviews, f.tokenReviews.Load())
	require.Equal(t, accessReviews, f.accessReviews.Load())

	// Other paths and methods are answered only once authenticated, and cost no access review.
	require.Equal(t, http.StatusNotFound, serveMetrics(h, http.MethodGet, "/debug/pprof/", "Bearer reader-token").Code)
	require.Equal(t, http.StatusMethodNotAllowed, serveMetrics(h, http.MethodPost, "/metrics", "Bearer stranger-token").Code)
	require.Equal(t, accessReviews, f.accessReviews.Load())
}

// A SubjectAccessReview that fails refuses the request (500), counted and logged: kubescribe
// never serves the page on an error.
func TestMetricsAuthFailsClosed(t *testing.T) {
	_, cfg := newFakeReviewer(t)
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	auth := newTestMetricsAuth(t, cfg, &logs, reg)
	w := serveMetrics(metricsHandler(reg, auth), http.MethodGet, "/metrics", "Bearer sar-fails-token")
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.NotContains(t, w.Body.String(), "kubescribe_")
	require.Equal(t, 1.0, testutil.ToFloat64(auth.refused.WithLabelValues(metricsRefusedError)))
	require.Contains(t, logs.String(), "the SubjectAccessReview failed")

	// An apiserver that cannot be reached authenticates nobody.
	reg = prometheus.NewRegistry()
	auth = newTestMetricsAuth(t, &rest.Config{Host: "http://127.0.0.1:1"}, io.Discard, reg)
	w = serveMetrics(metricsHandler(reg, auth), http.MethodGet, "/metrics", "Bearer reader-token")
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Equal(t, 1.0, testutil.ToFloat64(auth.refused.WithLabelValues(metricsRefusedUnauthenticated)))
}

// The reviews as k8s.io/apiserver's delegating authenticator and authorizer made them: the
// TokenReview names no audience (the apiserver's own), the SubjectAccessReview carries the
// user's UID, groups (with system:authenticated) and extra information, a review the apiserver
// failed with a 500 is tried again, and the token cache never holds a token.
func TestMetricsAuthReviews(t *testing.T) {
	f, cfg := newFakeReviewer(t)
	reg := prometheus.NewRegistry()
	auth := newTestMetricsAuth(t, cfg, io.Discard, reg)
	h := metricsHandler(reg, auth)

	require.Equal(t, http.StatusForbidden, serveMetrics(h, http.MethodGet, "/metrics", "Bearer "+extraUserToken).Code)
	require.Empty(t, f.lastToken.Load().Audiences)
	require.Equal(t, &authorizationv1.SubjectAccessReviewSpec{
		User: extraUser.Username, UID: extraUser.UID, Groups: []string{"team", "system:authenticated"},
		Extra:                 map[string]authorizationv1.ExtraValue{"authentication.kubernetes.io/credential-id": {"JTI=1"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}, f.lastAccess.Load())

	// Two 500s, then the answer: one scrape, three TokenReviews, 200ms and 400ms apart.
	f.failTokenReviews.Store(2)
	before := f.tokenReviews.Load()
	require.Equal(t, http.StatusOK, serveMetrics(h, http.MethodGet, "/metrics", "bearer reader-token").Code)
	require.Equal(t, before+3, f.tokenReviews.Load())
	// Three 500s: the scrape is refused, and the failure is not cached.
	f.failTokenReviews.Store(3)
	require.Equal(t, http.StatusUnauthorized, serveMetrics(h, http.MethodGet, "/metrics", "Bearer stranger-token").Code)
	require.Equal(t, http.StatusForbidden, serveMetrics(h, http.MethodGet, "/metrics", "Bearer stranger-token").Code)

	keys := auth.tokens.Keys()
	require.Len(t, keys, 3, "the extra user, the reader and the stranger")
	for _, k := range keys {
		require.IsType(t, [32]byte{}, k)
	}
}

// testListeners is an App built by New with its ops and metrics servers running (nothing
// else), and the pool that verifies its serving certificate.
type testListeners struct {
	app  *App
	pool *x509.CertPool
}

// startListeners builds an App from o (with a serving certificate for 127.0.0.1 and an
// admission certificate of common name "admission", which the metrics listener serves too)
// and serves its ops and metrics listeners.
func startListeners(t *testing.T, o Options) testListeners {
	t.Helper()
	dir := t.TempDir()
	ca, err := controlplane.NewCA("test")
	require.NoError(t, err)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	for _, cn := range []string{"audit", "admission"} {
		certPEM, keyPEM, err := ca.Issue(cn, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, false)
		require.NoError(t, err)
		write(cn+".crt", certPEM)
		write(cn+".key", keyPEM)
	}
	o.TLSCertFile, o.TLSKeyFile = filepath.Join(dir, "audit.crt"), filepath.Join(dir, "audit.key")
	o.AdmissionTLSCertFile, o.AdmissionTLSKeyFile = filepath.Join(dir, "admission.crt"), filepath.Join(dir, "admission.key")
	o.AuditTokenFile = write("tokens", []byte("audit-token\n"))
	o.AdmissionListenAddress, o.AdmissionClientCAFile = "", ""
	o.AuditListenAddress, o.OpsListenAddress, o.MetricsListenAddress = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.RedisAddr = "127.0.0.1:1" // nothing answers
	o.Logger = slog.New(slog.DiscardHandler)
	a, err := New(o)
	require.NoError(t, err)
	go func() { _ = a.opsSrv.Serve(a.opsLn) }()
	go func() { _ = a.metricsSrv.ServeTLS(a.metricsLn, "", "") }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.opsSrv.Shutdown(ctx)
		_ = a.metricsSrv.Shutdown(ctx)
		_ = a.life.stop(ctx)
	})
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(ca.CertPEM))
	return testListeners{app: a, pool: pool}
}

func (l testListeners) client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: l.pool}}}
}

func (l testListeners) metricsURL() string {
	return "https://" + l.app.MetricsAddr().String() + "/metrics"
}

func get(t *testing.T, c *http.Client, url, token string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// plainHTTPGetsNoPage asks a TLS listener in plain HTTP: Go's TLS server answers 400 and
// closes the connection, or resets it when the request was not read yet.
func plainHTTPGetsNoPage(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.NotContains(t, string(body), "kubescribe_")
}

// The listeners as New binds them: /metrics is served only over TLS, with the admission
// certificate, to a caller the Kubernetes API authenticates and allows; the ops listener
// serves the probes to anyone and /metrics to no one.
func TestMetricsListener(t *testing.T) {
	f, cfg := newFakeReviewer(t)
	o := validOptions()
	o.RestConfig = cfg
	l := startListeners(t, o)
	c := l.client()

	resp, _ := get(t, c, l.metricsURL(), "")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, "admission", resp.TLS.PeerCertificates[0].Subject.CommonName, "the admission listener's certificate")
	require.GreaterOrEqual(t, resp.TLS.Version, uint16(tls.VersionTLS12))
	resp, _ = get(t, c, l.metricsURL(), "stranger-token")
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp, body := get(t, c, l.metricsURL(), "reader-token")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `kubescribe_metrics_refused_total{reason="forbidden"} 1`)
	require.Positive(t, f.tokenReviews.Load())

	// Plain HTTP to the metrics port: no page.
	plainHTTPGetsNoPage(t, "http://"+l.app.MetricsAddr().String()+"/metrics")

	// The ops listener: probes without credentials, no metrics.
	ops := "http://" + l.app.OpsAddr().String()
	resp, body = get(t, http.DefaultClient, ops+"/healthz", "")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = get(t, http.DefaultClient, ops+"/metrics", "reader-token")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.NotContains(t, body, "kubescribe_")
	resp, body = get(t, http.DefaultClient, ops+"/readyz", "")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "not running (starting or shutting down)\n", body)

	// Not ready because Redis does not answer: the body says so, without Redis' address.
	l.app.ready.Store(true)
	defer l.app.ready.Store(false)
	resp, body = get(t, http.DefaultClient, ops+"/readyz", "")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "redis: not answering\n", body)
}

// --metrics-insecure-allow-unauthenticated serves the page to anyone, still over TLS only;
// an empty address disables the listener.
func TestMetricsListenerOptOut(t *testing.T) {
	f, cfg := newFakeReviewer(t)
	o := validOptions()
	o.RestConfig = cfg
	o.MetricsInsecureAllowUnauthenticated = true
	l := startListeners(t, o)
	resp, body := get(t, l.client(), l.metricsURL(), "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "kubescribe_")
	require.NotContains(t, body, "kubescribe_metrics_refused_total", "nothing is refused, so nothing is counted")
	require.Zero(t, f.tokenReviews.Load()+f.accessReviews.Load())
	plainHTTPGetsNoPage(t, strings.Replace(l.metricsURL(), "https://", "http://", 1))

	o = validOptions()
	o.RestConfig = cfg
	o.MetricsListenAddress = ""
	o.Logger = slog.New(slog.DiscardHandler)
	o.RedisAddr = "127.0.0.1:1"
	o.AdmissionListenAddress, o.AdmissionClientCAFile = "", ""
	o.AuditListenAddress, o.OpsListenAddress = "127.0.0.1:0", "127.0.0.1:0"
	o.TLSCertFile, o.TLSKeyFile, o.AuditTokenFile = l.app.opts.TLSCertFile, l.app.opts.TLSKeyFile, l.app.opts.AuditTokenFile
	a, err := New(o)
	require.NoError(t, err)
	defer func() { _ = a.life.stop(context.Background()) }()
	require.Nil(t, a.MetricsAddr())
	require.Nil(t, a.metricsSrv)
}

// serveMetricsFrom is serveMetrics from the remote address remote.
func serveMetricsFrom(h http.Handler, remote, authorization string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	r.RemoteAddr = remote
	r.Header.Set("Authorization", authorization)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// The attack of issue 36 finding 9: one source floods the metrics listener with more random
// bearer tokens than the token cache holds, while Prometheus keeps scraping from another. The
// flood costs the apiserver at most its source's burst of TokenReviews (then one a second, on
// the test's clock), is answered 429, does not evict the scraper's accepted token (its scrapes
// cost no review), and when that answer expires the scraper's own review still goes through.
// A refused token replayed is answered from the cache of refusals. Nothing logs a token.
func TestMetricsAuthSurvivesATokenFlood(t *testing.T) {
	f, cfg := newFakeReviewer(t)
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	cfg.QPS = -1 // no client-side rate limit: the test makes thousands of reviews
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	auth := newMetricsAuthWithClock(kube, slog.New(slog.NewTextHandler(&logs, nil)), reg, clk)
	h := metricsHandler(reg, auth)
	const scraper, attacker = "10.1.2.3:41000", "192.0.2.66:50000"

	require.Equal(t, http.StatusOK, serveMetricsFrom(h, scraper, "Bearer reader-token").Code)
	require.Equal(t, int32(1), f.tokenReviews.Load())

	flood := func(n int) (reviews int32) {
		before := f.tokenReviews.Load()
		for i := range n {
			w := serveMetricsFrom(h, attacker, fmt.Sprintf("Bearer random-%d-%d", clk.Now().Unix(), i))
			require.Contains(t, []int{http.StatusUnauthorized, http.StatusTooManyRequests}, w.Code)
			require.NotContains(t, w.Body.String(), "kubescribe_")
			// The scraper is served throughout, from the cache.
			if i%500 == 0 {
				reviews := f.tokenReviews.Load()
				require.Equal(t, http.StatusOK, serveMetricsFrom(h, scraper, "Bearer reader-token").Code)
				require.Equal(t, reviews, f.tokenReviews.Load(), "the scraper's accepted token was evicted")
			}
		}
		return f.tokenReviews.Load() - before
	}
	require.Equal(t, int32(metricsSourceReviewBurst), flood(2*metricsTokenCacheSize), "the flood's TokenReviews are bounded by its burst")
	require.Equal(t, float64(2*metricsTokenCacheSize-int(metricsSourceReviewBurst)), testutil.ToFloat64(auth.refused.WithLabelValues(metricsRefusedThrottled)))
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte("metrics requests throttled")), "throttling is logged at most every 10s")
	throttled := serveMetricsFrom(h, attacker, "Bearer one-more")
	require.Equal(t, http.StatusTooManyRequests, throttled.Code)
	require.Equal(t, "1", throttled.Header().Get("Retry-After"))

	// 31s later the scraper's answer has expired: its review is made (its source has its own
	// bucket), while the flood goes on and gets only the reviews its bucket refilled.
	clk.Step(metricsTokenCacheTTL + time.Second)
	before := f.tokenReviews.Load()
	require.Equal(t, http.StatusOK, serveMetricsFrom(h, scraper, "Bearer reader-token").Code)
	require.Equal(t, before+1, f.tokenReviews.Load())
	require.Equal(t, int32(metricsSourceReviewBurst), flood(1000), "a full bucket again after 31s, no more")

	// Refused tokens from more sources than the token cache holds, one each (so each is
	// reviewed): they fill the cache of refusals, never the accepted tokens'.
	clk.Step(time.Second)
	for i := range 2 * metricsTokenCacheSize {
		remote := fmt.Sprintf("10.200.%d.%d:1", i/256, i%256)
		require.Equal(t, http.StatusUnauthorized, serveMetricsFrom(h, remote, fmt.Sprintf("Bearer %s%d", plainRefusalPrefix, i)).Code)
	}
	before = f.tokenReviews.Load()
	require.Equal(t, http.StatusOK, serveMetricsFrom(h, scraper, "Bearer reader-token").Code)
	require.Equal(t, before, f.tokenReviews.Load(), "refusals evicted the scraper's accepted token")

	// A refused token replayed, from a fresh source, costs one review until its refusal expires.
	const replayer = "198.51.100.7:1234"
	before = f.tokenReviews.Load()
	for range 50 {
		require.Equal(t, http.StatusUnauthorized, serveMetricsFrom(h, replayer, "Bearer garbage-token").Code)
	}
	require.Equal(t, before+1, f.tokenReviews.Load())
	clk.Step(metricsTokenDenyCacheTTL + time.Second)
	require.Equal(t, http.StatusUnauthorized, serveMetricsFrom(h, replayer, "Bearer garbage-token").Code)
	require.Equal(t, before+2, f.tokenReviews.Load())

	require.NotContains(t, logs.String(), "random-")
	require.NotContains(t, logs.String(), "garbage-token")
	require.NotContains(t, logs.String(), "reader-token")
}

// A flood from many sources keeps the map of sources bounded; IPv6 sources are counted by /64.
func TestMetricsAuthSources(t *testing.T) {
	for remote, want := range map[string]string{
		"10.0.0.1:443":                    "10.0.0.1",
		"[::ffff:10.0.0.1]:443":           "10.0.0.1",
		"[2001:db8:1:2:aaaa::1]:443":      "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::9]:1":        "2001:db8:1:2::/64",
		"[fe80::1%eth0]:1":                "fe80::/64",
		"not an address":                  "not an address",
		"[2001:db8:1:3:aaaa::1]:443":      "2001:db8:1:3::/64",
		"[2001:db8:1:2:aaaa::1%zone]:443": "2001:db8:1:2::/64",
	} {
		require.Equal(t, want, sourceKey(remote), remote)
	}

	_, cfg := newFakeReviewer(t)
	reg := prometheus.NewRegistry()
	auth := newTestMetricsAuth(t, cfg, io.Discard, reg)
	for i := range metricsSourceCacheSize + 100 {
		auth.bucketOf(fmt.Sprintf("10.%d.%d.1", i/256, i%256))
	}
	require.Len(t, auth.sources.Keys(), metricsSourceCacheSize)

	b := &reviewBucket{tokens: 1, last: time.Unix(100, 0)}
	require.True(t, b.take(time.Unix(100, 0)))
	require.False(t, b.take(time.Unix(100, 0)))
	require.False(t, b.take(time.Unix(99, 0)), "a clock going back refills nothing")
	require.True(t, b.take(time.Unix(101, 0)))
}
