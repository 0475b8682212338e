package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
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
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
)

// secretReviewer allows, per user, the verbs on Secrets listed as "get/<name>" or "list/".
type secretReviewer struct {
	mu      sync.Mutex
	allowed map[string][]string
	err     error
	got     []authorizationv1.ResourceAttributes
}

func (f *secretReviewer) Create(_ context.Context, sar *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, *sar.Spec.ResourceAttributes)
	if f.err != nil {
		return nil, f.err
	}
	ra := sar.Spec.ResourceAttributes
	out := sar.DeepCopy()
	for _, a := range f.allowed[sar.Spec.User] {
		if ra.Resource == "secrets" && ra.Group == "" && a == ra.Verb+"/"+ra.Name {
			out.Status.Allowed = true
		}
	}
	return out, nil
}

// secretRefRecorder records in memory.
type secretRefRecorder struct {
	mu       sync.Mutex
	verdicts []SecretRefVerdict
}

func (r *secretRefRecorder) RecordSecretRefs(_ context.Context, v SecretRefVerdict) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.verdicts = append(r.verdicts, v)
	return nil
}

func gitProvider(url, secret string) *v1alpha1.GitProvider {
	return &v1alpha1.GitProvider{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
		ObjectMeta: metav1.ObjectMeta{Name: "repo", Namespace: "shop", UID: types.UID("gp-uid")},
		Spec:       v1alpha1.GitProviderSpec{URL: url, SecretRef: &v1alpha1.LocalObjectReference{Name: secret}},
	}
}

// refsReview is the review of op on obj (a GitProvider or GitTarget) by user; old is the object
// before an update.
func refsReview(t *testing.T, user string, op admissionv1.Operation, obj, old runtime.Object) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	require.NoError(t, err)
	kind := obj.GetObjectKind().GroupVersionKind().Kind
	req := &admissionv1.AdmissionRequest{
		UID:       "review-uid",
		Kind:      metav1.GroupVersionKind{Group: "kubescribe.dev", Version: "v1alpha1", Kind: kind},
		Namespace: "shop", Name: "repo", Operation: op,
		UserInfo: authenticationv1.UserInfo{Username: user, Groups: []string{"system:authenticated"}},
		Object:   runtime.RawExtension{Raw: raw},
	}
	if old != nil {
		req.OldObject.Raw, err = json.Marshal(old)
		require.NoError(t, err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	require.NoError(t, err)
	return b
}

func postRefs(t *testing.T, h http.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, SecretRefsPath, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.TLS = verifiedCert("kube-apiserver")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var ar admissionv1.AdmissionReview
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &ar))
	require.NotNil(t, ar.Response)
	return ar.Response
}

func newRefsHandler(t *testing.T, rev *secretReviewer, rec *secretRefRecorder) http.Handler {
	t.Helper()
	h, err := NewHandler(HandlerOptions{Reviewer: rev, Verdicts: &fakeRecorder{}, SecretRefs: rec, Auth: testAuth(), Route: "local"})
	require.NoError(t, err)
	return h
}

// The confused deputy: mallory may create GitProviders but may not get the Secret "deploy-token";
// a GitProvider naming it, for a URL of hers, is refused and nothing is vouched for. alice, who
// may get it, is admitted and her verdict is recorded for that spec.
func TestSecretRefsNeedTheRightToReadThem(t *testing.T) {
	rev := &secretReviewer{allowed: map[string][]string{"alice": {"get/deploy-token", "get/signing"}, "mallory": {"get/her-own"}}}
	rec := &secretRefRecorder{}
	h := newRefsHandler(t, rev, rec)
	evil := gitProvider("https://mallory.example/repo.git", "deploy-token")

	resp := postRefs(t, h, refsReview(t, "mallory", admissionv1.Create, evil, nil))
	require.False(t, resp.Allowed)
	require.Equal(t, int32(http.StatusForbidden), resp.Result.Code)
	require.Contains(t, resp.Result.Message, `get on Secret "deploy-token"`)
	require.Contains(t, resp.Result.Message, `user "mallory"`)
	require.Empty(t, rec.verdicts)
	require.Equal(t, authorizationv1.ResourceAttributes{Namespace: "shop", Verb: "get", Version: "v1", Resource: "secrets", Name: "deploy-token"}, rev.got[0])

	good := gitProvider("https://git.example/repo.git", "deploy-token")
	good.Spec.Signing = &v1alpha1.CommitSigning{SecretRef: v1alpha1.LocalObjectReference{Name: "signing"}}
	resp = postRefs(t, h, refsReview(t, "alice", admissionv1.Create, good, nil))
	require.True(t, resp.Allowed)
	digest, err := SpecDigest(good.Spec)
	require.NoError(t, err)
	require.Equal(t, []SecretRefVerdict{{UID: "gp-uid", Kind: "GitProvider", Namespace: "shop", Name: "repo", Digest: digest, User: "alice",
		Refs: SecretRefs{Get: []string{"deploy-token", "signing"}}}}, rec.verdicts)

	// mallory changes the URL of alice's provider: refused. A metadata-only update of hers is
	// admitted but vouches for nothing; alice's vouches for the spec as it is.
	moved := good.DeepCopy()
	moved.Spec.URL = "https://mallory.example/repo.git"
	resp = postRefs(t, h, refsReview(t, "mallory", admissionv1.Update, moved, good))
	require.False(t, resp.Allowed)
	labelled := good.DeepCopy()
	labelled.Labels = map[string]string{"touched": "yes"}
	resp = postRefs(t, h, refsReview(t, "mallory", admissionv1.Update, labelled, good))
	require.True(t, resp.Allowed)
	require.Len(t, rec.verdicts, 1)
	resp = postRefs(t, h, refsReview(t, "alice", admissionv1.Update, labelled, good))
	require.True(t, resp.Allowed)
	require.Len(t, rec.verdicts, 2)

	// A provider naming no Secret needs no check.
	rev.got = nil
	anon := gitProvider("https://git.example/public.git", "")
	anon.Spec.SecretRef = nil
	require.True(t, postRefs(t, h, refsReview(t, "mallory", admissionv1.Create, anon, nil)).Allowed)
	require.Empty(t, rev.got)
}

