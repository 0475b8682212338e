package authz

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// fakeReviewer allows assert-author for the users in allowed, on the targets listed.
type fakeReviewer struct {
	mu      sync.Mutex
	allowed map[string]string // user -> target
	err     error
	got     []*authorizationv1.SubjectAccessReview
}

func (f *fakeReviewer) Create(_ context.Context, sar *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, sar.DeepCopy())
	if f.err != nil {
		return nil, f.err
	}
	ra := sar.Spec.ResourceAttributes
	out := sar.DeepCopy()
	out.Status.Allowed = f.allowed[sar.Spec.User] == ra.Name && ra.Verb == "assert-author"
	return out, nil
}

type fakeRecorder struct {
	mu       sync.Mutex
	verdicts []Verdict
	err      error
}

func (f *fakeRecorder) Record(_ context.Context, v Verdict) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.verdicts = append(f.verdicts, v)
	return nil
}

func commitRequest(target string, author *v1alpha1.Identity) *v1alpha1.CommitRequest {
	return &v1alpha1.CommitRequest{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "CommitRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: "why", Namespace: "shop", UID: types.UID("cr-uid")},
		Spec:       v1alpha1.CommitRequestSpec{TargetRef: v1alpha1.LocalObjectReference{Name: target}, Message: "why", Author: author},
	}
}

func reviewBody(t testing.TB, user string, obj runtime.Object, dryRun bool) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	require.NoError(t, err)
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "review-uid",
			Kind:      metav1.GroupVersionKind{Group: "kubescribe.dev", Version: "v1alpha1", Kind: "CommitRequest"},
			Resource:  metav1.GroupVersionResource{Group: "kubescribe.dev", Version: "v1alpha1", Resource: "commitrequests"},
			Namespace: "shop",
			Name:      "why",
			Operation: admissionv1.Create,
			UserInfo: authenticationv1.UserInfo{Username: user, UID: user + "-uid", Groups: []string{"devs", "system:authenticated"},
				Extra: map[string]authenticationv1.ExtraValue{"scopes": {"a"}}},
			Object: runtime.RawExtension{Raw: raw},
			DryRun: &dryRun,
		},
	}
	b, err := json.Marshal(ar)
	require.NoError(t, err)
	return b
}

func newTestHandler(t *testing.T, rev *fakeReviewer, rec *fakeRecorder) http.Handler {
	t.Helper()
	h, err := NewHandler(HandlerOptions{Reviewer: rev, Verdicts: rec, Auth: testAuth(), Route: "local"})
	require.NoError(t, err)
	return h
}

func post(t *testing.T, h http.Handler, body []byte) (*httptest.ResponseRecorder, *admissionv1.AdmissionResponse) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.TLS = verifiedCert("kube-apiserver")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec, nil
	}
	var ar admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ar))
	require.Equal(t, "admission.k8s.io/v1", ar.APIVersion)
	require.Equal(t, "AdmissionReview", ar.Kind)
	require.NotNil(t, ar.Response)
	require.Equal(t, types.UID("review-uid"), ar.Response.UID)
	return rec, ar.Response
}

var jane = &v1alpha1.Identity{Name: "Jane Doe", Email: "jane@example.com"}

func TestSubjectAccessReviewShape(t *testing.T) {
	sar := SubjectAccessReview(Submitter{Username: "alice", UID: "u1", Groups: []string{"g"}, Extra: map[string][]string{"k": {"v"}}}, "shop", "tenants")
	require.Equal(t, authorizationv1.SubjectAccessReviewSpec{
		User: "alice", UID: "u1", Groups: []string{"g"},
		Extra: map[string]authorizationv1.ExtraValue{"k": {"v"}},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: "shop", Verb: "assert-author", Group: "kubescribe.dev", Resource: "gittargets", Name: "tenants",
		},
	}, sar.Spec)
}

func TestReviewWithoutAuthorRecordsTheSubmitter(t *testing.T) {
	rev, rec := &fakeReviewer{}, &fakeRecorder{}
	_, resp := post(t, newTestHandler(t, rev, rec), reviewBody(t, "alice", commitRequest("tenants", nil), false))
	require.True(t, resp.Allowed)
	require.Empty(t, rev.got, "no SubjectAccessReview without spec.author")
	require.Equal(t, []Verdict{{
		UID: "cr-uid", Namespace: "shop", Name: "why", Target: "tenants",
		Submitter: Submitter{Username: "alice", UID: "alice-uid", Groups: []string{"devs", "system:authenticated"}, Extra: map[string][]string{"scopes": {"a"}}},
	}}, rec.verdicts)
}

