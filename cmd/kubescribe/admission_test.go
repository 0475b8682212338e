package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

func TestAdmissionWebhookConfig(t *testing.T) {
	dir := t.TempDir()
	ca := writeCA(t, dir)
	pem, err := os.ReadFile(ca)
	require.NoError(t, err)

	print := func(args ...string) *admissionregistrationv1.ValidatingWebhookConfiguration {
		t.Helper()
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(append([]string{"admission-webhook-config", "--ca-file", ca}, args...), &out, &errOut), errOut.String())
		var c admissionregistrationv1.ValidatingWebhookConfiguration
		require.NoError(t, yaml.UnmarshalStrict(out.Bytes(), &c))
		return &c
	}
	c := print("--url", "https://10.0.0.5:9443")
	w := c.Webhooks[0]
	require.Equal(t, "https://10.0.0.5:9443/validate/commitrequests", *w.ClientConfig.URL)
	require.Equal(t, pem, w.ClientConfig.CABundle)
	require.Equal(t, admissionregistrationv1.Ignore, *w.FailurePolicy)

	require.Len(t, c.Webhooks, 3)
	require.Equal(t, admissionregistrationv1.Fail, *c.Webhooks[1].FailurePolicy, "asserted authors fail closed")
	require.Equal(t, "https://10.0.0.5:9443/validate/secretrefs", *c.Webhooks[2].ClientConfig.URL, "GitProviders and GitTargets")
	require.Equal(t, "has(object.spec) && has(object.spec.author)", c.Webhooks[1].MatchConditions[0].Expression)

	c = print("--service", "kubescribe/kubescribe")
	svc := c.Webhooks[0].ClientConfig.Service
	require.Equal(t, "kubescribe", svc.Namespace)
	require.Equal(t, int32(9443), *svc.Port)
	require.Equal(t, "/validate/commitrequests", *svc.Path)

	// A managed cluster's apiserver authenticates with a token in the path: the CommitRequest
	// webhook's own, never the secret of the file (which the attribution webhook accepts as a
	// bearer token), nor the attribution webhook's token.
	tokens := filepath.Join(dir, "admission-token")
	require.NoError(t, os.WriteFile(tokens, []byte("tenant-tok tenant-a\nlocal-tok\n"), 0o600))
	own := reviewhttp.WebhookToken([]byte("local-tok"), reviewhttp.WebhookCommitRequests)
	require.NotEqual(t, own, reviewhttp.WebhookToken([]byte("local-tok"), reviewhttp.WebhookAttribution))
	c = print("--service", "kubescribe/kubescribe", "--token-file", tokens)
	for _, w := range c.Webhooks[:2] {
		require.Equal(t, "/validate/commitrequests/"+own, *w.ClientConfig.Service.Path)
	}
	require.Equal(t, "/validate/secretrefs/"+own, *c.Webhooks[2].ClientConfig.Service.Path)
	c = print("--url", "https://10.0.0.5:9443", "--token-file", tokens)
	require.Equal(t, "https://10.0.0.5:9443/validate/commitrequests/"+own, *c.Webhooks[1].ClientConfig.URL)

	unsafe := filepath.Join(dir, "unsafe-token")
	require.NoError(t, os.WriteFile(unsafe, []byte("secret/part\n"), 0o600))
	tenantOnly := filepath.Join(dir, "tenant-token")
	require.NoError(t, os.WriteFile(tenantOnly, []byte("secret-part tenant-a\n"), 0o600))
	for name, tc := range map[string]struct{ file, want string }{
		"token not URL-safe": {unsafe, "line 1: a token may hold only letters"},
		"no token for route": {tenantOnly, `no token is bound to route "local"`},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.Equal(t, 1, run([]string{"admission-webhook-config", "--ca-file", ca, "--url", "https://h", "--token-file", tc.file}, &out, &errOut))
			require.Contains(t, errOut.String(), tc.want)
			require.NotContains(t, errOut.String(), "secret")
		})
	}

	for name, args := range map[string][]string{
		"neither":    {"--ca-file", ca},
		"both":       {"--ca-file", ca, "--url", "https://h", "--service", "a/b"},
		"plain http": {"--ca-file", ca, "--url", "http://h:9443"},
		"no CA":      {"--url", "https://h:9443"},
		"bad port":   {"--ca-file", ca, "--service", "a/b:x"},
		"no ns":      {"--ca-file", ca, "--service", "b"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.Equal(t, 1, run(append([]string{"admission-webhook-config"}, args...), &out, &errOut))
			require.Empty(t, out.String())
			require.Contains(t, errOut.String(), "kubescribe:")
		})
	}
}

// TestAdmissionClientConfig: the apiserver's AdmissionConfiguration kubeconfig names the user
// after the webhook's host and port and carries the token bound to --cluster-name, or a client
// certificate.
func TestAdmissionClientConfig(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("tenant-token tenant-a\nlocal-token\n"), 0o600))
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"admission-client-config", "--token-file", tokens}, &out, &errOut), errOut.String())
	cfg, err := clientcmd.Load(out.Bytes())
	require.NoError(t, err)
	require.Len(t, cfg.AuthInfos, 1)
	require.Equal(t, "local-token", cfg.AuthInfos["kubescribe-admission.kubescribe.svc:9443"].Token)

	cert, key := filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key")
	require.NoError(t, os.WriteFile(cert, []byte("cert"), 0o600))
	require.NoError(t, os.WriteFile(key, []byte("key"), 0o600))
	out.Reset()
	require.Equal(t, 0, run([]string{"admission-client-config", "--host", "10.0.0.5:9443", "--client-cert", cert, "--client-key", key}, &out, &errOut), errOut.String())
	cfg, err = clientcmd.Load(out.Bytes())
	require.NoError(t, err)
	require.Equal(t, []byte("cert"), cfg.AuthInfos["10.0.0.5:9443"].ClientCertificateData)

	tenantOnly := filepath.Join(dir, "routed")
	require.NoError(t, os.WriteFile(tenantOnly, []byte("s3cr3t-value tenant-a\n"), 0o600))
	for name, args := range map[string][]string{
		"neither":  {},
		"both":     {"--token-file", tokens, "--client-cert", cert, "--client-key", key},
		"no local": {"--token-file", tenantOnly},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.Equal(t, 1, run(append([]string{"admission-client-config"}, args...), &out, &errOut))
			require.Empty(t, out.String())
			require.NotContains(t, errOut.String(), "s3cr3t")
		})
	}
}
