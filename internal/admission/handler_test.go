package admission

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/declared"
)

// fakeStore records candidates; err, when set, fails every batch.
type fakeStore struct {
	mu     sync.Mutex
	got    []Candidate
	err    error
	stored chan struct{}
}

func newFakeStore() *fakeStore { return &fakeStore{stored: make(chan struct{}, 100)} }

func (f *fakeStore) StoreCandidates(_ context.Context, cs []Candidate) error {
	f.mu.Lock()
	defer func() { f.mu.Unlock(); f.stored <- struct{}{} }()
	if f.err != nil {
		return f.err
	}
	f.got = append(f.got, cs...)
	return nil
}

func (f *fakeStore) candidates() []Candidate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

const configMap = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"app","namespace":"team","uid":"u-1","resourceVersion":"%s","managedFields":[{"manager":"kubectl"}]},"data":{"k":"%s"}}`

func review(op, sub, object, old string, dryRun bool) string {
	req := map[string]any{
		"uid": "req-1", "operation": op, "namespace": "team", "name": "app", "subResource": sub,
		"kind":     map[string]any{"group": "", "version": "v1", "kind": "ConfigMap"},
		"resource": map[string]any{"group": "", "version": "v1", "resource": "configmaps"},
		"userInfo": map[string]any{"username": "alice", "groups": []string{"devs"}, "extra": map[string][]string{"scopes": {"x"}}},
		"dryRun":   dryRun,
	}
	if object != "" {
		req["object"] = json.RawMessage(object)
	}
	if old != "" {
		req["oldObject"] = json.RawMessage(old)
	}
	b, _ := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
	return string(b)
}

type fixture struct {
	h       *Handler
	store   *fakeStore
	metrics *Metrics
	srv     *httptest.Server
}

func newFixture(t *testing.T, mutate func(*HandlerOptions), run bool) *fixture {
	t.Helper()
	f := &fixture{store: newFakeStore(), metrics: NewMetrics(prometheus.NewRegistry())}
	opts := HandlerOptions{Store: f.store, Render: declared.Manifest, Metrics: f.metrics, Auth: anonymousLocal}
	if mutate != nil {
		mutate(&opts)
	}
	h, err := NewHandler(opts)
	require.NoError(t, err)
	f.h = h
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); h.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) post(t *testing.T, route, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(f.srv.URL+PathPrefix+route, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func (f *fixture) result(r string) float64 {
	return testutil.ToFloat64(f.metrics.reviews.WithLabelValues(r))
}

// allowed posts body to route local and requires an allowed answer to it.
func (f *fixture) allowed(t *testing.T, review string) {
	t.Helper()
	code, body := f.post(t, "local", review)
	require.Equal(t, http.StatusOK, code, body)
	var ar admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal([]byte(body), &ar))
	require.NotNil(t, ar.Response)
	require.True(t, ar.Response.Allowed)
	require.Equal(t, "req-1", string(ar.Response.UID))
	require.Equal(t, "admission.k8s.io/v1", ar.APIVersion)
}

func digestOf(t *testing.T, raw string) string {
	t.Helper()
	u := &unstructured.Unstructured{}
	require.NoError(t, u.UnmarshalJSON([]byte(raw)))
	m, err := declared.Manifest(u)
	require.NoError(t, err)
	return Digest(m)
}

func TestCandidatesOfEachOperation(t *testing.T) {
	f := newFixture(t, nil, true)
	create := fmt.Sprintf(configMap, "", "v1")
	oldObj, newObj := fmt.Sprintf(configMap, "7", "v1"), fmt.Sprintf(configMap, "7", "v2")
	scale := `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"app","namespace":"team","uid":"u-1","resourceVersion":"9"},"spec":{"replicas":3}}`
	zero := `{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"app","namespace":"team","uid":"u-1","resourceVersion":"9"},"spec":{}}`
	for _, body := range []string{
		review("CREATE", "", create, "", false),
		review("UPDATE", "", newObj, oldObj, false),
		review("DELETE", "", "", oldObj, false),
		review("UPDATE", "scale", scale, scale, false),
		review("UPDATE", "scale", zero, zero, false),
	} {
		f.allowed(t, body)
	}
	require.Eventually(t, func() bool { return len(f.store.candidates()) == 5 }, 5*time.Second, 10*time.Millisecond)
	got := f.store.candidates()
	for i := range got {
		require.Equal(t, "alice", got[i].User.Username)
		require.Equal(t, []string{"devs"}, got[i].User.Groups)
		require.Equal(t, map[string][]string{"scopes": {"x"}}, got[i].User.Extra)
		require.Equal(t, "u-1", got[i].UID)
		require.Equal(t, "local", got[i].Route)
		got[i].User, got[i].Received, got[i].RequestUID = audit.Identity{}, time.Time{}, ""
	}
	three, none := int64(3), int64(0)
	require.Equal(t, Candidate{Route: "local", Resource: "configmaps", Namespace: "team", Name: "app", UID: "u-1", Operation: OpCreate, Digest: digestOf(t, create)}, got[0])
	require.Equal(t, Candidate{Route: "local", Resource: "configmaps", Namespace: "team", Name: "app", UID: "u-1", Operation: OpUpdate, BaseResourceVersion: "7", Digest: digestOf(t, newObj)}, got[1])
	require.Equal(t, Candidate{Route: "local", Resource: "configmaps", Namespace: "team", Name: "app", UID: "u-1", Operation: OpDelete, BaseResourceVersion: "7"}, got[2])
	require.Equal(t, Candidate{Route: "local", Resource: "configmaps", Subresource: "scale", Namespace: "team", Name: "app", UID: "u-1", Operation: OpUpdate, BaseResourceVersion: "9", Replicas: &three}, got[3])
	require.Equal(t, &none, got[4].Replicas)
	// The digest ignores what the declared form drops: resourceVersion and managedFields.
	require.Equal(t, digestOf(t, fmt.Sprintf(configMap, "", "v2")), got[1].Digest)
	require.Equal(t, float64(5), f.result(resultRecorded))
}

// A dry run, an operation or subresource a candidate cannot describe, and an object that
// cannot be read are all allowed, and none is recorded.
func TestDryRunAndOtherReviewsAreAllowedAndNotRecorded(t *testing.T) {
	f := newFixture(t, nil, true)
	f.allowed(t, review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", true))
	f.allowed(t, review("CONNECT", "", "", "", false))
	f.allowed(t, review("UPDATE", "status", fmt.Sprintf(configMap, "7", "v1"), fmt.Sprintf(configMap, "7", "v1"), false))
	// Undecodable objects are allowed too, counted invalid, and record nothing.
	f.allowed(t, review("CREATE", "", `{"metadata":"nope"}`, "", false))
	f.allowed(t, review("UPDATE", "", fmt.Sprintf(configMap, "7", "v1"), `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"app"}}`, false))
	require.Eventually(t, func() bool { return f.result(resultInvalid) == 2 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, float64(1), f.result(resultDryRun))
	require.Equal(t, float64(2), f.result(resultIgnored))
	require.Empty(t, f.store.candidates())
}

// A Secret's create or update is allowed and records no candidate: a candidate keeps an
// unkeyed digest of what is written, which could be checked against guessed values. Its delete,
// which carries no content, is recorded.
func TestSecretWritesRecordNoDigest(t *testing.T) {
	f := newFixture(t, nil, true)
	secretReview := func(op, object, old string) string {
		r := review(op, "", object, old, false)
		r = strings.Replace(r, `"resource":"configmaps"`, `"resource":"secrets"`, 1)
		return strings.Replace(r, `"kind":"ConfigMap"`, `"kind":"Secret"`, 1)
	}
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"app","namespace":"team","uid":"u-1","resourceVersion":"7"},"data":{"password":"aHVudGVyMg=="}}`
	f.allowed(t, secretReview("CREATE", secret, ""))
	f.allowed(t, secretReview("UPDATE", secret, secret))
	f.allowed(t, secretReview("DELETE", "", secret))
	require.Eventually(t, func() bool { return len(f.store.candidates()) == 1 }, 5*time.Second, 10*time.Millisecond)
	got := f.store.candidates()[0]
	require.Equal(t, OpDelete, got.Operation)
	require.Equal(t, "secrets", got.Resource)
	require.Empty(t, got.Digest)
	require.Equal(t, float64(2), f.result(resultIgnored))
}

