package audit

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// fakeStore records stored batches; err makes StoreFacts fail.
type fakeStore struct {
	mu      sync.Mutex
	err     error
	batches [][]Fact
}

func (s *fakeStore) StoreFacts(_ context.Context, facts []Fact) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	// The handler reuses the facts' memory after StoreFacts returns: keep a deep copy.
	c := make([]Fact, len(facts))
	for i, f := range facts {
		c[i] = cloneFact(f)
	}
	s.batches = append(s.batches, c)
	return nil
}

// cloneFact copies f and everything it points to.
func cloneFact(f Fact) Fact {
	c := f
	for _, p := range []*string{&c.Route, &c.Group, &c.Resource, &c.Subresource, &c.Namespace, &c.Name, &c.UID,
		&c.ResourceVersion, &c.Verb, &c.AuditID, &c.LabelSelector, &c.User.Username, &c.User.UID} {
		*p = strings.Clone(*p)
	}
	if f.User.Groups != nil {
		c.User.Groups = make([]string, len(f.User.Groups))
		for i, g := range f.User.Groups {
			c.User.Groups[i] = strings.Clone(g)
		}
	}
	if f.User.Extra != nil {
		c.User.Extra = make(map[string][]string, len(f.User.Extra))
		for k, vs := range f.User.Extra {
			var cv []string
			if vs != nil {
				cv = make([]string, len(vs))
				for i, v := range vs {
					cv[i] = strings.Clone(v)
				}
			}
			c.User.Extra[strings.Clone(k)] = cv
		}
	}
	if f.DeletedUIDs != nil {
		c.DeletedUIDs = make([]string, len(f.DeletedUIDs))
		for i, u := range f.DeletedUIDs {
			c.DeletedUIDs[i] = strings.Clone(u)
		}
	}
	return c
}

func (s *fakeStore) stored() [][]Fact {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batches
}

const (
	goodToken  = "kubescribe-good-token-7f3a9c"
	wrongToken = "kubescribe-wrong-token-0b1d2e"
)

type testHandler struct {
	http.Handler
	store   *fakeStore
	metrics *Metrics
	logs    *bytes.Buffer
}

