package authz

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
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
	h, err := NewHandler(HandlerOptions{Reviewer: rev, Verdicts: rec})
	require.NoError(t, err)
	return h
}

func post(t *testing.T, h http.Handler, body []byte) (*httptest.ResponseRecorder, *admissionv1.AdmissionResponse) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
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

func TestReviewFailuresAdmitWithoutRecordOfTheAssertion(t *testing.T) {
	// The SubjectAccessReview fails: admitted, recorded as not authorized, with a warning.
	rev, rec := &fakeReviewer{err: errors.New("apiserver unavailable")}, &fakeRecorder{}
	_, resp := post(t, newTestHandler(t, rev, rec), reviewBody(t, "alice", commitRequest("tenants", jane), false))
	require.True(t, resp.Allowed)
	require.NotEmpty(t, resp.Warnings)
	require.Len(t, rec.verdicts, 1)
	require.False(t, rec.verdicts[0].Authorized)

	// The store fails: admitted with a warning.
	rev, rec = &fakeReviewer{allowed: map[string]string{"alice": "tenants"}}, &fakeRecorder{err: errors.New("redis down")}
	_, resp = post(t, newTestHandler(t, rev, rec), reviewBody(t, "alice", commitRequest("tenants", jane), false))
	require.True(t, resp.Allowed)
	require.Contains(t, resp.Warnings[0], "spec.author will be ignored")
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
	h, err := NewHandler(HandlerOptions{Reviewer: &fakeReviewer{}, Verdicts: &fakeRecorder{}, MaxBodyBytes: 4096})
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
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			require.Equal(t, tc.code, rec.Code)
			require.Contains(t, rec.Body.String(), tc.want)
		})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}

func TestRequireClientCert(t *testing.T) {
	h, err := NewHandler(HandlerOptions{Reviewer: &fakeReviewer{}, Verdicts: &fakeRecorder{}, RequireClientCert: true})
	require.NoError(t, err)
	body := reviewBody(t, "alice", commitRequest("tenants", nil), false)
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code)
	require.Contains(t, rec.Body.String(), "client certificate")

	req = httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{}}}}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)
}
