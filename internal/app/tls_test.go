package app

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/test/controlplane"
)

// writePair writes a serving certificate for localhost of ca, with common name cn, as a Secret
// volume update does: beside the files, then renamed over them.
func writePair(t *testing.T, ca *controlplane.CA, cn, certFile, keyFile string) {
	t.Helper()
	certPEM, keyPEM, err := ca.Issue(cn, []string{"localhost"}, nil, false)
	require.NoError(t, err)
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM)
}

// newPair writes a serving certificate for localhost with common name cn, of a new CA, into a
// new folder.
func newPair(t *testing.T, cn string) (ca *controlplane.CA, certFile, keyFile string) {
	t.Helper()
	ca, err := controlplane.NewCA("test")
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePair(t, ca, cn, certFile, keyFile)
	return ca, certFile, keyFile
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path+".new", b, 0o600))
	require.NoError(t, os.Rename(path+".new", path))
}

// serveTLS serves cfg on a local port, answering each request with the common name of the
// client certificate it verified ("-" for none), until the test ends.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.VerifiedChains) == 0 {
			_, _ = io.WriteString(w, "-")
			return
		}
		_, _ = io.WriteString(w, r.TLS.VerifiedChains[0][0].Subject.CommonName)
	}), slog.New(slog.DiscardHandler))
	srv.TLSConfig = cfg
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// served is the common name of the certificate the server at addr presents, verified against
// roots for localhost.
func served(t *testing.T, addr string, roots *x509.CertPool) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "localhost"})
	require.NoError(t, err)
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
}

func poolOf(pem []byte) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(pem)
	return p
}

func startTLS(t *testing.T, l *listenerTLS) {
	t.Helper()
	l.Run()
	t.Cleanup(func() { require.NoError(t, l.Stop(t.Context())) })
}

// TestListenerTLSReloadsTheServingCertificate: a listener serves its certificate files' new
// content once they change, without a restart; a broken update is refused and the previous
// certificate kept. Two listeners sharing one pair both follow it, and the expiry metric
// follows what each serves.
func TestListenerTLSReloadsTheServingCertificate(t *testing.T) {
	ca, certFile, keyFile := newPair(t, "first")
	reg := prometheus.NewRegistry()
	l := newListenerTLS(slog.New(slog.DiscardHandler), reg)
	serving, err := l.servingFiles("audit serving certificate", certFile, keyFile)
	require.NoError(t, err)
	auditCfg, err := l.config("audit", serving, nil)
	require.NoError(t, err)
	metricsCfg, err := l.config("metrics", serving, nil)
	require.NoError(t, err)
	startTLS(t, l)
	audit, metrics := serveTLS(t, auditCfg), serveTLS(t, metricsCfg)
	roots := poolOf(ca.CertPEM)
	require.Equal(t, "first", served(t, audit, roots))
	require.Equal(t, "first", served(t, metrics, roots))
	first := testutil.ToFloat64(l.expiry.WithLabelValues("audit"))
	require.Greater(t, first, float64(time.Now().Unix()))

	time.Sleep(1100 * time.Millisecond) // a certificate of a later second, to see the metric move
	writePair(t, ca, "second", certFile, keyFile)
	for _, addr := range []string{audit, metrics} {
		require.Eventually(t, func() bool { return served(t, addr, roots) == "second" }, 30*time.Second, 20*time.Millisecond)
	}
	require.Greater(t, testutil.ToFloat64(l.expiry.WithLabelValues("metrics")), first)

	writeFile(t, certFile, []byte("not a certificate"))
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, "second", served(t, audit, roots), "a broken update keeps the previous certificate")
}

