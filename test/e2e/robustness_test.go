package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/controlplane"
)

// auditClient talks to kubescribe's audit endpoint over real TLS, trusting the test CA and
// presenting cert when given.
func auditClient(t *testing.T, cert *tls.Certificate) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(env.CA.CertPEM))
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

func post(t *testing.T, c *http.Client, url, token string, body []byte) (int, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

const emptyEventList = `{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":[]}`

// The audit endpoint refuses strangers and bad bodies with clear status codes.
func TestAuditEndpointRejectsBadInput(t *testing.T) {
	plain := auditClient(t, nil)
	url := env.Audit.URL

	clientPEM, keyPEM, err := env.CA.Issue("some-apiserver", nil, nil, true)
	require.NoError(t, err)
	good, err := tls.X509KeyPair(clientPEM, keyPEM)
	require.NoError(t, err)
	otherCA, err := controlplane.NewCA("stranger-ca")
	require.NoError(t, err)
	strangerPEM, strangerKey, err := otherCA.Issue("stranger", nil, nil, true)
	require.NoError(t, err)
	stranger, err := tls.X509KeyPair(strangerPEM, strangerKey)
	require.NoError(t, err)

	tests := []struct {
		name   string
		client *http.Client
		url    string
		token  string
		body   []byte
		want   int
	}{
		{name: "no credentials", client: plain, url: url, body: []byte(emptyEventList), want: http.StatusUnauthorized},
		{name: "wrong token", client: plain, url: url, token: "not-the-token", body: []byte(emptyEventList), want: http.StatusUnauthorized},
		{name: "token", client: plain, url: url, token: env.Audit.Token, body: []byte(emptyEventList), want: http.StatusOK},
		{name: "client certificate", client: auditClient(t, &good), url: url, body: []byte(emptyEventList), want: http.StatusOK},
		{name: "malformed JSON", client: plain, url: url, token: env.Audit.Token, body: []byte(`{"kind":"EventList",`), want: http.StatusBadRequest},
		{name: "not an EventList", client: plain, url: url, token: env.Audit.Token, body: []byte(`{"kind":"ConfigMap","apiVersion":"v1"}`), want: http.StatusBadRequest},
		{name: "oversized", client: plain, url: url, token: env.Audit.Token, body: bytes.Repeat([]byte(" "), 11<<20), want: http.StatusRequestEntityTooLarge},
		{name: "invalid route", client: plain, url: strings.Replace(url, "/audit/local", "/audit/Not_A_Route", 1), token: env.Audit.Token, body: []byte(emptyEventList), want: http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, err := post(t, tt.client, tt.url, tt.token, tt.body)
			require.NoError(t, err)
			require.Equal(t, tt.want, code)
		})
	}

	t.Run("certificate from another CA", func(t *testing.T) {
		// Go's client only offers a certificate the server's CA list accepts; force it.
		c := auditClient(t, nil)
		c.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &stranger, nil
		}
		_, err := post(t, c, url, "", []byte(emptyEventList))
		require.Error(t, err, "the TLS handshake must fail")
	})
}

// Redis going away while a change is made loses nothing: the apiserver retries the audit batch
// kubescribe answered 503 (10s later, its default), and the change, whose lookups failed, waits
// past its grace window for it.
func TestRedisOutageLosesNoAuthor(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-redis", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	require.NoError(t, env.StopRedis())
	require.True(t, poll(10*time.Second, func() bool { code, _ := get(t, "/readyz"); return code == http.StatusServiceUnavailable }),
		"/readyz must report the Redis outage")
	restarted := false
	defer func() {
		if !restarted {
			_ = env.StartRedis()
		}
	}()
	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "during-outage"}, Data: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Long enough for the apiserver's first delivery of the batch to be refused.
	time.Sleep(2 * time.Second)
	require.NoError(t, env.StartRedis())
	restarted = true

	got := m.waitCommits(t, 1)
	require.Equal(t, []string{"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-redis/during-outage"}, got)
	requireNoCommitterChange(t, m, 0)
	code, body := get(t, "/readyz")
	require.Equal(t, http.StatusOK, code, body)
}

// The Git remote going away loses nothing: the target reports PushFailed while the commit waits,
// and the commit is pushed under its author once the remote is back.
func TestGitRemoteOutageLosesNothing(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-gitdown", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	env.Git.SetAvailable(false)
	defer env.Git.SetAvailable(true)
	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "while-git-is-down"}, Data: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	cond := waitReady(t, v1alpha1.GitTargetsResource, m.ns, "target", metav1.ConditionFalse, v1alpha1.ReasonPushFailed)
	require.Contains(t, cond.Message, "1 changes pending")
	require.NotContains(t, cond.Message, env.Git.Password)
	require.Empty(t, m.commits(t))

	env.Git.SetAvailable(true)
	got := m.waitCommits(t, 1)
	require.Equal(t, []string{"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-gitdown/while-git-is-down"}, got)
	waitReady(t, v1alpha1.GitTargetsResource, m.ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)
}

