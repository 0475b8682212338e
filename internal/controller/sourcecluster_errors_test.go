package controller

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// marker is what a hostile server writes into every error body: it must never reach a
// condition.
const marker = "HOSTILE-MARKER-7f3a"

// hostileAPIServer answers every request with the answer mode picks: a Status whose message
// carries the marker, or a body that is not a Status at all.
func hostileAPIServer(t *testing.T) (*httptest.Server, *atomic.Value) {
	t.Helper()
	var mode atomic.Value
	mode.Store("401")
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := func(code int, reason string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d,"reason":%q,"message":"%s: <script>alert(1)</script>"}`, code, reason, marker)
		}
		switch mode.Load().(string) {
		case "401":
			status(http.StatusUnauthorized, "Unauthorized")
		case "403":
			status(http.StatusForbidden, "Forbidden")
		case "500":
			status(http.StatusInternalServerError, marker+"-reason")
		case "text":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, marker+" upstream said no")
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &mode
}

func kubeconfigTrusting(srv *httptest.Server, token string) string {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return strings.Replace(kubeconfigFor(srv.URL, token), "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==", base64.StdEncoding.EncodeToString(ca), 1)
}

// TestRemoteErrorTextIsNotQuoted: whatever a remote server answers (a Status message, its
// reason, a plain-text body, an unreadable body), the GitTarget's conditions say only the kind
// of failure, never the server's words.
func TestRemoteErrorTextIsNotQuoted(t *testing.T) {
	srv, mode := hostileAPIServer(t)
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), remoteTarget("a", "edge-kc", "edge")},
		secrets: []runtime.Object{credsSecret(),
			newSecret("edge-kc", map[string]string{"value": kubeconfigTrusting(srv, "tok")})},
		sourceClients: NewSourceClients,
	})
	require.NoError(t, f.syncProvider("git"))
	for _, tc := range []struct{ mode, reason, says string }{
		{"401", v1alpha1.ReasonUnauthorized, "(401)"},
		{"403", v1alpha1.ReasonForbidden, "(403)"},
		{"500", v1alpha1.ReasonUnreachable, "HTTP 500 (internal server error)"},
		{"text", v1alpha1.ReasonUnreachable, "HTTP 502 (bad gateway)"},
	} {
		mode.Store(tc.mode)
		var got v1alpha1.GitTarget
		require.Eventually(t, func() bool {
			require.NoError(t, f.syncTarget("a"))
			got = f.target("a")
			c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionSourceClusterReachable)
			return c != nil && c.Reason == tc.reason && strings.Contains(c.Message, tc.says)
		}, 10*time.Second, 5*time.Millisecond, "mode %s: %+v", tc.mode, got.Status.Conditions)
		for _, c := range got.Status.Conditions {
			require.NotContains(t, c.Message, marker, "mode %s: condition %s", tc.mode, c.Type)
			require.NotContains(t, c.Message, "<script>", "mode %s", tc.mode)
		}
	}
	require.Contains(t, f.logs.String(), "a remote source cluster's API discovery failed", "the server's words go to the log")
}

// TestRemoteTLSErrorsAreClassified: a server whose certificate the kubeconfig does not trust,
// or that does not speak TLS, is described by the class of the failure.
func TestRemoteTLSErrorsAreClassified(t *testing.T) {
	srv, _ := hostileAPIServer(t)
	probe := func(kubeconfig string) error {
		cfg, ref := restConfigFromKubeconfig([]byte(kubeconfig), false, false)
		require.Nil(t, ref)
		clients, err := NewSourceClients(cfg)
		require.NoError(t, err)
		return clients.Probe(context.Background())
	}
	untrusted := strings.Replace(kubeconfigTrusting(srv, "tok"), base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})),
		base64.StdEncoding.EncodeToString(otherCA(t)), 1)
	require.Equal(t, "certificate signed by unknown authority", remoteError(probe(untrusted)))

	plain := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(plain.Close)
	notTLS := strings.Replace(kubeconfigTrusting(srv, "tok"), srv.URL, strings.Replace(plain.URL, "http://", "https://", 1), 1)
	require.Equal(t, "the server does not speak TLS", remoteError(probe(notTLS)))

	// httptest's certificate names 127.0.0.1, ::1 and example.com only.
	wrongName := strings.Replace(kubeconfigTrusting(srv, "tok"), "server: ", "tls-server-name: edge.example\n    server: ", 1)
	require.Equal(t, "the server's certificate is not valid for its name", remoteError(probe(wrongName)))
}

// otherCA is the PEM certificate of a CA that signed nothing the tests serve.
func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestRemoteErrorClasses(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	hostname := x509.HostnameError{Certificate: &x509.Certificate{}, Host: "edge"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{apierrors.NewUnauthorized(marker), "unauthorized (401)"},
		{apierrors.NewForbidden(gr, "x", errors.New(marker)), "forbidden (403)"},
		{apierrors.NewNotFound(gr, marker), "not found (404)"},
		{apierrors.NewTooManyRequests(marker, 1), "too many requests (429)"},
		{apierrors.NewServiceUnavailable(marker), "service unavailable (503)"},
		{apierrors.NewGenericServerResponse(418, "get", gr, "x", marker, 0, true), "HTTP 418 (i'm a teapot)"},
		{apierrors.NewGenericServerResponse(599, "get", gr, "x", marker, 0, true), "HTTP status 599"},
		{fmt.Errorf("discovering: %w", &discovery.ErrGroupDiscoveryFailed{Groups: map[schema.GroupVersion]error{
			{Group: "b", Version: "v1"}: errors.New(marker),
			{Group: "a", Version: "v1"}: apierrors.NewForbidden(gr, "", errors.New(marker)),
		}}), "discovery of 2 API group versions failed, the first: forbidden (403)"},
		{&url.Error{Op: "Get", URL: "https://" + marker, Err: x509.UnknownAuthorityError{}}, "certificate signed by unknown authority"},
		{&url.Error{Op: "Get", URL: "https://x", Err: hostname}, "the server's certificate is not valid for its name"},
		{&url.Error{Op: "Get", URL: "https://x", Err: x509.CertificateInvalidError{Reason: x509.Expired, Detail: marker}}, "the server's certificate is not valid (expired, not yet valid, or not for serving)"},
		{&url.Error{Op: "Get", URL: "https://x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, "connection refused"},
		{&url.Error{Op: "Get", URL: "https://x", Err: &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}}, "connection reset"},
		{&url.Error{Op: "Get", URL: "https://x", Err: &net.DNSError{Err: marker, Name: "edge", IsNotFound: true}}, "the server's host name does not resolve"},
		{&url.Error{Op: "Get", URL: "https://x", Err: &net.DNSError{Err: marker, Name: "edge", IsTemporary: true}}, "the host name lookup failed"},
		{&url.Error{Op: "Get", URL: "https://x", Err: context.DeadlineExceeded}, "timed out"},
		{&url.Error{Op: "Get", URL: "https://x", Err: io.EOF}, "the server closed the connection"},
		{&url.Error{Op: "Get", URL: "https://x", Err: errors.New(marker)}, "the request failed"},
		{errors.New(marker), "the server's answer cannot be used"},
	} {
		got := remoteError(tc.err)
		require.Equal(t, tc.want, got, "%v", tc.err)
		require.NotContains(t, got, marker)
	}
}

// FuzzRestConfigFromKubeconfig: whatever a kubeconfig Secret holds, the check never panics,
// and a config it accepts runs no plugin, skips no TLS verification, reads no file, uses no
// proxy and talks https only (with neither override set).
func FuzzRestConfigFromKubeconfig(f *testing.F) {
	const server = "https://edge.example:6443"
	for _, seed := range []string{
		kubeconfigFor(server, "tok"),
		kubeconfigFor(server, "", "    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, interactiveMode: Never}\n"),
		kubeconfigFor(server, "", "    auth-provider: {name: oidc}\n"),
		kubeconfigFor(server, "tok", "    tokenFile: /var/run/token\n"),
		kubeconfigFor(server, "", "    client-certificate: /etc/c.crt\n    client-key: /etc/c.key\n"),
		kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", insecure-skip-tls-verify: true}\n"),
		kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", proxy-url: \"http://proxy:3128\"}\n"),
		kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", certificate-authority: /etc/ca.crt}\n"),
		kubeconfigFor("http://edge.example:8080", "tok"),
		kubeconfigFor("HTTPS://edge.example", "tok"),
		kubeconfigFor("unix:///var/run/k.sock", "tok"),
		`{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":"https://a","proxy-url":"socks5://p"}}],"users":[{"name":"u","user":{"token":"t"}}],"contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}]}`,
		"apiVersion: v1\nkind: Config\ncontexts:\n- name: only\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {server: \"https://a\"}\n",
		"", "{", "null", "apiVersion: v1\nkind: Config\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, kubeconfig []byte) {
		cfg, ref := restConfigFromKubeconfig(kubeconfig, false, false)
		if ref != nil {
			require.Nil(t, cfg)
			require.NotEmpty(t, ref.reason)
			return
		}
		require.NotNil(t, cfg)
		require.Nil(t, cfg.ExecProvider, "an exec plugin")
		require.Nil(t, cfg.AuthProvider, "an auth provider")
		require.False(t, cfg.Insecure, "insecure-skip-tls-verify")
		require.Empty(t, cfg.CAFile)
		require.Empty(t, cfg.CertFile)
		require.Empty(t, cfg.KeyFile)
		require.Empty(t, cfg.BearerTokenFile)
		require.Nil(t, cfg.Proxy, "a proxy")
		u, err := url.Parse(cfg.Host)
		require.NoError(t, err)
		require.Equal(t, "https", strings.ToLower(u.Scheme), "server %q", cfg.Host)
	})
}