func newTestHandler(t *testing.T, mutate func(*HandlerOptions)) *testHandler {
	t.Helper()
	th := &testHandler{store: &fakeStore{}, metrics: NewMetrics(prometheus.NewRegistry()), logs: &bytes.Buffer{}}
	opts := HandlerOptions{
		Store: th.store,
		Authenticator: Authenticator{LocalRoute: "local", Tokens: []Token{
			{Value: []byte("another-token"), Routes: []string{"tenant-a"}, Line: 1},
			{Value: []byte(goodToken), Routes: []string{"local", "prod-eu-1", strings.Repeat("a", 63)}, Line: 2},
		}},
		Logger:  slog.New(slog.NewJSONHandler(th.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: th.metrics,
	}
	if mutate != nil {
		mutate(&opts)
	}
	h, err := NewHandler(opts)
	require.NoError(t, err)
	th.Handler = h
	return th
}

func fixture(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestHandler(t *testing.T) {
	good := fixture(t, "testdata/update.json") // one event, kept
	tests := []struct {
		name        string
		method      string
		path        string
		auth        string
		body        []byte
		unknownLen  bool
		mutate      func(*HandlerOptions)
		storeErr    error
		wantCode    int
		wantBody    string
		wantStored  int // batches
		wantHeaders map[string]string
	}{
		{name: "no credentials", method: http.MethodPost, path: "/audit/local", body: good, wantCode: 401,
			wantHeaders: map[string]string{"WWW-Authenticate": "Bearer"}},
		{name: "wrong token", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + wrongToken, body: good, wantCode: 401},
		{name: "token prefix is not the token", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken[:10], body: good, wantCode: 401},
		{name: "basic scheme", method: http.MethodPost, path: "/audit/local", auth: "Basic " + goodToken, body: good, wantCode: 401},
		{name: "empty bearer", method: http.MethodPost, path: "/audit/local", auth: "Bearer ", body: good, wantCode: 401},
		{name: "no tokens configured", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken, body: good,
			mutate: func(o *HandlerOptions) { o.Authenticator = Authenticator{} }, wantCode: 401},
		{name: "unauthenticated on an unknown path", method: http.MethodGet, path: "/metrics", wantCode: 401},
		{name: "good token", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken, body: good, wantCode: 200, wantStored: 1},
		{name: "scheme is case-insensitive", method: http.MethodPost, path: "/audit/local", auth: "bearer " + goodToken, body: good, wantCode: 200, wantStored: 1},
		{name: "nothing to keep is acknowledged without a store call", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken,
			body: fixture(t, "testdata/forbidden.json"), storeErr: errors.New("down"), wantCode: 200},
		{name: "over the limit", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken, body: good,
			mutate: func(o *HandlerOptions) { o.MaxBodyBytes = int64(len(good)) - 1 }, wantCode: 413},
		{name: "over the limit, length unknown", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken, body: good, unknownLen: true,
			mutate: func(o *HandlerOptions) { o.MaxBodyBytes = int64(len(good)) - 1 }, wantCode: 413},
		{name: "exactly the limit", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken, body: good, unknownLen: true,
			mutate: func(o *HandlerOptions) { o.MaxBodyBytes = int64(len(good)) }, wantCode: 200, wantStored: 1},
		{name: "malformed JSON", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken, body: good[:len(good)/2],
			wantCode: 400, wantBody: "invalid JSON"},
		{name: "wrong kind", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken,
			body: []byte(`{"kind":"Policy","apiVersion":"audit.k8s.io/v1"}`), wantCode: 400, wantBody: `kind "Policy"`},
		{name: "store fails", method: http.MethodPost, path: "/audit/local", auth: "Bearer " + goodToken, body: good,
			storeErr: errors.New("redis: connection refused"), wantCode: 503},
		{name: "wrong method", method: http.MethodGet, path: "/audit/local", auth: "Bearer " + goodToken, wantCode: 405},
		{name: "PUT", method: http.MethodPut, path: "/audit/local", auth: "Bearer " + goodToken, body: good, wantCode: 405},
		{name: "upper-case route", method: http.MethodPost, path: "/audit/Local", auth: "Bearer " + goodToken, body: good, wantCode: 404},
		{name: "route ends with a dash", method: http.MethodPost, path: "/audit/local-", auth: "Bearer " + goodToken, body: good, wantCode: 404},
		{name: "route too long", method: http.MethodPost, path: "/audit/" + strings.Repeat("a", 64), auth: "Bearer " + goodToken, body: good, wantCode: 404},
		{name: "longest route", method: http.MethodPost, path: "/audit/" + strings.Repeat("a", 63), auth: "Bearer " + goodToken, body: good, wantCode: 200, wantStored: 1},
		{name: "nested route", method: http.MethodPost, path: "/audit/a/b", auth: "Bearer " + goodToken, body: good, wantCode: 404},
		{name: "no route", method: http.MethodPost, path: "/audit/", auth: "Bearer " + goodToken, body: good, wantCode: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newTestHandler(t, tt.mutate)
			h.store.err = tt.storeErr
			req := httptest.NewRequest(tt.method, tt.path, bytes.NewReader(tt.body))
			if tt.unknownLen {
				req.ContentLength = -1
			}
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, tt.wantCode, rec.Code, rec.Body.String())
			require.Contains(t, rec.Body.String(), tt.wantBody)
			for k, v := range tt.wantHeaders {
				require.True(t, strings.HasPrefix(rec.Header().Get(k), v), "%s: %q", k, rec.Header().Get(k))
			}
			require.Len(t, h.store.stored(), tt.wantStored)
			require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.requests.WithLabelValues(strconv.Itoa(tt.wantCode))))
			// Events are counted only for acknowledged batches.
			wantKept := 0.0
			if tt.wantStored > 0 {
				wantKept = 1
			}
			require.Equal(t, wantKept, testutil.ToFloat64(h.metrics.events.WithLabelValues(ResultKept)))
		})
	}
}