// Misconfiguration shows in the Ready condition with a reason an operator can act on, and
// credentials never appear in it.
func TestMisconfigurationIsReported(t *testing.T) {
	ctx := context.Background()
	ns := "e2e-misconfig"
	admin := clientFor(t, "admin")
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = env.Git.CreateRepo(ns)
	require.NoError(t, err)

	provider := func(name, url, secret string) *v1alpha1.GitProvider {
		return &v1alpha1.GitProvider{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       v1alpha1.GitProviderSpec{URL: url, SecretRef: &v1alpha1.LocalObjectReference{Name: secret}},
		}
	}
	secret := func(name, password string) {
		_, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Data:       map[string][]byte{"username": []byte(env.Git.Username), "password": []byte(password), "ca.crt": env.Git.CAData},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	url := env.Git.URL(ns)

	// A missing Secret, then the Secret appears.
	create(t, v1alpha1.GitProvidersResource, ns, provider("late-secret", url, "late"))
	cond := waitReady(t, v1alpha1.GitProvidersResource, ns, "late-secret", metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	require.Contains(t, cond.Message, `Secret "late" not found`)
	secret("late", env.Git.Password)
	waitReady(t, v1alpha1.GitProvidersResource, ns, "late-secret", metav1.ConditionTrue, v1alpha1.ReasonReady)

	// A wrong password.
	secret("wrong", "wrong-password-value")
	create(t, v1alpha1.GitProvidersResource, ns, provider("wrong-password", url, "wrong"))
	cond = waitReady(t, v1alpha1.GitProvidersResource, ns, "wrong-password", metav1.ConditionFalse, v1alpha1.ReasonAuthenticationFailed)
	require.NotContains(t, cond.Message, "wrong-password-value")

	// Credentials in the URL are refused without being echoed.
	withUser := strings.Replace(url, "https://", "https://someone:url-secret-value@", 1)
	create(t, v1alpha1.GitProvidersResource, ns, provider("user-in-url", withUser, "late"))
	cond = waitReady(t, v1alpha1.GitProvidersResource, ns, "user-in-url", metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec)
	require.NotContains(t, cond.Message, "url-secret-value")

	// A GitTarget on a provider that is not Ready, and one asking for a remote cluster whose kubeconfig Secret does not exist.
	create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "on-bad-provider", Namespace: ns},
		Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "wrong-password"}, Branch: "main"},
	})
	waitReady(t, v1alpha1.GitTargetsResource, ns, "on-bad-provider", metav1.ConditionFalse, v1alpha1.ReasonProviderNotReady)
	create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "remote", Namespace: ns},
		Spec: v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "late-secret"}, Branch: "main",
			SourceCluster: &v1alpha1.SourceCluster{KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: "kc"}, AuditRoute: "prod"}},
	})
	waitReady(t, v1alpha1.GitTargetsResource, ns, "remote", metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)

	// A WatchRule on a missing target, and one on resources the cluster does not serve.
	rule := func(name, target string, rules []v1alpha1.ResourceRule) {
		create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: target}, Rules: rules},
		})
	}
	rule("no-target", "missing", watchConfigMaps)
	waitReady(t, v1alpha1.WatchRulesResource, ns, "no-target", metav1.ConditionFalse, v1alpha1.ReasonTargetNotFound)
	create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: ns},
		Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "late-secret"}, Branch: "main"},
	})
	waitReady(t, v1alpha1.GitTargetsResource, ns, "good", metav1.ConditionTrue, v1alpha1.ReasonReady)
	rule("nothing-served", "good", []v1alpha1.ResourceRule{{APIGroups: []string{"example.com"}, Resources: []string{"widgets"}}})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "nothing-served", metav1.ConditionFalse, v1alpha1.ReasonNoResourcesMatched)
	rule("cluster-scoped", "good", []v1alpha1.ResourceRule{{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles"}}})
	cond = waitReady(t, v1alpha1.WatchRulesResource, ns, "cluster-scoped", metav1.ConditionFalse, v1alpha1.ReasonNoResourcesMatched)
	require.Contains(t, cond.Message, "cluster-scoped")
	rule("secrets", "good", []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"secrets"}}})
	cond = waitReady(t, v1alpha1.WatchRulesResource, ns, "secrets", metav1.ConditionFalse, v1alpha1.ReasonNoResourcesMatched)
	require.Contains(t, cond.Message, "Secrets are mirrored only encrypted: set spec.encryption.age on the GitTarget")
	// Exclusions are enforced now, not refused (test/e2e/exclude_test.go).
	rule("exclusions", "good", []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ExcludeUsers: []string{"bot"}}})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "exclusions", metav1.ConditionTrue, v1alpha1.ReasonReady)
}
