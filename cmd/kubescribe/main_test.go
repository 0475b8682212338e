package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
)

func TestAuditPolicy(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"audit-policy"}, &out, &errOut))
	require.Contains(t, out.String(), "kind: Policy")
	require.Contains(t, out.String(), "level: RequestResponse")
}

func TestAuditWebhookConfig(t *testing.T) {
	dir := t.TempDir()
	ca := writeCA(t, dir)
	token := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(token, []byte("t0ken\n"), 0o600))

	var out, errOut bytes.Buffer
	code := run([]string{"audit-webhook-config", "--url", "https://kubescribe.kubescribe.svc:8443/audit/local", "--ca-file", ca, "--token-file", token}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	cfg, err := clientcmd.Load(out.Bytes())
	require.NoError(t, err)
	require.Equal(t, "https://kubescribe.kubescribe.svc:8443/audit/local", cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster].Server)
	require.Equal(t, "t0ken", cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].Token)

	// A token file of several clusters: the apiserver of route tenant-a presents tenant-a's.
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("# tokens\nlocal-t0ken\ntenant-t0ken tenant-a,tenant-b\n"), 0o600))
	out.Reset()
	code = run([]string{"audit-webhook-config", "--url", "https://k:8443/audit/tenant-b", "--ca-file", ca, "--token-file", tokens}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	cfg, err = clientcmd.Load(out.Bytes())
	require.NoError(t, err)
	require.Equal(t, "tenant-t0ken", cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].Token)

	tests := map[string][]string{
		"no credentials": {"audit-webhook-config", "--url", "https://k:8443/audit/local", "--ca-file", ca},
		"plain http":     {"audit-webhook-config", "--url", "http://k:8443/audit/local", "--ca-file", ca, "--token-file", token},
		"no CA":          {"audit-webhook-config", "--url", "https://k:8443/audit/local", "--token-file", token},
		"unknown":        {"frobnicate"},
		"no token bound": {"audit-webhook-config", "--url", "https://k:8443/audit/tenant-c", "--ca-file", ca, "--token-file", token},
	}
	for name, args := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.Equal(t, 1, run(args, &out, &errOut))
			require.NotEmpty(t, errOut.String())
			require.Empty(t, out.String())
		})
	}
}

// writeCA writes dir/ca.crt, a PEM block of type CERTIFICATE that the commands printing
// configurations copy as it is, and returns its path.
func writeCA(t *testing.T, dir string) string {
	t.Helper()
	ca := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o600))
	return ca
}