// A GitTarget encrypting Secrets for recipients its creator chose needs list on Secrets; its
// kubeconfig Secret needs get.
func TestSecretRefsOfGitTargets(t *testing.T) {
	rev := &secretReviewer{allowed: map[string][]string{"alice": {"list/", "get/edge-kc"}, "mallory": {"get/edge-kc"}}}
	rec := &secretRefRecorder{}
	h := newRefsHandler(t, rev, rec)
	target := &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "repo", Namespace: "shop", UID: "gt-uid"},
		Spec: v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main",
			Encryption: &v1alpha1.Encryption{Age: []string{"age1mallory"}}},
	}
	resp := postRefs(t, h, refsReview(t, "mallory", admissionv1.Create, target, nil))
	require.False(t, resp.Allowed)
	require.Contains(t, resp.Result.Message, "list on Secrets")
	require.True(t, postRefs(t, h, refsReview(t, "alice", admissionv1.Create, target, nil)).Allowed)

	remote := target.DeepCopy()
	remote.Spec.Encryption = nil
	remote.Spec.SourceCluster = &v1alpha1.SourceCluster{KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: "edge-kc"}, AuditRoute: "edge"}
	require.True(t, postRefs(t, h, refsReview(t, "mallory", admissionv1.Create, remote, nil)).Allowed)
	require.Len(t, rec.verdicts, 2)
	require.Equal(t, SecretRefs{List: true}, rec.verdicts[0].Refs)
	require.Equal(t, SecretRefs{Get: []string{"edge-kc"}}, rec.verdicts[1].Refs)
}

// A failed SubjectAccessReview admits the object with a warning and vouches for nothing; an
// unauthenticated caller is refused before anything is read.
func TestSecretRefsFailuresVouchForNothing(t *testing.T) {
	rev := &secretReviewer{err: errors.New("apiserver unavailable")}
	rec := &secretRefRecorder{}
	h := newRefsHandler(t, rev, rec)
	resp := postRefs(t, h, refsReview(t, "alice", admissionv1.Create, gitProvider("https://git.example/r.git", "deploy-token"), nil))
	require.True(t, resp.Allowed)
	require.Contains(t, resp.Warnings[0], "SecretReferenceUnverified")
	require.Empty(t, rec.verdicts)

	req := httptest.NewRequest(http.MethodPost, SecretRefsPath, bytes.NewReader(refsReview(t, "alice", admissionv1.Create, gitProvider("https://x", "deploy-token"), nil)))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Empty(t, rec.verdicts)
}

func TestSecretRefStore(t *testing.T) {
	rdb := redistest.Start(t)
	ctx := context.Background()
	s := NewSecretRefStore(rdb, keyspace.MustParse("team:ks"))
	require.Equal(t, "team:ks:authz:v1:secretrefs:gp-uid", s.Key("gp-uid"))
	_, found, err := s.LookupSecretRefs(ctx, "gp-uid", "d1")
	require.NoError(t, err)
	require.False(t, found)

	v := SecretRefVerdict{UID: "gp-uid", Kind: "GitProvider", Namespace: "shop", Name: "repo", Digest: "d1", User: "alice", Refs: SecretRefs{Get: []string{"s"}}}
	require.NoError(t, s.RecordSecretRefs(ctx, v))
	forged := v
	forged.User = "mallory"
	require.NoError(t, s.RecordSecretRefs(ctx, forged))
	got, found, err := s.LookupSecretRefs(ctx, "gp-uid", "d1")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, v, got, "the first record wins")
	_, found, err = s.LookupSecretRefs(ctx, "gp-uid", "d2")
	require.NoError(t, err)
	require.False(t, found, "a verdict vouches for its spec only")
	ttl, err := rdb.TTL(ctx, s.Key("gp-uid")).Result()
	require.NoError(t, err)
	require.Negative(t, ttl, "kept as long as the object keeps its spec")

	v2 := v
	v2.Digest = "d2"
	require.NoError(t, s.RecordSecretRefs(ctx, v2))
	require.NoError(t, s.ForgetSecretRefs(ctx, "gp-uid", "d2"))
	_, found, _ = s.LookupSecretRefs(ctx, "gp-uid", "d1")
	require.False(t, found)
	_, found, _ = s.LookupSecretRefs(ctx, "gp-uid", "d2")
	require.True(t, found)
	require.NoError(t, s.ForgetSecretRefs(ctx, "gp-uid", ""))
	n, err := rdb.Exists(ctx, s.Key("gp-uid")).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}
