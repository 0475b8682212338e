package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/reviewhttp"
	"github.com/kubescribe/kubescribe/test/controlplane"
)

// admissionClient talks to kubescribe's admission listener over real TLS, trusting the test
// CA and presenting cert when given.
func admissionClient(t *testing.T, cert *tls.Certificate) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(env.CA.CertPEM))
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		// Offer it whatever CA the server asks for: a stranger's certificate is sent too.
		c := *cert
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}
}

// issueClientCert issues a client certificate for cn from ca.
func issueClientCert(t *testing.T, ca *controlplane.CA, cn string) *tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(cn, nil, nil, true)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	return &cert
}

// Finding 1 replayed as bob would: his ~280 KB CommitRequest naming "Mallory Forged" gets a
// real verdict (denied: the create is refused), and a review he forges for a CommitRequest
// that exists is refused without a credential (401), with a certificate of another CA (TLS),
// and, from someone who does hold an admission certificate, claiming system:masters, changes
// nothing: the first record wins. Git shows no commit by Mallory.
func TestAuthnForgedCommitRequestReview(t *testing.T) {
	ctx := context.Background()
	m := newRequestMirror(t, "e2e-authn-forge")
	waitWebhook(t, m.ns, true)
	mallory := &v1alpha1.Identity{Name: "Mallory Forged", Email: "mallory@example.com"}

	// The oversized assertion: its review is far over the old 256 KiB limit.
	big, err := runtimeToUnstructured(commitRequestObject(m.ns, "big", requestSpec{target: "tenants", message: "Forged", author: mallory}))
	require.NoError(t, err)
	labels := map[string]string{}
	for i := 0; len(labels)*70 < 280<<10; i++ {
		labels[fmt.Sprintf("padding.example.com/key-%06d", i)] = strings.Repeat("v", 40)
	}
	big.SetLabels(labels)
	_, err = dynamicFor(t, "bob").Resource(v1alpha1.CommitRequestsResource).Namespace(m.ns).Create(ctx, big, metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "want the webhook's denial, got %v", err)
	require.ErrorContains(t, err, `user "bob" may not set spec.author`)
	_, err = dynamicFor(t, "admin").Resource(v1alpha1.CommitRequestsResource).Namespace(m.ns).Get(ctx, "big", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the oversized assertion was not created: %v", err)

	// A CommitRequest of bob's that exists, with its real verdict (submitter bob, no author),
	// kept open for a while so a forged review could race it.
	writeConfigMap(t, m, "bob", "sneaky")
	awaitOpenWindow(t, m, 0)
	cover := commitRequestObject(m.ns, "cover", requestSpec{target: "tenants", message: "Cover"})
	delay := int32(10)
	cover.Spec.CloseDelaySeconds = &delay
	u, err := runtimeToUnstructured(cover)
	require.NoError(t, err)
	created, err := dynamicFor(t, "bob").Resource(v1alpha1.CommitRequestsResource).Namespace(m.ns).Create(ctx, u, metav1.CreateOptions{})
	require.NoError(t, err)
	uid := created.GetUID()

	// bob's forged review: that uid, spec.author Mallory, and the groups of a cluster admin.
	forged := commitRequestObject(m.ns, "cover", requestSpec{target: "tenants", message: "Cover", author: mallory})
	forged.UID = uid
	raw, err := json.Marshal(forged)
	require.NoError(t, err)
	review, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("forged-review"),
			Kind:      metav1.GroupVersionKind{Group: "kubescribe.dev", Version: "v1alpha1", Kind: "CommitRequest"},
			Resource:  metav1.GroupVersionResource{Group: "kubescribe.dev", Version: "v1alpha1", Resource: "commitrequests"},
			Namespace: m.ns, Name: "cover", Operation: admissionv1.Create,
			UserInfo: authenticationv1.UserInfo{Username: "bob", Groups: []string{"system:masters", "system:authenticated"}},
			Object:   runtimeRaw(raw),
		},
	})
	require.NoError(t, err)

	unauthenticated := `kubescribe_admission_refused_total{reason="unauthenticated",webhook="commitrequests"}`
	before := metricValue(t, unauthenticated)
	code, err := post(t, admissionClient(t, nil), env.AdmissionURL, "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "no client certificate")
	code, err = post(t, admissionClient(t, nil), env.AdmissionURL+"/guessed-token", "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "a guessed path token")
	require.Equal(t, before+2, metricValue(t, unauthenticated))

	otherCA, err := controlplane.NewCA("stranger-ca")
	require.NoError(t, err)
	_, err = post(t, admissionClient(t, issueClientCert(t, otherCA, "kube-apiserver")), env.AdmissionURL, "", review)
	require.Error(t, err, "a certificate of another CA fails the TLS handshake")

	// An insider with a real admission certificate: the review is read, but the uid has a
	// verdict already, and the first record wins.
	code, err = post(t, admissionClient(t, issueClientCert(t, env.CA, "insider")), env.AdmissionURL, "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	rdb := redis.NewClient(&redis.Options{Addr: env.RedisAddr})
	defer rdb.Close()
	v, ok, err := authz.NewStore(rdb, keyspace.MustParse(keyspace.DefaultPrefix), 0).Lookup(ctx, uid)
	require.NoError(t, err)
	require.True(t, ok, "the apiserver's own review recorded a verdict")
	require.Equal(t, "bob", v.Submitter.Username)
	require.NotContains(t, v.Submitter.Groups, "system:masters")
	require.Nil(t, v.Author)
	require.False(t, v.Authorized)

	cr := waitRequest(t, m.ns, "cover")
	requireConditions(t, cr, metav1.ConditionTrue, v1alpha1.ReasonCommitted, metav1.ConditionTrue, v1alpha1.ReasonAttributedFromAdmission)
	require.Equal(t, "bob|kubescribe|Cover", m.git(t, "log", "-1", "--format=%an|%cn|%s", "main"))
	require.NotContains(t, m.git(t, "log", "--format=%an %ae%n%B", "main"), "Mallory")
}

// Finding 4a: a tenant cluster's audit token is bound to route tenant-a; its batch for the
// local route, claiming mallory wrote alice's ConfigMap, is refused with 403 and stored
// nothing: Git shows alice. The same token may post for its own route.
func TestAuthnAuditTokenBoundToRoute(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-authn-route", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	refused := `kubescribe_audit_refused_total{reason="route_not_bound"}`
	before := metricValue(t, refused)

	cm, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "owned"}, Data: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	cm.APIVersion, cm.Kind = "v1", "ConfigMap"
	obj, err := json.Marshal(cm)
	require.NoError(t, err)
	now := metav1.NewMicroTime(time.Now())
	batch, err := json.Marshal(auditv1.EventList{
		TypeMeta: metav1.TypeMeta{APIVersion: "audit.k8s.io/v1", Kind: "EventList"},
		Items: []auditv1.Event{{
			Level: auditv1.LevelRequestResponse, AuditID: "forged-audit-id", Stage: auditv1.StageResponseComplete,
			RequestURI: "/api/v1/namespaces/" + m.ns + "/configmaps", Verb: "create",
			User:                     authenticationv1.UserInfo{Username: "mallory", Groups: []string{"system:authenticated"}},
			ObjectRef:                &auditv1.ObjectReference{Resource: "configmaps", Namespace: m.ns, Name: "owned", APIVersion: "v1"},
			ResponseStatus:           &metav1.Status{Code: http.StatusCreated},
			ResponseObject:           runtimeUnknown(obj),
			RequestReceivedTimestamp: now, StageTimestamp: now,
		}},
	})
	require.NoError(t, err)

	local := env.Audit.URL
	code, err := post(t, auditClient(t, nil), local, env.Audit.TenantToken, batch)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, code, "a tenant's token may not post for the local route")
	require.Equal(t, before+1, metricValue(t, refused))
	tenant := strings.Replace(local, "/audit/local", "/audit/"+env.Audit.TenantRoute, 1)
	code, err = post(t, auditClient(t, nil), tenant, env.Audit.TenantToken, []byte(emptyEventList))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "it may post for its own route")

	got := m.waitCommits(t, 1)
	require.Equal(t, []string{"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps " + m.ns + "/owned"}, got)
	require.NotContains(t, m.git(t, "log", "--format=%an %ae%n%B", "main"), "mallory")
}