func TestReviewAuthorizedAssertionIsRecorded(t *testing.T) {
	rev, rec := &fakeReviewer{allowed: map[string]string{"alice": "tenants"}}, &fakeRecorder{}
	_, resp := post(t, newTestHandler(t, rev, rec), reviewBody(t, "alice", commitRequest("tenants", jane), false))
	require.True(t, resp.Allowed)
	require.Len(t, rev.got, 1)
	require.Equal(t, "alice", rev.got[0].Spec.User)
	require.Len(t, rec.verdicts, 1)
	require.True(t, rec.verdicts[0].Authorized)
	require.Equal(t, &Author{Name: "Jane Doe", Email: "jane@example.com"}, rec.verdicts[0].Author)
}

func TestReviewUnauthorizedAssertionIsDeniedNamingTheRule(t *testing.T) {
	rev, rec := &fakeReviewer{allowed: map[string]string{"alice": "tenants"}}, &fakeRecorder{}
	h := newTestHandler(t, rev, rec)
	for _, tc := range []struct{ user, target string }{{"alice", "other"}, {"bob", "tenants"}} {
		_, resp := post(t, h, reviewBody(t, tc.user, commitRequest(tc.target, jane), false))
		require.False(t, resp.Allowed)
		require.Equal(t, int32(http.StatusForbidden), resp.Result.Code)
		require.Contains(t, resp.Result.Message, `resourceNames: ["`+tc.target+`"], verbs: ["assert-author"]`)
		require.Contains(t, resp.Result.Message, `namespace "shop"`)
	}
	require.Empty(t, rec.verdicts)
}

func TestReviewDryRunRecordsNothing(t *testing.T) {
	rev, rec := &fakeReviewer{allowed: map[string]string{"alice": "tenants"}}, &fakeRecorder{}
	h := newTestHandler(t, rev, rec)
	_, resp := post(t, h, reviewBody(t, "alice", commitRequest("tenants", jane), true))
	require.True(t, resp.Allowed)
	_, resp = post(t, h, reviewBody(t, "bob", commitRequest("tenants", jane), true))
	require.False(t, resp.Allowed, "a dry run still says whether the real create would be denied")
	require.Empty(t, rec.verdicts)
}

func TestReviewFailures(t *testing.T) {
	// The SubjectAccessReview fails: admitted, recorded as not authorized, with a warning.
	rev, rec := &fakeReviewer{err: errors.New("apiserver unavailable")}, &fakeRecorder{}
	_, resp := post(t, newTestHandler(t, rev, rec), reviewBody(t, "alice", commitRequest("tenants", jane), false))
	require.True(t, resp.Allowed)
	require.NotEmpty(t, resp.Warnings)
	require.Len(t, rec.verdicts, 1)
	require.False(t, rec.verdicts[0].Authorized)

	// The store fails: a request without an author is admitted with a warning...
	rev, rec = &fakeReviewer{allowed: map[string]string{"alice": "tenants"}}, &fakeRecorder{err: errors.New("redis down")}
	_, resp = post(t, newTestHandler(t, rev, rec), reviewBody(t, "alice", commitRequest("tenants", nil), false))
	require.True(t, resp.Allowed)
	require.Contains(t, resp.Warnings[0], "it will close no window")
	// ...and one asserting an author is refused: without a verdict, whoever posted one first
	// would decide it.
	_, resp = post(t, newTestHandler(t, rev, rec), reviewBody(t, "alice", commitRequest("tenants", jane), false))
	require.False(t, resp.Allowed)
	require.Equal(t, int32(http.StatusServiceUnavailable), resp.Result.Code)
	require.Contains(t, resp.Result.Message, "could not record the verdict")
}