// With a digest key, a Secret's create and update are recorded with the keyed digest of what
// they write (the one the watch gives the change), never the plain SHA-256.
func TestSecretWritesRecordAKeyedDigest(t *testing.T) {
	keyed := func(plain []byte) [32]byte { return sha256.Sum256(append([]byte("key:"), plain...)) }
	f := newFixture(t, func(o *HandlerOptions) { o.SecretDigest = keyed }, true)
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"app","namespace":"team","uid":"u-1","resourceVersion":"7"},"data":{"password":"aHVudGVyMg=="}}`
	r := review("CREATE", "", secret, "", false)
	r = strings.Replace(r, `"resource":"configmaps"`, `"resource":"secrets"`, 1)
	f.allowed(t, strings.Replace(r, `"kind":"ConfigMap"`, `"kind":"Secret"`, 1))
	require.Eventually(t, func() bool { return len(f.store.candidates()) == 1 }, 5*time.Second, 10*time.Millisecond)
	u := &unstructured.Unstructured{}
	require.NoError(t, u.UnmarshalJSON([]byte(secret)))
	plain, err := declared.Manifest(u)
	require.NoError(t, err)
	got := f.store.candidates()[0]
	require.Equal(t, DigestOf(keyed(plain)), got.Digest)
	require.NotEqual(t, Digest(plain), got.Digest)
}

func TestBadRequestsGetClearErrors(t *testing.T) {
	f := newFixture(t, func(o *HandlerOptions) { o.MaxBodyBytes = 4096 }, true)
	for _, tc := range []struct {
		route, body string
		code        int
		want        string
	}{
		{"local", "", http.StatusBadRequest, "empty body"},
		{"local", "{not json", http.StatusBadRequest, "not JSON"},
		{"local", `{"apiVersion":"v1","kind":"Pod"}`, http.StatusBadRequest, "want apiVersion admission.k8s.io/v1"},
		{"local", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest, "no request"},
		{"local", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`, http.StatusBadRequest, "no uid"},
		{"local", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5}}`, http.StatusBadRequest, "wrong type"},
		{"Not_A_Route", review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false), http.StatusNotFound, "not a cluster name"},
		{"local", review("CREATE", "", `{"data":"`+strings.Repeat("x", 5000)+`"}`, "", false), http.StatusRequestEntityTooLarge, "exceeds 4096 bytes"},
	} {
		code, body := f.post(t, tc.route, tc.body)
		require.Equal(t, tc.code, code, "%q: %s", tc.body, body)
		require.Contains(t, body, tc.want)
	}
	require.Empty(t, f.store.candidates())
}

// Redis failing or the queue full: the write is still allowed, and the loss is counted.
func TestOverloadAndStoreFailureStillAllow(t *testing.T) {
	t.Run("store fails", func(t *testing.T) {
		f := newFixture(t, nil, true)
		f.store.err = errors.New("redis: connection refused")
		f.allowed(t, review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false))
		require.Eventually(t, func() bool { return f.result(resultDroppedStore) == 1 }, 5*time.Second, 10*time.Millisecond)
	})
	t.Run("queue full", func(t *testing.T) {
		f := newFixture(t, func(o *HandlerOptions) { o.QueueSize = 1 }, false) // nothing drains
		for range 3 {
			f.allowed(t, review("CREATE", "", fmt.Sprintf(configMap, "", "v1"), "", false))
		}
		require.Equal(t, float64(2), f.result(resultDroppedOverload))
		require.Equal(t, float64(1), testutil.ToFloat64(f.metrics.queue))
		// Once the writer runs, what was queued is recorded.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); f.h.Run(ctx) }()
		require.Eventually(t, func() bool { return len(f.store.candidates()) == 1 }, 5*time.Second, 10*time.Millisecond)
		cancel()
		<-done
	})
}

// BenchmarkHandler measures the webhook's answer path (decode, queue, answer) with a store
// that takes every batch at once: requests/s and the p99 of one request, as metrics.
func BenchmarkHandler(b *testing.B) {
	store := &nopStore{}
	h, err := NewHandler(HandlerOptions{Store: store, Render: declared.Manifest, QueueSize: 1 << 16, Auth: anonymousLocal})
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.Run(ctx)
	body := []byte(review("UPDATE", "", fmt.Sprintf(configMap, "7", "v2"), fmt.Sprintf(configMap, "7", "v1"), false))
	durations := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	began := time.Now()
	for range b.N {
		start := time.Now()
		r := httptest.NewRequest(http.MethodPost, PathPrefix+"local", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
		durations = append(durations, time.Since(start))
	}
	elapsed := time.Since(began)
	b.StopTimer()
	slices.Sort(durations)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(durations[len(durations)*99/100].Microseconds()), "p99-µs")
}

type nopStore struct{}

func (nopStore) StoreCandidates(context.Context, []Candidate) error { return nil }