// TestListenerTLSReloadsTheClientCA: a listener with a client CA verifies client certificates
// against its file's current content: a new CA's client is accepted, the old one's no longer,
// and a connection without a certificate goes on (to present a token).
func TestListenerTLSReloadsTheClientCA(t *testing.T) {
	dir := t.TempDir()
	serverCA, err := controlplane.NewCA("server")
	require.NoError(t, err)
	oldCA, err := controlplane.NewCA("old clients")
	require.NoError(t, err)
	newCA, err := controlplane.NewCA("new clients")
	require.NoError(t, err)
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	writePair(t, serverCA, "server", certFile, keyFile)
	writeFile(t, caFile, oldCA.CertPEM)

	l := newListenerTLS(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	serving, err := l.servingFiles("admission serving certificate", certFile, keyFile)
	require.NoError(t, err)
	clientCA, err := l.clientCAFile("admission", caFile)
	require.NoError(t, err)
	cfg, err := l.config("admission", serving, clientCA)
	require.NoError(t, err)
	startTLS(t, l)
	addr := serveTLS(t, cfg)

	client := func(ca *controlplane.CA, cn string) func() (string, error) {
		tc := &tls.Config{RootCAs: poolOf(serverCA.CertPEM), ServerName: "localhost"}
		if ca != nil {
			certPEM, keyPEM, err := ca.Issue(cn, nil, nil, true)
			require.NoError(t, err)
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			require.NoError(t, err)
			tc.Certificates = []tls.Certificate{pair}
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
		return func() (string, error) {
			resp, err := c.Get("https://" + addr)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return string(b), err
		}
	}
	oldClient, newClient, anonymous := client(oldCA, "old"), client(newCA, "new"), client(nil, "")
	got, err := oldClient()
	require.NoError(t, err)
	require.Equal(t, "old", got)
	// The server names the CA it accepts; a Go client holding a certificate of another CA
	// presents none (and would fail the handshake if it did).
	got, err = newClient()
	require.NoError(t, err)
	require.Equal(t, "-", got, "a certificate of another CA is not accepted")

	writeFile(t, caFile, newCA.CertPEM)
	require.Eventually(t, func() bool { got, err := newClient(); return err == nil && got == "new" }, 30*time.Second, 20*time.Millisecond)
	got, err = oldClient()
	require.NoError(t, err)
	require.Equal(t, "-", got, "the replaced CA's clients are no longer accepted")
	got, err = anonymous()
	require.NoError(t, err)
	require.Equal(t, "-", got)
}

// TestListenerTLSRefusesWhatDoesNotLoad: a missing or broken file fails at start, naming the
// file and what it is for.
func TestListenerTLSRefusesWhatDoesNotLoad(t *testing.T) {
	dir := t.TempDir()
	ca, err := controlplane.NewCA("test")
	require.NoError(t, err)
	good, bad := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "bad.crt")
	writeFile(t, good, ca.CertPEM)
	writeFile(t, bad, []byte("not a certificate"))
	l := newListenerTLS(slog.New(slog.DiscardHandler), prometheus.NewRegistry())

	_, err = l.servingFiles("audit serving certificate", filepath.Join(dir, "missing.crt"), good)
	require.ErrorContains(t, err, "loading the audit serving certificate "+filepath.Join(dir, "missing.crt"))
	require.True(t, errors.Is(err, os.ErrNotExist))
	_, err = l.servingFiles("audit serving certificate", bad, bad)
	require.ErrorContains(t, err, "loading the audit serving certificate "+bad)
	_, err = l.clientCAFile("audit", filepath.Join(dir, "missing.crt"))
	require.ErrorContains(t, err, "loading the audit client CA")
	_, err = l.clientCAFile("admission", bad)
	require.ErrorContains(t, err, "loading the admission client CA "+bad)
	p, err := l.clientCAFile("audit", good)
	require.NoError(t, err)
	require.Equal(t, ca.CertPEM, p.CurrentCABundleContent())
}

// TestListenerTLSOffersHTTP2: the configuration a connection gets from the certificate
// controller still offers HTTP/2, as the server's own would.
func TestListenerTLSOffersHTTP2(t *testing.T) {
	ca, certFile, keyFile := newPair(t, "h2")
	l := newListenerTLS(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	serving, err := l.servingFiles("audit serving certificate", certFile, keyFile)
	require.NoError(t, err)
	cfg, err := l.config("audit", serving, nil)
	require.NoError(t, err)
	addr := serveTLS(t, cfg)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: poolOf(ca.CertPEM), ServerName: "localhost"}, ForceAttemptHTTP2: true}}
	resp, err := c.Get("https://" + addr)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 2, resp.ProtoMajor)
}
