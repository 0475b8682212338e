package app

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// certReloader serves a certificate and key from files and reloads them when either file's
// content changes (following symlinks, as a mounted Secret is updated). It
// checks the files at most once per checkInterval, on a TLS handshake; a pair that fails to load
// (a half-written update) is logged once and the previous certificate kept.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	checkInterval     time.Duration

	mu        sync.Mutex
	cert      *tls.Certificate
	stamp     string // of the loaded files
	badStamp  string // of the files that last failed to load
	lastCheck time.Time
}

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, log: log, checkInterval: time.Second}
	stamp, err := r.fileStamp()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the certificate %s: %w", certFile, err)
	}
	r.cert, r.stamp, r.lastCheck = &cert, stamp, time.Now()
	return r, nil
}

func (r *certReloader) fileStamp() (string, error) {
	h := sha256.New()
	for _, f := range []string{r.certFile, r.keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("reading the certificate: %w", err)
		}
		h.Write(b)
		h.Write([]byte{0})
	}
	return string(h.Sum(nil)), nil
}

// GetCertificate is tls.Config.GetCertificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.lastCheck) >= r.checkInterval {
		r.lastCheck = time.Now()
		r.reloadLocked()
	}
	return r.cert, nil
}

func (r *certReloader) reloadLocked() {
	stamp, err := r.fileStamp()
	if err != nil || stamp == r.stamp || stamp == r.badStamp {
		if err != nil && r.badStamp != "missing" {
			r.badStamp = "missing"
			r.log.Warn("certificate files unreadable; serving the previous certificate", "cert", r.certFile, "err", err)
		}
		return
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.badStamp = stamp
		r.log.Warn("changed certificate does not load; serving the previous certificate", "cert", r.certFile, "err", err)
		return
	}
	r.cert, r.stamp, r.badStamp = &cert, stamp, ""
	r.log.Info("reloaded the serving certificate", "cert", r.certFile)
}

// loadClientCA reads the PEM bundle at path that verifies the client certificates of the
// listener named what ("audit", "admission").
func loadClientCA(what, path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the %s client CA: %w", what, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s client CA %s holds no PEM certificate", what, path)
	}
	return pool, nil
}