func TestHandlerStoresFacts(t *testing.T) {
	h := newTestHandler(t, nil)
	body := fixture(t, "testdata/delete-finalizer.json")
	want, _, err := Decode(bytes.NewReader(body), "prod-eu-1")
	require.NoError(t, err)
	require.Len(t, want, 3)

	req := httptest.NewRequest(http.MethodPost, "/audit/prod-eu-1", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+goodToken)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, [][]Fact{want}, h.store.stored())
	require.Equal(t, 3.0, testutil.ToFloat64(h.metrics.events.WithLabelValues(ResultKept)))
	require.Equal(t, 1, testutil.CollectAndCount(h.metrics.batchBytes))
	require.Equal(t, 1, testutil.CollectAndCount(h.metrics.handler), "one route observed")
	require.Equal(t, []string{"route=prod-eu-1"}, gatherLabels(t, h.metrics.handler))

	// The next batches reuse the body buffer and the decoder's memory: what was stored before
	// must not change, and a larger body of unknown length is read whole.
	other := fixture(t, "testdata/scale.json")
	for _, b := range [][]byte{other, body, append(append([]byte{}, other...), bytes.Repeat([]byte(" "), 3*minBodyBuffer)...)} {
		req := httptest.NewRequest(http.MethodPost, "/audit/prod-eu-1", bytes.NewReader(b))
		req.ContentLength = -1
		req.Header.Set("Authorization", "Bearer "+goodToken)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	}
	stored := h.store.stored()
	require.Len(t, stored, 4)
	require.Equal(t, want, stored[0])
	require.Equal(t, want, stored[2])
	require.Equal(t, stored[1], stored[3])
	require.Len(t, stored[1], 3)
}

// gatherLabels lists the label pairs of every series of c, as "name=value".
func gatherLabels(t *testing.T, c prometheus.Collector) []string {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				out = append(out, l.GetName()+"="+l.GetValue())
			}
		}
	}
	return out
}

func TestHandlerDropMetrics(t *testing.T) {
	h := newTestHandler(t, nil)
	req := httptest.NewRequest(http.MethodPost, "/audit/local", bytes.NewReader(fixture(t, "testdata/handmade/noise.json")))
	req.Header.Set("Authorization", "Bearer "+goodToken)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, 2.0, testutil.ToFloat64(h.metrics.events.WithLabelValues(ResultKept)))
	require.Equal(t, 2.0, testutil.ToFloat64(h.metrics.events.WithLabelValues(string(DropVerb))))
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.events.WithLabelValues(string(DropStage))))
}

func TestNewMetricsPreinitialises(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	n, err := testutil.GatherAndCount(reg, "kubescribe_audit_requests_total", "kubescribe_audit_events_total")
	require.NoError(t, err)
	require.Equal(t, len(responseCodes)+1+len(DropReasons), n)
}

func TestNewHandlerOptions(t *testing.T) {
	_, err := NewHandler(HandlerOptions{})
	require.ErrorContains(t, err, "audit: HandlerOptions.Store is required")
	_, err = NewHandler(HandlerOptions{Store: &fakeStore{}, MaxBodyBytes: -1})
	require.ErrorContains(t, err, "MaxBodyBytes")
	h, err := NewHandler(HandlerOptions{Store: &fakeStore{}}) // nil logger and metrics are fine
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/audit/x", strings.NewReader("{}")))
	require.Equal(t, http.StatusUnauthorized, rec.Code)
}

