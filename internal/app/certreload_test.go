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

// TestLoadClientCA: a CA bundle file that is missing or holds no certificate is refused with
// the listener's name and the file; a real one becomes the pool.
func TestLoadClientCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := controlplane.NewCA("test")
	require.NoError(t, err)
	good, bad := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "bad.crt")
	require.NoError(t, os.WriteFile(good, ca.CertPEM, 0o600))
	require.NoError(t, os.WriteFile(bad, []byte("not a certificate"), 0o600))

	pool, err := loadClientCA("audit", good)
	require.NoError(t, err)
	require.NotNil(t, pool)
	_, err = loadClientCA("audit", filepath.Join(dir, "missing.crt"))
	require.ErrorContains(t, err, "reading the audit client CA")
	_, err = loadClientCA("admission", bad)
	require.ErrorContains(t, err, "admission client CA "+bad+" holds no PEM certificate")
}