func TestReviewOtherOperationsAreAllowed(t *testing.T) {
	rev, rec := &fakeReviewer{}, &fakeRecorder{}
	body := reviewBody(t, "alice", commitRequest("tenants", jane), false)
	var ar admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(body, &ar))
	ar.Request.Operation = admissionv1.Update
	body, _ = json.Marshal(ar)
	_, resp := post(t, newTestHandler(t, rev, rec), body)
	require.True(t, resp.Allowed)
	require.Empty(t, rev.got)
	require.Empty(t, rec.verdicts)
}

func TestBadRequests(t *testing.T) {
	h, err := NewHandler(HandlerOptions{Reviewer: &fakeReviewer{}, Verdicts: &fakeRecorder{}, MaxBodyBytes: 4096, Auth: testAuth(), Route: "local"})
	require.NoError(t, err)
	good := reviewBody(t, "alice", commitRequest("tenants", nil), false)
	for _, tc := range []struct {
		name, body, contentType string
		code                    int
		want                    string
	}{
		{"empty", "", "application/json", 400, "empty body"},
		{"not json", "{", "application/json", 400, "not an AdmissionReview"},
		{"wrong kind", `{"apiVersion":"v1","kind":"Pod"}`, "application/json", 400, "want apiVersion admission.k8s.io/v1"},
		{"no request", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, "application/json", 400, "no request"},
		{"no uid", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}`, "application/json", 400, "no uid"},
		{"object not a commit request", strings.Replace(string(good), `"spec":{`, `"spec":{"closeDelaySeconds":"x",`, 1), "application/json", 400, "not a CommitRequest"},
		{"too large", `{"x":"` + strings.Repeat("a", 5000) + `"}`, "application/json", 413, "exceeds 4096 bytes"},
		{"content type", string(good), "text/plain", 415, "want application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, Path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.contentType)
			req.TLS = verifiedCert("kube-apiserver")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, tc.code, rec.Code)
			require.Contains(t, rec.Body.String(), tc.want)
		})
	}
	rec := httptest.NewRecorder()
	get := httptest.NewRequest(http.MethodGet, Path, nil)
	get.TLS = verifiedCert("kube-apiserver")
	h.ServeHTTP(rec, get)
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

// testAuth authenticates the test apiserver by its client certificate (CN kube-apiserver,
// bound to the local route), and the tokens of a local and a tenant apiserver.
func testAuth() *reviewhttp.Auth {
	return &reviewhttp.Auth{Callers: audit.Authenticator{
		LocalRoute: "local",
		Tokens: []audit.Token{
			{Value: []byte("local-token"), Routes: []string{"local"}, Line: 1},
			{Value: []byte("tenant-token"), Routes: []string{"tenant-a"}, Line: 2},
		},
		CertRoutes: map[string][]string{"tenant-a-apiserver": {"tenant-a"}},
	}, CertWebhooks: map[string][]string{"attribution-only": {reviewhttp.WebhookAttribution}}}
}

// crToken and attributionToken are the two webhooks' tokens derived from a token file secret.
func crToken(secret string) string {
	return reviewhttp.WebhookToken([]byte(secret), reviewhttp.WebhookCommitRequests)
}

func attributionToken(secret string) string {
	return reviewhttp.WebhookToken([]byte(secret), reviewhttp.WebhookAttribution)
}

func verifiedCert(cn string) *tls.ConnectionState {
	return &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn}}}}}
}

// Every caller is authenticated and must be bound to the local route, before the body is read
// and before any SubjectAccessReview.
func TestAuthentication(t *testing.T) {
	masters := reviewBody(t, "mallory", commitRequest("tenants", jane), false)
	var ar admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(masters, &ar))
	ar.Request.UserInfo.Groups = []string{"system:masters"}
	masters, _ = json.Marshal(ar)
	for _, tc := range []struct {
		name   string
		auth   *reviewhttp.Auth
		path   string
		tls    *tls.ConnectionState
		header string
		code   int
	}{
		{name: "no credential", auth: testAuth(), path: Path, code: 401},
		{name: "TLS without a verified certificate", auth: testAuth(), path: Path, tls: &tls.ConnectionState{}, code: 401},
		{name: "no authenticator", path: Path, tls: verifiedCert("kube-apiserver"), code: 401},
		{name: "wrong path token", auth: testAuth(), path: Path + "/guessed", code: 401},
		{name: "wrong bearer token", auth: testAuth(), path: Path, header: "Bearer guessed", code: 401},
		{name: "tenant certificate", auth: testAuth(), path: Path, tls: verifiedCert("tenant-a-apiserver"), code: 403},
		{name: "tenant path token", auth: testAuth(), path: Path + "/" + crToken("tenant-token"), code: 403},
		{name: "the local apiserver's certificate", auth: testAuth(), path: Path, tls: verifiedCert("kube-apiserver"), code: 200},
		{name: "the local path token", auth: testAuth(), path: Path + "/" + crToken("local-token"), code: 200},
		{name: "the local bearer token", auth: testAuth(), path: Path, header: "Bearer " + crToken("local-token"), code: 200},
		// A secret of the token file is a bearer token (the AdmissionConfiguration's
		// kubeconfig), never a URL path segment: a URL leaks.
		{name: "the local secret as a bearer token", auth: testAuth(), path: Path, header: "Bearer local-token", code: 200},
		{name: "the local secret in the path", auth: testAuth(), path: Path + "/local-token", code: 401},
		// The attribution webhook's token never opens this one, in the path or as a bearer.
		{name: "the attribution token in the path", auth: testAuth(), path: Path + "/" + attributionToken("local-token"), code: 401},
		{name: "the attribution token as a bearer token", auth: testAuth(), path: Path, header: "Bearer " + attributionToken("local-token"), code: 401},
		{name: "a certificate bound to the attribution webhook", auth: testAuth(), path: Path, tls: verifiedCert("attribution-only"), code: 403},
		{name: "anonymous, opted out", auth: &reviewhttp.Auth{AllowUnauthenticated: true, Callers: audit.Authenticator{LocalRoute: "local"}}, path: Path, code: 200},
		{name: "wrong token, opted out", auth: &reviewhttp.Auth{AllowUnauthenticated: true, Callers: audit.Authenticator{LocalRoute: "local"}}, path: Path + "/guessed", code: 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rev, rec := &fakeReviewer{allowed: map[string]string{"mallory": "tenants"}}, &fakeRecorder{}
			logs := &bytes.Buffer{}
			h, err := NewHandler(HandlerOptions{Reviewer: rev, Verdicts: rec, Auth: tc.auth, Route: "local",
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			require.NoError(t, err)
			r := &countingReader{r: bytes.NewReader(masters)}
			req := httptest.NewRequest(http.MethodPost, tc.path, r)
			req.TLS = tc.tls
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			require.Equal(t, tc.code, w.Code, w.Body.String())
			require.NotContains(t, logs.String(), "local-token")
			require.NotContains(t, logs.String(), "tenant-token")
			require.NotContains(t, logs.String(), crToken("local-token"))
			require.NotContains(t, logs.String(), attributionToken("local-token"))
			require.NotContains(t, w.Body.String(), "local-token")
			if tc.code != http.StatusOK {
				require.Zero(t, r.n, "the body of a refused request is not read")
				require.Empty(t, rev.got, "no SubjectAccessReview for a refused request")
				require.Empty(t, rec.verdicts)
				return
			}
			require.Len(t, rev.got, 1)
			require.Len(t, rec.verdicts, 1)
		})
	}
	_, err := NewHandler(HandlerOptions{Reviewer: &fakeReviewer{}, Verdicts: &fakeRecorder{}})
	require.ErrorContains(t, err, "Route is required")
}

// A CommitRequest as large as the apiserver accepts gets a real verdict: bob's ~280 KB of
// labels no longer push its review over the limit (where failurePolicy Ignore would have
// admitted it without one).
func TestLargeCommitRequestGetsAVerdict(t *testing.T) {
	cr := commitRequest("tenants", jane)
	cr.Labels = map[string]string{}
	for i := 0; len(cr.Labels)*70 < 280<<10; i++ {
		cr.Labels[fmt.Sprintf("padding.example.com/key-%06d", i)] = strings.Repeat("v", 40)
	}
	body := reviewBody(t, "bob", cr, false)
	require.Greater(t, len(body), 256<<10)
	rev, rec := &fakeReviewer{}, &fakeRecorder{}
	_, resp := post(t, newTestHandler(t, rev, rec), body)
	require.NotNil(t, resp)
	require.False(t, resp.Allowed, "bob may not assert an author: denied")
	require.Len(t, rev.got, 1)
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