func TestHandlerClientCert(t *testing.T) {
	h := newTestHandler(t, func(o *HandlerOptions) { o.Authenticator = Authenticator{LocalRoute: "local"} })
	body := fixture(t, "testdata/update.json")

	req := httptest.NewRequest(http.MethodPost, "/audit/local", bytes.NewReader(body))
	req.TLS = &tls.ConnectionState{} // TLS, but no verified client certificate
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code)

	req = httptest.NewRequest(http.MethodPost, "/audit/local", bytes.NewReader(body))
	req.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{}}}}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Len(t, h.store.stored(), 1)
}

// TestTokensNeverLogged drives every path that logs and checks no token reaches the log.
func TestTokensNeverLogged(t *testing.T) {
	h := newTestHandler(t, nil)
	body := fixture(t, "testdata/update.json")
	send := func(auth string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/audit/local", bytes.NewReader(body))
		req.Header.Set("Authorization", auth)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	send("Bearer "+wrongToken, body)
	send("Bearer "+goodToken, body)
	send("Bearer "+goodToken, []byte("{not json"))
	h.store.err = errors.New("store down")
	send("Bearer "+goodToken, body)

	logs := h.logs.String()
	require.Contains(t, logs, "unauthenticated audit request")
	require.Contains(t, logs, "storing audit facts failed")
	require.Contains(t, logs, "undecodable audit batch")
	require.NotContains(t, logs, goodToken)
	require.NotContains(t, logs, wrongToken)
}

func TestHandlerRealTLS(t *testing.T) {
	ca := newTestCA(t)
	other := newTestCA(t)
	h := newTestHandler(t, func(o *HandlerOptions) {
		o.Authenticator = Authenticator{LocalRoute: "local", Tokens: []Token{{Value: []byte(goodToken), Routes: []string{"local"}}}}
	})

	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.TLS = &tls.Config{
		ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs:  ca.pool,
		MinVersion: tls.VersionTLS12,
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	body := fixture(t, "testdata/update.json")

	post := func(t *testing.T, cert *tls.Certificate, token string) (int, error) {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		if cert != nil {
			tr.TLSClientConfig.Certificates = []tls.Certificate{*cert}
		}
		t.Cleanup(tr.CloseIdleConnections)
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/audit/local", bytes.NewReader(body))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	t.Run("client certificate", func(t *testing.T) {
		cert := ca.clientCert(t, "kube-apiserver")
		code, err := post(t, &cert, "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
	})
	t.Run("no certificate, no token", func(t *testing.T) {
		code, err := post(t, nil, "")
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, code)
	})
	t.Run("no certificate, token", func(t *testing.T) {
		code, err := post(t, nil, goodToken)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
	})
	t.Run("certificate from another CA is refused in the handshake", func(t *testing.T) {
		cert := other.clientCert(t, "intruder")
		_, err := post(t, &cert, "")
		require.Error(t, err)
	})
}

// TestHandlerMalformedEvent: one event the decoder cannot read costs that event, not the batch.
func TestHandlerMalformedEvent(t *testing.T) {
	h := newTestHandler(t, nil)
	good := fixtureEvents(t, "update.json", nil)[0]
	poisoned := crEvent("poisoned-1", "patch", "w1", `{"Metadata":"SECRET-CONTENT"}`,
		`{"apiVersion":"example.com/v1","kind":"Widget","metadata":"SECRET-CONTENT","Metadata":"SECRET-CONTENT"}`)
	req := httptest.NewRequest(http.MethodPost, "/audit/local", bytes.NewReader(eventList(poisoned, good)))
	req.Header.Set("Authorization", "Bearer "+goodToken)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, [][]Fact{{onlyFact(t, "update.json")}}, h.store.stored())
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.events.WithLabelValues(ResultKept)))
	require.Equal(t, 1.0, testutil.ToFloat64(h.metrics.events.WithLabelValues(string(DropMalformed))))
	logs := h.logs.String()
	require.Contains(t, logs, "dropped malformed audit events")
	require.Contains(t, logs, "items[0] poisoned-1")
	require.NotContains(t, logs, "SECRET-CONTENT", "an event's content is never logged")
}

