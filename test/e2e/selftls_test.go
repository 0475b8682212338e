package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/selftls"
	"github.com/kubescribe/kubescribe/internal/testlog"
	"github.com/kubescribe/kubescribe/test/controlplane"
	"github.com/kubescribe/kubescribe/test/stack"
)

const selfManagedSecret = "kubescribe-tls"

// selfManagedServer is kubescribe run as a process of its own with self-managed TLS.
type selfManagedServer struct {
	cmd                       *exec.Cmd
	done                      chan error
	log                       *testlog.Buffer
	dir                       string // its working directory, $HOME and $TMPDIR
	audit, admission, metrics string // addresses
	ops                       string
}

// TestSelfManagedTLS: kubescribe with --tls-self-managed-secret, as deploy/components/self-managed-tls
// runs it, as the installed ServiceAccount holding only deploy/base's and that component's RBAC:
//   - it creates the Secret, and serves its certificate on the audit, admission and metrics
//     listeners: a client verifying against the Secret's CA bundle, for the Services' names
//     and for the extra IP, succeeds on each;
//   - it sets the CommitRequest webhook's caBundle to that bundle, and the apiserver, which
//     verifies kubescribe with it, admits a CommitRequest asserting an author (failurePolicy
//     Fail: only a webhook call that succeeded admits it);
//   - a serving certificate removed from the Secret is issued anew, and one due (a 30s life,
//     renewed at 2/3) is renewed, each served without a restart, by the same CA; the caBundle
//     stays valid and the apiserver still reaches the webhook;
//   - the `kubescribe audit-webhook-config --ca-from-secret` kubeconfig reaches the audit
//     listener as the apiserver would load it;
//   - an attacker's view: no private key of the Secret, in any version, appears in kubescribe's
//     output, in an Event, in a condition of kubescribe's objects, or in a file it wrote.
func TestSelfManagedTLS(t *testing.T) {
	ctx := context.Background()
	admin := clientFor(t, "admin")
	cp := env.ControlPlane

	// The usual kubescribe stops: this one serves the CommitRequest webhook's address.
	require.NoError(t, env.StopKubescribe())
	root := repoRoot(t)
	rbac, err := os.ReadFile(filepath.Join(root, "deploy", "components", "self-managed-tls", "rbac.yaml"))
	require.NoError(t, err)
	var srv *selfManagedServer
	t.Cleanup(func() {
		if srv != nil {
			srv.stop(t)
		}
		secrets := admin.CoreV1().Secrets(installedSANamespace)
		if err := secrets.Delete(ctx, selfManagedSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the Secret: %v", err)
		}
		deleteSelfManagedRBAC(t)
		// The webhook back to the usual kubescribe's CA, and that kubescribe back.
		require.NoError(t, env.RemoveWebhook(ctx))
		require.NoError(t, env.RegisterWebhook(ctx))
		require.NoError(t, env.StartKubescribe(ctx))
	})
	require.NoError(t, stack.Apply(ctx, env.AdminConfig, rbac))
	waitAllowed(t, admin, authorizationv1.ResourceAttributes{Namespace: installedSANamespace, Verb: "create", Resource: "secrets"})
	waitAllowed(t, admin, authorizationv1.ResourceAttributes{Verb: "update", Group: "admissionregistration.k8s.io",
		Resource: "validatingwebhookconfigurations", Name: authz.WebhookConfigurationName})
	_, err = admin.CoreV1().Secrets(installedSANamespace).Get(ctx, selfManagedSecret, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "no Secret before the first start: %v", err)

	srv = startSelfManaged(t, cp, kubeconfigOf(t, serviceAccountConfig(t, admin)))

	// The Secret, and its certificate served everywhere.
	var versions []map[string][]byte
	secret := func() *corev1.Secret {
		s, err := admin.CoreV1().Secrets(installedSANamespace).Get(ctx, selfManagedSecret, metav1.GetOptions{})
		require.NoError(t, err)
		versions = append(versions, s.Data)
		return s
	}
	first := secret()
	require.Equal(t, selftls.SecretType, first.Type)
	bundle := first.Data[selftls.KeyCABundle]
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(bundle))
	leaf := func(data map[string][]byte) *x509.Certificate {
		c, err := tls.X509KeyPair(data[selftls.KeyCert], data[selftls.KeyKey])
		require.NoError(t, err)
		l, err := x509.ParseCertificate(c.Certificate[0])
		require.NoError(t, err)
		return l
	}
	served := func(addr, name string) *x509.Certificate {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: name})
		require.NoError(t, err, "%s as %q", addr, name)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	listeners := map[string]string{srv.audit: "kubescribe-audit.kubescribe.svc", srv.admission: "kubescribe-admission.kubescribe.svc",
		srv.metrics: "kubescribe-metrics.kubescribe.svc.cluster.local"}
	servesEverywhere := func(want *x509.Certificate) {
		for addr, name := range listeners {
			require.True(t, served(addr, name).Equal(want), "%s serves another certificate", addr)
			require.True(t, served(addr, "").Equal(want), "%s, verified for the IP 127.0.0.1", addr)
		}
	}
	servesEverywhere(leaf(first.Data))

	// The metrics page, over that TLS, to the reader's token.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	req, err := http.NewRequest(http.MethodGet, "https://"+srv.metrics+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+env.MetricsToken)
	resp, err := client.Do(req)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", page)
	samples := stack.ParseMetrics(page)
	require.Equal(t, 1.0, samples[`kubescribe_tls_self_managed_issued_total{certificate="ca"}`])
	require.Equal(t, float64(leaf(first.Data).NotAfter.Unix()), samples[`kubescribe_tls_serving_certificate_expiry_timestamp_seconds{listener="audit"}`])

	// The webhook's caBundle, and the apiserver verifying kubescribe with it.
	webhookBundles := func() [][]byte {
		c, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, authz.WebhookConfigurationName, metav1.GetOptions{})
		require.NoError(t, err)
		var b [][]byte
		for _, w := range c.Webhooks {
			b = append(b, w.ClientConfig.CABundle)
		}
		return b
	}
	require.True(t, poll(30*time.Second, func() bool {
		b := webhookBundles()
		return bytes.Equal(b[0], bundle) && bytes.Equal(b[1], bundle)
	}), "the CommitRequest webhook's caBundle is not the CA's")
	apiserverReachesWebhook := func() {
		var last error
		ok := poll(30*time.Second, func() bool {
			last = submit(t, "admin", "default", "self-managed-tls", requestSpec{target: "target", message: "m",
				author: &v1alpha1.Identity{Name: "Alice", Email: "alice@example.com"}}, true)
			return last == nil
		})
		require.True(t, ok, "a CommitRequest asserting an author (failurePolicy Fail) was refused: %v", last)
	}
	apiserverReachesWebhook()

	// The apiserver's audit webhook kubeconfig from the Secret, dialling 127.0.0.1 and verifying
	// the Service's name, as client-go loads it in the apiserver.
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte(cp.Audit.Token+"\n"), 0o600))
	out := runCLI(t, "audit-webhook-config", "--url", "https://"+srv.audit+"/audit/local", "--tls-server-name", "kubescribe-audit.kubescribe.svc",
		"--ca-from-secret", installedSANamespace+"/"+selfManagedSecret, "--kubeconfig", kubeconfigFor(t, "admin"), "--token-file", token)
	require.Equal(t, 0, out.code, out.stderr)
	auditCfg, err := clientcmd.RESTConfigFromKubeConfig([]byte(out.stdout))
	require.NoError(t, err)
	auditClient, err := rest.HTTPClientFor(auditCfg)
	require.NoError(t, err)
	resp, err = auditClient.Post(auditCfg.Host, "application/json", strings.NewReader(`{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[]}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// A serving certificate removed from the Secret: a new one, long before the old was due.
	s := first.DeepCopy()
	delete(s.Data, selftls.KeyCert)
	_, err = admin.CoreV1().Secrets(installedSANamespace).Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	var second *corev1.Secret
	require.True(t, poll(20*time.Second, func() bool {
		second = secret()
		c := second.Data[selftls.KeyCert]
		return len(c) > 0 && !leaf(second.Data).Equal(leaf(first.Data))
	}), "no new certificate")
	require.True(t, time.Now().Before(selftls.RenewAt(leaf(first.Data))), "not renewed by time: the removal was noticed")
	require.Equal(t, bundle, second.Data[selftls.KeyCABundle], "the same CA")
	require.True(t, poll(10*time.Second, func() bool { return served(srv.audit, "").Equal(leaf(second.Data)) }))
	servesEverywhere(leaf(second.Data))

	// Renewed by time, at 2/3 of its 30s life.
	var third *corev1.Secret
	require.True(t, poll(40*time.Second, func() bool {
		third = secret()
		return !leaf(third.Data).Equal(leaf(second.Data))
	}), "not renewed")
	require.False(t, time.Now().Before(selftls.RenewAt(leaf(second.Data))), "renewed when due")
	require.Equal(t, bundle, third.Data[selftls.KeyCABundle])
	require.True(t, poll(10*time.Second, func() bool { return served(srv.metrics, "").Equal(leaf(third.Data)) }))
	for addr := range listeners {
		require.True(t, poll(10*time.Second, func() bool {
			got := served(addr, "")
			return got.Equal(leaf(third.Data)) || got.NotBefore.After(leaf(third.Data).NotBefore) // or a later one still
		}), addr)
	}
	for _, b := range webhookBundles() {
		require.Equal(t, bundle, b, "the caBundle stays the CA's")
	}
	apiserverReachesWebhook()

	// The attacker's view.
	srv.stop(t)
	var keys []string
	for _, data := range append(versions, secret().Data) {
		for _, k := range []string{selftls.KeyCAKey, selftls.KeyNextCAKey, selftls.KeyKey} {
			if pem := data[k]; len(pem) > 0 {
				keys = append(keys, strings.Split(string(pem), "\n")[1], base64.StdEncoding.EncodeToString(pem)[:40])
			}
		}
	}
	require.NotEmpty(t, keys)
	noKey := func(what, text string) {
		t.Helper()
		for _, k := range keys {
			require.NotContains(t, text, k, "a private key in %s", what)
		}
	}
	logText := srv.log.String()
	require.Contains(t, logText, "issued a serving certificate")
	noKey("kubescribe's output", logText)
	events, err := admin.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	b, err := json.Marshal(events)
	require.NoError(t, err)
	noKey("the Events", string(b))
	for _, gvr := range []schema.GroupVersionResource{v1alpha1.GitProvidersResource, v1alpha1.GitTargetsResource,
		v1alpha1.WatchRulesResource, v1alpha1.ClusterWatchRulesResource, v1alpha1.CommitRequestsResource} {
		list, err := dynamicFor(t, "admin").Resource(gvr).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		b, err := json.Marshal(list)
		require.NoError(t, err)
		noKey(gvr.Resource+"' status", string(b))
	}
	files, err := os.ReadDir(srv.dir)
	require.NoError(t, err)
	var names []string
	for _, f := range files {
		names = append(names, f.Name())
	}
	require.Equal(t, []string{"tmp"}, names, "kubescribe wrote files into its working directory or $HOME")
	tmp, err := os.ReadDir(filepath.Join(srv.dir, "tmp"))
	require.NoError(t, err)
	require.Empty(t, tmp, "kubescribe wrote files into $TMPDIR")
}

// startSelfManaged runs cmd/server with self-managed TLS as the ServiceAccount of kubeconfig:
// the admission listener on the address the CommitRequest webhook names (where the apiserver
// presents its admission client certificate), the others on free ports, a serving certificate
// of 30s checked every 2s, and the IP 127.0.0.1 in the certificate.
func startSelfManaged(t *testing.T, cp *controlplane.ControlPlane, kubeconfig string) *selfManagedServer {
	t.Helper()
	server := binary(t, "./cmd/server", "kubescribe-server")
	s := &selfManagedServer{dir: t.TempDir(), log: &testlog.Buffer{}, admission: cp.Admission.ListenAddr, done: make(chan error, 1)}
	require.NoError(t, os.Mkdir(filepath.Join(s.dir, "tmp"), 0o700))
	for _, addr := range []*string{&s.audit, &s.metrics, &s.ops} {
		var err error
		*addr, err = controlplane.FreeAddr()
		require.NoError(t, err)
	}
	s.cmd = exec.Command(server,
		"--kubeconfig="+kubeconfig, "--redis-addr="+cp.RedisAddr,
		"--audit-listen-address="+s.audit, "--ops-listen-address="+s.ops, "--metrics-listen-address="+s.metrics,
		"--admission-listen-address="+s.admission, "--admission-client-ca-file="+cp.Admission.ClientCAFile,
		"--audit-token-file="+cp.Audit.TokenFile,
		"--tls-self-managed-secret="+installedSANamespace+"/"+selfManagedSecret,
		"--tls-self-managed-webhooks="+authz.WebhookConfigurationName,
		"--tls-self-managed-extra-sans=127.0.0.1",
		"--tls-self-managed-validity=30s", "--tls-self-managed-check-interval=2s",
		"--shutdown-timeout=10s", "--log-format=json", "--log-level=debug")
	s.cmd.Dir = s.dir
	s.cmd.Env = append(os.Environ(), "HOME="+s.dir, "TMPDIR="+filepath.Join(s.dir, "tmp"))
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, controlplane.StartChild(s.cmd))
	go func() { s.done <- s.cmd.Wait() }()
	ok := poll(time.Minute, func() bool {
		select {
		case err := <-s.done:
			s.done <- err
			return true
		default:
		}
		resp, err := http.Get("http://" + s.ops + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	require.True(t, ok, "kubescribe not ready; its output:\n%s", s.log.String())
	select {
	case err := <-s.done:
		t.Fatalf("kubescribe exited: %v\n%s", err, s.log.String())
	default:
	}
	return s
}

// stop ends the process gracefully (SIGTERM), once.
func (s *selfManagedServer) stop(t *testing.T) {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		t.Errorf("kubescribe did not stop within 30s")
	}
	s.cmd = nil
}

// kubeconfigOf writes cfg's server, CA and bearer token into a kubeconfig file.
func kubeconfigOf(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "u"}
	kc.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// deleteSelfManagedRBAC deletes what deploy/components/self-managed-tls/rbac.yaml created.
func deleteSelfManagedRBAC(t *testing.T) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	ctx := context.Background()
	rbac := kube.RbacV1()
	for _, del := range []func() error{
		func() error {
			return rbac.Roles(installedSANamespace).Delete(ctx, "kubescribe-self-managed-tls", metav1.DeleteOptions{})
		},
		func() error {
			return rbac.RoleBindings(installedSANamespace).Delete(ctx, "kubescribe-self-managed-tls", metav1.DeleteOptions{})
		},
		func() error {
			return rbac.ClusterRoles().Delete(ctx, "kubescribe-self-managed-tls", metav1.DeleteOptions{})
		},
		func() error {
			return rbac.ClusterRoleBindings().Delete(ctx, "kubescribe-self-managed-tls", metav1.DeleteOptions{})
		},
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("cleanup: %v", err)
		}
	}
}
