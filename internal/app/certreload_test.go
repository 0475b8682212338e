package app

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/test/controlplane"
)

func writePair(t *testing.T, ca *controlplane.CA, cn, certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(cn, []string{"localhost"}, nil, false)
	require.NoError(t, err)
	// Write beside and rename, as a Secret volume update swaps files at once.
	require.NoError(t, os.WriteFile(certFile+".new", certPEM, 0o600))
	require.NoError(t, os.WriteFile(keyFile+".new", keyPEM, 0o600))
	require.NoError(t, os.Rename(certFile+".new", certFile))
	require.NoError(t, os.Rename(keyFile+".new", keyFile))
}

func servedCN(t *testing.T, r *certReloader) string {
	t.Helper()
	c, err := r.GetCertificate(&tls.ClientHelloInfo{})
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	require.NoError(t, err)
	return leaf.Subject.CommonName
}

// TestCertReloader: a changed pair is served from the next check on; a broken one is refused
// and the previous certificate kept.
func TestCertReloader(t *testing.T) {
	dir := t.TempDir()
	ca, err := controlplane.NewCA("test")
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePair(t, ca, "first", certFile, keyFile)

	_, err = newCertReloader(filepath.Join(dir, "missing.crt"), keyFile, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "reading the certificate")

	r, err := newCertReloader(certFile, keyFile, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	r.checkInterval = 0
	require.Equal(t, "first", servedCN(t, r))

	writePair(t, ca, "second", certFile, keyFile)
	require.Eventually(t, func() bool { return servedCN(t, r) == "second" }, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, os.WriteFile(certFile, []byte("not a certificate"), 0o600))
	require.Equal(t, "second", servedCN(t, r), "a broken update keeps the previous certificate")
}