func TestMalformedSummary(t *testing.T) {
	evs := make([]MalformedEvent, 12)
	for i := range evs {
		evs[i] = MalformedEvent{Index: i}
	}
	evs[1].AuditID = "a1"
	got := malformedSummary(evs, maxLoggedMalformed)
	require.Len(t, got, maxLoggedMalformed)
	require.Equal(t, []string{"items[0]", "items[1] a1"}, got[:2])
	require.Empty(t, malformedSummary(nil, maxLoggedMalformed))
}

// The body buffers and decoders kept for a stream of batches are dropped once no batch came for
// keepIdle, and kept while batches come.
func TestKeptBuffersDroppedWhenIdle(t *testing.T) {
	defer func(d time.Duration) { keepIdle = d }(keepIdle)
	keepIdle = 200 * time.Millisecond
	dropKept()

	putDecoder(getDecoder())
	putBody(getBody(1 << 20))
	require.Len(t, bodies, 1)
	require.Len(t, decoders, 1)
	require.Eventually(t, func() bool { return len(bodies) == 0 && len(decoders) == 0 },
		5*time.Second, 10*time.Millisecond, "dropped after keepIdle")

	// A batch that comes while they are kept takes one and postpones the drop.
	putBody(getBody(64))
	b := getBody(64)
	require.Empty(t, bodies, "the kept buffer was taken")
	putBody(b)
	require.Len(t, bodies, 1)
}

// A credential may post only for the routes it is bound to: anything else is 403, before the
// body is read, logged without the credential and counted.
func TestHandlerRouteBinding(t *testing.T) {
	body := fixture(t, "testdata/update.json")
	cert := func(cn string) *tls.ConnectionState {
		return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn}}}}}
	}
	tests := []struct {
		name     string
		path     string
		auth     string
		tls      *tls.ConnectionState
		wantCode int
	}{
		{name: "tenant token for the local route", path: "/audit/local", auth: "Bearer another-token", wantCode: 403},
		{name: "tenant token for its own route", path: "/audit/tenant-a", auth: "Bearer another-token", wantCode: 200},
		{name: "local token for a tenant route", path: "/audit/tenant-a", auth: "Bearer " + goodToken, wantCode: 403},
		{name: "unmapped certificate for a tenant route", path: "/audit/tenant-a", tls: cert("kube-apiserver"), wantCode: 403},
		{name: "unmapped certificate for the local route", path: "/audit/local", tls: cert("kube-apiserver"), wantCode: 200},
		{name: "mapped certificate for its route", path: "/audit/tenant-b", tls: cert("tenant-b-apiserver"), wantCode: 200},
		{name: "mapped certificate for the local route", path: "/audit/local", tls: cert("tenant-b-apiserver"), wantCode: 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newTestHandler(t, func(o *HandlerOptions) {
				o.Authenticator.CertRoutes = map[string][]string{"tenant-b-apiserver": {"tenant-b"}}
			})
			body := &countingReader{r: bytes.NewReader(body)}
			req := httptest.NewRequest(http.MethodPost, tt.path, body)
			req.TLS = tt.tls
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, tt.wantCode, rec.Code, rec.Body.String())
			if tt.wantCode == http.StatusForbidden {
				require.Zero(t, body.n, "a refused request's body is not read")
				require.Empty(t, h.store.stored())
				require.Contains(t, rec.Body.String(), "may not post audit events for route")
				require.Equal(t, float64(1), testutil.ToFloat64(h.metrics.refused.WithLabelValues(refusedRouteNotBound)))
				require.Contains(t, h.logs.String(), "audit credential not bound to the route")
				require.NotContains(t, h.logs.String(), "another-token")
				require.NotContains(t, h.logs.String(), goodToken)
				return
			}
			require.Len(t, h.store.stored(), 1)
			require.Equal(t, strings.TrimPrefix(tt.path, "/audit/"), h.store.stored()[0][0].Route)
		})
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
