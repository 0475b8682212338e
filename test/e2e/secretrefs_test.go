package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// vouchFor has the admin, who may read every Secret, touch an annotation of a GitProvider or
// GitTarget created while kubescribe (its webhook) was down, as docs/operations.md says for
// SecretReferenceUnverified: the webhook then records that someone who may read its Secrets
// vouched for its spec. It waits until the object's Ready reason is another.
func vouchFor(t *testing.T, gvr schema.GroupVersionResource, ns, name string) {
	t.Helper()
	client := dynamicFor(t, "admin").Resource(gvr).Namespace(ns)
	i := 0
	ok := poll(60*time.Second, func() bool {
		if i%10 == 0 { // once a second
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"kubescribe.dev/verify":"%d"}}}`, i)
			if _, err := client.Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				return false
			}
		}
		i++
		u, err := client.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		c := findCondition(u, v1alpha1.ConditionReady)
		return c != nil && c.Reason != v1alpha1.ReasonSecretReferenceUnverified
	})
	require.True(t, ok, "%s %s/%s is still SecretReferenceUnverified", gvr.Resource, ns, name)
}

// authRecorder is a Git server that records every request's Authorization header.
type authRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (a *authRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.seen = append(a.seen, r.Header.Get("Authorization"))
	a.mu.Unlock()
	w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
	http.Error(w, "authentication required", http.StatusUnauthorized)
}

func (a *authRecorder) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen...)
}

// The confused deputy, as the attacker runs it against the real apiserver: bob may write
// GitProviders and GitTargets in the namespace, but may not read its Secrets.
//   - A GitProvider naming the Secret "deploy-token" for bob's own server is refused by the
//     webhook, naming the missing right; so is a GitTarget encrypting the namespace's Secrets
//     for bob's own age recipient.
//   - With the webhook out of the way (kubescribe down: failurePolicy Ignore), bob's GitProvider
//     is created, but kubescribe never uses the Secret: SecretReferenceUnverified, and bob's
//     server receives no request at all.
func TestSecretReferenceNeedsTheRightToReadIt(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-secretrefs"
	admin := clientFor(t, "admin")
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "deploy-token"},
		StringData: map[string]string{"password": "team-deploy-token-never-send"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bindRole(t, admin, ns, "config-writers", []rbacv1.PolicyRule{{APIGroups: []string{"kubescribe.dev"},
		Resources: []string{"gitproviders", "gittargets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}}, "bob")
	require.True(t, poll(30*time.Second, func() bool {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "bob", ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "kubescribe.dev", Resource: "gittargets"}}}, metav1.CreateOptions{})
		return err == nil && sar.Status.Allowed
	}), "bob's Role is not in force")

	loot := &authRecorder{}
	srv := httptest.NewServer(loot)
	t.Cleanup(srv.Close)
	provider := &v1alpha1.GitProvider{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
		ObjectMeta: metav1.ObjectMeta{Name: "loot", Namespace: ns},
		Spec:       v1alpha1.GitProviderSpec{URL: srv.URL + "/loot.git", SecretRef: &v1alpha1.LocalObjectReference{Name: "deploy-token"}},
	}
	content, err := runtimeToUnstructured(provider)
	require.NoError(t, err)
	bob := dynamicFor(t, "bob")
	_, err = bob.Resource(v1alpha1.GitProvidersResource).Namespace(ns).Create(ctx, content, metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "bob's GitProvider naming a Secret he may not read: %v", err)
	require.ErrorContains(t, err, `get on Secret "deploy-token"`)

	id, err := age.GenerateX25519Identity()
	require.NoError(t, err)
	target, err := runtimeToUnstructured(&v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "secrets", Namespace: ns},
		Spec: v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "loot"}, Branch: "main",
			Encryption: &v1alpha1.Encryption{Age: []string{id.Recipient().String()}}},
	})
	require.NoError(t, err)
	_, err = bob.Resource(v1alpha1.GitTargetsResource).Namespace(ns).Create(ctx, target, metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "bob's GitTarget encrypting Secrets for his own recipient: %v", err)
	require.ErrorContains(t, err, "list on Secrets")

	// The webhook bypassed: kubescribe is down while bob creates the GitProvider.
	require.NoError(t, env.StopKubescribe())
	_, err = bob.Resource(v1alpha1.GitProvidersResource).Namespace(ns).Create(ctx, content, metav1.CreateOptions{})
	startErr := env.StartKubescribe(ctx)
	require.NoError(t, err, "failurePolicy Ignore: created while kubescribe is down")
	require.NoError(t, startErr)
	cond := waitReady(t, v1alpha1.GitProvidersResource, ns, "loot", metav1.ConditionFalse, v1alpha1.ReasonSecretReferenceUnverified)
	require.Contains(t, cond.Message, `"deploy-token"`)
	require.Empty(t, loot.requests(), "kubescribe sent nothing to bob's server")
	require.NoError(t, env.WaitSecretRefsWebhook(ctx))
}