// An unauthenticated review posted to the attribution webhook is refused with 401 and records
// no candidate: the same review from the apiserver's certificate is recorded once, and only
// once.
func TestAuthnAttributionWebhookRefusesStrangers(t *testing.T) {
	review, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "stranger-review", Operation: admissionv1.Create, Namespace: "e2e-authn-attr", Name: "cm",
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			UserInfo: authenticationv1.UserInfo{Username: "mallory"},
			Object: runtimeRaw([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","namespace":"e2e-authn-attr",` +
				`"uid":"11111111-2222-3333-4444-555555555555","resourceVersion":"1"},"data":{"k":"v"}}`)),
		},
	})
	require.NoError(t, err)
	recorded := `kubescribe_admission_candidates_total{result="recorded"}`
	before := metricValue(t, recorded)

	code, err := post(t, admissionClient(t, nil), env.AttributionURL(), "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code)
	code, err = post(t, admissionClient(t, nil), env.AttributionURL(), env.Audit.Token, review)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "an audit token is no admission credential")

	// The positive signal: the apiserver's kind of credential is recorded.
	code, err = post(t, admissionClient(t, issueClientCert(t, env.CA, env.Admission.ClientCertCN)), env.AttributionURL(), "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return metricValue(t, recorded) >= before+1 }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, before+1, metricValue(t, recorded), "only the authenticated review became a candidate")

	// A local credential may not speak for another cluster's route.
	code, err = post(t, admissionClient(t, issueClientCert(t, env.CA, env.Admission.ClientCertCN)),
		strings.TrimSuffix(env.AttributionURL(), "local")+"tenant-a", "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, code)
}

// runtimeUnknown carries a JSON object as an audit event's request or response object.
func runtimeUnknown(b []byte) *runtime.Unknown {
	return &runtime.Unknown{Raw: b, ContentType: runtime.ContentTypeJSON}
}

// The CommitRequest webhook's two entries, as the real apiserver evaluates their
// matchConditions: with kubescribe unreachable, a request asserting an author is refused
// (failurePolicy Fail), and one without is admitted (Ignore).
func TestAuthnAssertedAuthorFailsClosed(t *testing.T) {
	ctx := context.Background()
	m := newRequestMirror(t, "e2e-authn-failclosed")
	waitWebhook(t, m.ns, true)

	// A second registration of the same configuration, for this namespace only, pointing at an
	// address where nothing listens: every call to it fails.
	dead, err := controlplane.FreeAddr()
	require.NoError(t, err)
	url := "https://" + dead + authz.Path
	cfg := authz.WebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: env.CA.CertPEM})
	cfg.Name = "e2e-authn-unreachable"
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].Name = "unreachable-" + cfg.Webhooks[i].Name
		cfg.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": m.ns}}
	}
	vwcs := clientFor(t, "admin").AdmissionregistrationV1().ValidatingWebhookConfigurations()
	_, err = vwcs.Create(ctx, cfg, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = vwcs.Delete(context.Background(), cfg.Name, metav1.DeleteOptions{}) })

	// alice may assert authors on tenants, but kubescribe (this registration of it) cannot be
	// asked: refused, once the apiserver calls the new registration.
	jane := &v1alpha1.Identity{Name: "Jane Tenant", Email: "jane@tenants.example.com"}
	i := 0
	var last error
	require.True(t, poll(60*time.Second, func() bool {
		i++
		last = submit(t, "alice", m.ns, fmt.Sprintf("asserted-%d", i), requestSpec{target: "tenants", message: "m", author: jane}, true)
		return last != nil && strings.Contains(last.Error(), "failed calling webhook")
	}), "an asserted author is refused while kubescribe cannot be called; last answer: %v", last)
	require.ErrorContains(t, last, "unreachable-"+authz.AuthorWebhookName)

	// Without spec.author the unreachable entry is ignored.
	require.NoError(t, submit(t, "alice", m.ns, "plain", requestSpec{target: "tenants", message: "m"}, true))
}

