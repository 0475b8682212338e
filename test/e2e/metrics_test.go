package e2e

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubescribe/kubescribe/test/stack"
)

// The metrics listener, attacked first, through the real apiserver's TokenReviews and
// SubjectAccessReviews: no token, a garbage token, a token forged in the name of the stack's
// metrics reader, and that reader's real token minted for another audience get 401; a real
// ServiceAccount token and a real user's token without kubescribe-metrics-reader get 403; the
// same ServiceAccount, once bound to it, gets the page, which counts those refusals. Plain HTTP
// gets no page; the probes answer without credentials; no token reaches kubescribe's log.
func TestMetricsListenerAuthenticatesAndAuthorizes(t *testing.T) {
	ctx := context.Background()
	const ns, sa = "e2e-metrics-auth", "scraper"
	admin := clientFor(t, "admin")
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	require.NoError(t, err)
	scraperToken := serviceAccountToken(t, admin, ns, sa)
	before, err := env.ScrapeMetrics()
	require.NoError(t, err)
	const unauthenticated, forbidden = `kubescribe_metrics_refused_total{reason="unauthenticated"}`, `kubescribe_metrics_refused_total{reason="forbidden"}`

	// 401: nothing the apiserver accepts as a token for itself.
	foreign, err := admin.CoreV1().ServiceAccounts("kubescribe").CreateToken(ctx, stack.MetricsReader, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"https://vault.example.invalid"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	refusedTokens := map[string]string{
		"no token":                            "",
		"garbage token":                       "garbage-not-a-token",
		"forged metrics reader token":         forgedServiceAccountToken(t, "kubescribe", stack.MetricsReader),
		"reader's token for another audience": foreign.Status.Token,
	}
	for name, token := range refusedTokens {
		code, body, err := env.GetMetrics(token)
		require.NoError(t, err, name)
		require.Equal(t, http.StatusUnauthorized, code, "%s: %s", name, body)
		require.NotContains(t, string(body), "kubescribe_", name)
	}

	// 403: real identities without the ClusterRole.
	for name, token := range map[string]string{"ServiceAccount " + sa: scraperToken, "user alice": env.UserConfig("alice").BearerToken} {
		code, body, err := env.GetMetrics(token)
		require.NoError(t, err, name)
		require.Equal(t, http.StatusForbidden, code, "%s: %s", name, body)
		require.NotContains(t, string(body), "kubescribe_", name)
	}

	// 200 once the ServiceAccount is bound to kubescribe-metrics-reader (RBAC and the deny
	// cache take a moment).
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-metrics-scraper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kubescribe-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	var page []byte
	require.True(t, poll(time.Minute, func() bool {
		var code int
		code, page, err = env.GetMetrics(scraperToken)
		return err == nil && code == http.StatusOK
	}), "the bound ServiceAccount never read /metrics: %v %s", err, page)
	after := stack.ParseMetrics(page)
	require.GreaterOrEqual(t, after[unauthenticated]-before[unauthenticated], float64(len(refusedTokens)), "the page counts the 401s")
	require.GreaterOrEqual(t, after[forbidden]-before[forbidden], 2.0, "the page counts the 403s")
	require.Positive(t, after[`kubescribe_audit_requests_total{code="200"}`])

	// Plain HTTP to the metrics port gets no page, whatever the token: the TLS server answers
	// 400 and closes the connection (or resets it, when the request was not read yet).
	u, err := url.Parse(env.MetricsURL)
	require.NoError(t, err)
	u.Scheme = "http"
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+env.MetricsToken)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", body)
		require.NotContains(t, string(body), "kubescribe_")
	}

	// The ops listener: probes without credentials, and no metrics any more.
	code, _ := get(t, "/healthz")
	require.Equal(t, http.StatusOK, code)
	code, ready := get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, ready)
	code, opsMetrics := get(t, "/metrics")
	require.Equal(t, http.StatusNotFound, code)
	require.NotContains(t, opsMetrics, "kubescribe_")

	// Refusals are logged, never with the token.
	log, err := os.ReadFile(env.LogPath)
	require.NoError(t, err)
	require.Contains(t, string(log), "unauthenticated metrics request")
	require.Contains(t, string(log), "system:serviceaccount:"+ns+":"+sa)
	for name, token := range refusedTokens {
		if token != "" {
			require.NotContains(t, string(log), token, "%s in kubescribe's log", name)
		}
	}
	require.NotContains(t, string(log), scraperToken)
}

// serviceAccountToken is a token the apiserver issues for ServiceAccount ns/name
// (TokenRequest, as the kubelet would mount it), valid for two hours.
func serviceAccountToken(t *testing.T, admin kubernetes.Interface, ns, name string) string {
	t.Helper()
	expiry := int64(2 * time.Hour / time.Second)
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return tok.Status.Token
}

// forgedServiceAccountToken is a JWT with the claims of a real ServiceAccount token for ns/name
// (the stack's issuer and audience), signed with a key of the forger's own.
func forgedServiceAccountToken(t *testing.T, ns, name string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	enc := func(v any) string {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	const issuer = "https://kubernetes.default.svc.cluster.local"
	now := time.Now().Unix()
	signed := enc(map[string]string{"alg": "RS256", "kid": "forged"}) + "." + enc(map[string]any{
		"iss": issuer, "aud": []string{issuer}, "sub": "system:serviceaccount:" + ns + ":" + name,
		"iat": now, "nbf": now, "exp": now + 3600,
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]string{"name": name, "uid": "00000000-0000-0000-0000-000000000000"}},
	})
	digest := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	require.NoError(t, err)
	token := signed + "." + base64.RawURLEncoding.EncodeToString(sig)
	require.Equal(t, 2, strings.Count(token, "."))
	return token
}
