package main

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/selftls"
)

// fakeSecretServer serves the Secrets given, as an apiserver would to a GET, and writes a
// kubeconfig for it.
func fakeSecretServer(t *testing.T, secrets ...*corev1.Secret) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, s := range secrets {
			if r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/"+s.Namespace+"/secrets/"+s.Name {
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(s)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: "not found"})
	}))
	t.Cleanup(srv.Close)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: srv.URL}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "admin"}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

func selfManagedSecret(t *testing.T) *corev1.Secret {
	t.Helper()
	p := selftls.Policy{DNSNames: selftls.ServiceDNSNames("kubescribe", "kubescribe-audit", "kubescribe-admission"),
		Validity: time.Hour, CAValidity: 10 * time.Hour}
	data, _, _, _, err := p.Plan(time.Now(), nil)
	require.NoError(t, err)
	return &corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "kubescribe-tls"}, Type: selftls.SecretType, Data: data}
}

// TestCAFromSecret: the webhook commands take the CA bundle from the self-managed TLS Secret
// through the user's kubeconfig; nothing else of the Secret reaches their output. The audit
// webhook kubeconfig, dialling an address the certificate does not name, verifies it for
// --tls-server-name: loaded with client-go as the apiserver loads it, it reaches a server
// serving the Secret's certificate.
func TestCAFromSecret(t *testing.T) {
	secret := selfManagedSecret(t)
	certManager := &corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "cert-manager-tls"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"ca.crt": secret.Data["ca.crt"], "tls.crt": secret.Data["tls.crt"], "tls.key": secret.Data["tls.key"]}}
	noCA := &corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "no-ca"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": secret.Data["tls.crt"], "tls.key": secret.Data["tls.key"]}}
	opaque := &corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "opaque"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"ca.crt": secret.Data["ca.crt"]}}
	kubeconfig := fakeSecretServer(t, secret, certManager, noCA, opaque)
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("t0ken\n"), 0o600))
	noKeys := func(out string) {
		for _, k := range []string{selftls.KeyCAKey, selftls.KeyKey} {
			require.NotContains(t, out, strings.Split(string(secret.Data[k]), "\n")[1])
		}
	}

	// A server with the Secret's certificate, on an address the certificate does not name.
	pair, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"])
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()

	auditConfig := func(extra ...string) *rest.Config {
		var out, errOut bytes.Buffer
		args := append([]string{"audit-webhook-config", "--url", srv.URL + "/audit/local", "--ca-from-secret", "kubescribe/kubescribe-tls",
			"--kubeconfig", kubeconfig, "--token-file", token}, extra...)
		require.Equal(t, 0, run(args, &out, &errOut), errOut.String())
		noKeys(out.String())
		cfg, err := clientcmd.RESTConfigFromKubeConfig(out.Bytes())
		require.NoError(t, err)
		require.Equal(t, secret.Data["ca.crt"], cfg.CAData)
		return cfg
	}
	post := func(cfg *rest.Config) error {
		client, err := rest.HTTPClientFor(cfg)
		require.NoError(t, err)
		resp, err := client.Post(cfg.Host, "application/json", strings.NewReader("{}"))
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	named := auditConfig("--tls-server-name", "kubescribe-audit.kubescribe.svc")
	require.Equal(t, "kubescribe-audit.kubescribe.svc", named.ServerName)
	require.NoError(t, post(named), "verified for the name the certificate carries")
	require.ErrorContains(t, post(auditConfig()), "certificate", "the bare address is not one of its names")

	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"admission-webhook-config", "--service", "kubescribe/kubescribe-admission",
		"--ca-from-secret", "kubescribe/kubescribe-tls", "--kubeconfig", kubeconfig}, &out, &errOut), errOut.String())
	noKeys(out.String())
	var vwc struct {
		Webhooks []struct {
			ClientConfig struct{ CABundle []byte } `json:"clientConfig"`
		} `json:"webhooks"`
	}
	require.NoError(t, yaml.Unmarshal(out.Bytes(), &vwc))
	require.Len(t, vwc.Webhooks, 3)
	require.Equal(t, secret.Data["ca.crt"], vwc.Webhooks[0].ClientConfig.CABundle)

	// cert-manager's kubernetes.io/tls Secret serves as well.
	out.Reset()
	require.Equal(t, 0, run([]string{"admission-webhook-config", "--service", "kubescribe/kubescribe-admission",
		"--ca-from-secret", "kubescribe/cert-manager-tls", "--kubeconfig", kubeconfig}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "caBundle: "+base64.StdEncoding.EncodeToString(secret.Data["ca.crt"]))
	noKeys(out.String())

	out.Reset()
	require.Equal(t, 0, run([]string{"attribution-webhook-config", "--service", "kubescribe/kubescribe-admission", "--resource", "configmaps",
		"--ca-from-secret", "kubescribe/kubescribe-tls", "--kubeconfig", kubeconfig}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "caBundle: ")
	noKeys(out.String())

	for name, tc := range map[string]struct {
		args []string
		err  string
	}{
		"opaque Secret":  {[]string{"--ca-from-secret", "kubescribe/opaque", "--kubeconfig", kubeconfig}, "not a self-managed TLS Secret"},
		"TLS without CA": {[]string{"--ca-from-secret", "kubescribe/no-ca", "--kubeconfig", kubeconfig}, "has no CA certificate in ca.crt"},
		"no Secret":      {[]string{"--ca-from-secret", "kubescribe/absent", "--kubeconfig", kubeconfig}, "--ca-from-secret: not found"},
		"no namespace":   {[]string{"--ca-from-secret", "absent", "--kubeconfig", kubeconfig}, "want <namespace>/<name>"},
		"both":           {[]string{"--ca-from-secret", "kubescribe/x", "--ca-file", token}, "exclusive"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"admission-webhook-config", "--service", "kubescribe/kubescribe-admission"}, tc.args...)
			require.Equal(t, 1, run(args, &out, &errOut))
			require.Contains(t, errOut.String(), tc.err)
			require.Empty(t, out.String())
		})
	}
}

// TestDoctorServingCASelfManaged: kubescribe doctor verifies the metrics listener with the CA
// of the Secret --tls-self-managed-secret names when the Deployment mounts no certificate.
func TestDoctorServingCASelfManaged(t *testing.T) {
	secret := selfManagedSecret(t)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "kubescribe"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "kubescribe",
			Args: []string{"--redis-addr=$(REDIS_ADDR)", "--tls-self-managed-secret=kubescribe/kubescribe-tls"}}}}}}}
	e := &doctorEnv{kube: kubefake.NewClientset(secret)}
	pool, how := e.servingCA(t.Context(), dep)
	require.NotNil(t, pool, how)
	require.Equal(t, "verified with ca.crt of Secret kubescribe/kubescribe-tls", how)

	dep.Spec.Template.Spec.Containers[0].Args = nil
	pool, how = e.servingCA(t.Context(), dep)
	require.Nil(t, pool)
	require.Contains(t, how, "names no --tls-self-managed-secret")
}