// A managed cluster's apiserver presents no client certificate (here: it presents one only to
// 127.0.0.1:<port>, and this registration names localhost): it authenticates with the token in
// the webhook's URL path. A wrong token is refused (401, so the asserted create fails closed),
// the right one is served.
func TestAuthnManagedClusterPathToken(t *testing.T) {
	ctx := context.Background()
	m := newRequestMirror(t, "e2e-authn-token")
	env.AdmissionToken = true
	require.NoError(t, env.StopKubescribe())
	require.NoError(t, env.StartKubescribe(ctx))
	t.Cleanup(func() {
		env.AdmissionToken = false
		require.NoError(t, env.StopKubescribe())
		require.NoError(t, env.StartKubescribe(context.Background()))
	})
	waitWebhook(t, m.ns, true)

	vwcs := clientFor(t, "admin").AdmissionregistrationV1().ValidatingWebhookConfigurations()
	register := func(name, token string) {
		url := strings.Replace(env.AdmissionURL, "127.0.0.1", "localhost", 1) + "/" + token
		cfg := authz.WebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: env.CA.CertPEM})
		cfg.Name = name
		for i := range cfg.Webhooks {
			cfg.Webhooks[i].Name = name + "-" + cfg.Webhooks[i].Name
			cfg.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": m.ns}}
		}
		_, err := vwcs.Create(ctx, cfg, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = vwcs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	jane := &v1alpha1.Identity{Name: "Jane Tenant", Email: "jane@tenants.example.com"}
	i := 0
	assert := func() error {
		i++
		return submit(t, "alice", m.ns, fmt.Sprintf("asserted-%d", i), requestSpec{target: "tenants", message: "m", author: jane}, true)
	}

	unauthenticated := `kubescribe_admission_refused_total{reason="unauthenticated",webhook="commitrequests"}`
	before := metricValue(t, unauthenticated)
	register("wrong-token", "guessed")
	var last error
	require.True(t, poll(60*time.Second, func() bool {
		last = assert()
		return last != nil && strings.Contains(last.Error(), "failed calling webhook")
	}), "a wrong path token is refused; last answer: %v", last)
	require.Greater(t, metricValue(t, unauthenticated), before)
	require.NoError(t, vwcs.Delete(ctx, "wrong-token", metav1.DeleteOptions{}))
	require.True(t, poll(60*time.Second, func() bool { return assert() == nil }), "the wrong registration is gone")

	// The right token: every assertion is now reviewed twice (the certificate's registration
	// and the token's), and none is refused as unauthenticated.
	crToken := reviewhttp.WebhookToken([]byte(env.Admission.Token), reviewhttp.WebhookCommitRequests)
	register("path-token", crToken)
	served := `kubescribe_authz_requests_total{code="200"}`
	before = metricValue(t, unauthenticated)
	require.True(t, poll(60*time.Second, func() bool {
		n := metricValue(t, served)
		last = assert()
		return last == nil && metricValue(t, served)-n == 2
	}), "the token's registration is served; last answer: %v", last)
	require.Equal(t, before, metricValue(t, unauthenticated))

	// Issue 36, finding 2: that token is in the error every CommitRequest creator gets while
	// kubescribe is unreachable. It opens the CommitRequest webhook only: the attribution
	// webhook refuses it, in the path and as a bearer token, and records nothing; the
	// attribution token and the secret itself are refused in the CommitRequest webhook's path.
	review, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "leaked-token-review", Operation: admissionv1.Create, Namespace: m.ns, Name: "cm",
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			UserInfo: authenticationv1.UserInfo{Username: "carol"},
			Object: runtimeRaw([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","namespace":"` + m.ns + `",` +
				`"uid":"11111111-2222-3333-4444-666666666666","resourceVersion":"1"},"data":{"k":"v"}}`)),
		},
	})
	require.NoError(t, err)
	recorded := `kubescribe_admission_candidates_total{result="recorded"}`
	candidates := metricValue(t, recorded)
	code, err := post(t, admissionClient(t, nil), env.AttributionURL()+"/"+crToken, "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "the CommitRequest token in the attribution webhook's path")
	code, err = post(t, admissionClient(t, nil), env.AttributionURL(), crToken, review)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "the CommitRequest token as a bearer token")
	attrToken := reviewhttp.WebhookToken([]byte(env.Admission.Token), reviewhttp.WebhookAttribution)
	for _, tok := range []string{attrToken, env.Admission.Token} {
		code, err = post(t, admissionClient(t, nil), env.AdmissionURL+"/"+tok, "", review)
		require.NoError(t, err)
		require.Equal(t, http.StatusUnauthorized, code, "another credential in the CommitRequest webhook's path")
	}
	// The positive signal: the attribution token opens the attribution webhook.
	code, err = post(t, admissionClient(t, nil), env.AttributionURL()+"/"+attrToken, "", review)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return metricValue(t, recorded) >= candidates+1 }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, candidates+1, metricValue(t, recorded), "only the attribution token's review became a candidate")
}