// The metadata watch of Secrets starts only when kubescribe may list and watch them
// cluster-wide (the default install may not: the refused informer would log an error at every
// retry); when the review fails, it starts as before.
func TestSecretWatchAllowed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allowed map[string]bool
		err     error
		want    bool
	}{
		{"granted", map[string]bool{"list": true, "watch": true}, nil, true},
		{"default install", map[string]bool{}, nil, false},
		{"list only", map[string]bool{"list": true}, nil, false},
		{"review failed", nil, errors.New("connection refused"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := kubefake.NewClientset()
			var asked []string
			kube.PrependReactor("create", "selfsubjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
				review := a.(clienttesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
				attrs := review.Spec.ResourceAttributes
				asked = append(asked, attrs.Verb+" "+attrs.Resource+" in "+attrs.Namespace+"*")
				if tc.err != nil {
					return true, nil, tc.err
				}
				review.Status.Allowed = tc.allowed[attrs.Verb]
				return true, review, nil
			})
			c := &Controller{opts: Options{Kube: kube}, log: slog.New(slog.DiscardHandler)}
			if got := c.secretWatchAllowed(context.Background()); got != tc.want {
				t.Fatalf("allowed %v, want %v (asked %v)", got, tc.want, asked)
			}
			if len(asked) == 0 || asked[0] != "list secrets in *" {
				t.Fatalf("asked %v, want list of secrets cluster-wide first", asked)
			}
		})
	}
}
