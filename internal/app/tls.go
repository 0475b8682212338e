package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/util/cert"
)

// listenerTLS serves the TLS of the audit, admission and metrics listeners through
// k8s.io/apiserver's DynamicServingCertificateController, as the kube-apiserver serves its own:
// one controller per listener, fed by content providers (a serving certificate and key, and for
// the audit and admission listeners a client CA bundle). A provider reading files notices a
// change through fsnotify (a mounted Secret's update replaces the files' target) and, at the
// latest, a minute later; the self-managed provider (internal/selftls) when it stores a new
// certificate. A change that does not load (a half-written pair, a file without a
// certificate) keeps the previous content. New connections get the new content; open ones
// keep theirs.
type listenerTLS struct {
	log *slog.Logger
	// runners are the file providers, which watch their files once Run starts them.
	runners     []dynamiccertificates.ControllerRunner
	controllers []*dynamiccertificates.DynamicServingCertificateController
	expiry      *prometheus.GaugeVec
	// clientExpiry is the expiry of each client certificate kubescribe presents (Redis').
	clientExpiry *prometheus.GaugeVec

	mu   sync.Mutex
	stop context.CancelFunc
	done sync.WaitGroup
}

func newListenerTLS(log *slog.Logger, reg prometheus.Registerer) *listenerTLS {
	f := promauto.With(reg)
	return &listenerTLS{log: log, expiry: f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kubescribe_tls_serving_certificate_expiry_timestamp_seconds",
		Help: "When the serving certificate each listener (audit, admission, metrics) serves expires, as a Unix time: it changes when a renewed certificate is loaded.",
	}, []string{"listener"}), clientExpiry: f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kubescribe_tls_client_certificate_expiry_timestamp_seconds",
		Help: "When the client certificate kubescribe presents to each server (redis) expires, as a Unix time: it changes when a renewed certificate is loaded.",
	}, []string{"client"})}
}

// servingFiles is a provider of the certificate and key in certFile and keyFile, reloaded when
// they change. what names them in errors ("audit serving certificate").
func (t *listenerTLS) servingFiles(what, certFile, keyFile string) (dynamiccertificates.CertKeyContentProvider, error) {
	p, err := dynamiccertificates.NewDynamicServingContentFromFiles(what, certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the %s %s: %w", what, certFile, err)
	}
	t.runners = append(t.runners, p)
	return p, nil
}

// clientCAFile is a provider of the CA bundle in path, reloaded when it changes; it verifies the
// client certificates of the listener named what ("audit", "admission").
func (t *listenerTLS) clientCAFile(what, path string) (dynamiccertificates.CAContentProvider, error) {
	p, err := dynamiccertificates.NewDynamicCAContentFromFile(what+" client CA", path)
	if err != nil {
		return nil, fmt.Errorf("loading the %s client CA %s: %w", what, path, err)
	}
	l := &caLog{log: t.log.With("listener", what), content: p, msg: "client CA loaded"}
	p.AddListener(l)
	l.Enqueue()
	t.runners = append(t.runners, p)
	return p, nil
}

// config is the tls.Config of the listener named name: the certificate of serving and, when
// clientCA is not nil, client certificates verified against it when given
// (tls.VerifyClientCertIfGiven: a certificate that does not verify fails the handshake; a
// connection without one goes on and must present a token). Its first content is loaded here.
func (t *listenerTLS) config(name string, serving dynamiccertificates.CertKeyContentProvider, clientCA dynamiccertificates.CAContentProvider) (*tls.Config, error) {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The configuration a connection gets is this one's copy, not the server's: offer
		// HTTP/2 as http.Server.ServeTLS would.
		NextProtos: []string{"h2", "http/1.1"},
	}
	if clientCA != nil {
		base.ClientAuth = tls.VerifyClientCertIfGiven
	}
	c := dynamiccertificates.NewDynamicServingCertificateController(base, clientCA, serving, nil, nil)
	l := &certLog{log: t.log.With("listener", name), content: serving, msg: "serving certificate loaded", expiry: t.expiry.WithLabelValues(name)}
	serving.AddListener(l)
	serving.AddListener(c)
	if clientCA != nil {
		clientCA.AddListener(c)
	}
	l.Enqueue()
	if err := c.RunOnce(); err != nil {
		return nil, fmt.Errorf("%s listener TLS: %w", name, err)
	}
	t.controllers = append(t.controllers, c)
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: c.GetConfigForClient}, nil
}

// Run starts watching the files and serving what changes, until Stop.
func (t *listenerTLS) Run() {
	t.mu.Lock()
	defer t.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	t.stop = cancel
	for _, r := range t.runners {
		t.done.Go(func() { r.Run(ctx, 1) })
	}
	for _, c := range t.controllers {
		t.done.Go(func() { c.Run(1, ctx.Done()) })
	}
}

// Stop ends what Run started and waits for it.
func (t *listenerTLS) Stop(context.Context) error {
	t.mu.Lock()
	if t.stop != nil {
		t.stop()
	}
	t.mu.Unlock()
	t.done.Wait()
	return nil
}

// certLog logs each certificate a listener serves or a client presents when it is loaded (never
// its key), with msg, and exports its expiry.
type certLog struct {
	log     *slog.Logger
	content dynamiccertificates.CertKeyContentProvider
	msg     string
	expiry  prometheus.Gauge

	mu   sync.Mutex
	last []byte
}

func (l *certLog) Enqueue() {
	certPEM, _ := l.content.CurrentCertKeyContent()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(certPEM) == 0 || bytes.Equal(certPEM, l.last) {
		return
	}
	l.last = bytes.Clone(certPEM)
	certs, err := cert.ParseCertsPEM(certPEM)
	if err != nil {
		return // the controller refuses it, and says why
	}
	leaf := certs[0]
	l.expiry.Set(float64(leaf.NotAfter.Unix()))
	l.log.Info(l.msg, "component", "tls", "source", l.content.Name(), "subject", leaf.Subject.String(),
		"dnsNames", leaf.DNSNames, "ips", leaf.IPAddresses, "serial", leaf.SerialNumber.Text(16), "issuer", leaf.Issuer.String(),
		"notBefore", leaf.NotBefore, "notAfter", leaf.NotAfter)
}

// caLog logs each CA bundle loaded (a listener's client CA, Redis' CA), with msg.
type caLog struct {
	log     *slog.Logger
	content dynamiccertificates.CAContentProvider
	msg     string
}

func (l *caLog) Enqueue() {
	certs, err := cert.ParseCertsPEM(l.content.CurrentCABundleContent())
	if err != nil {
		return
	}
	subjects := make([]string, 0, len(certs))
	for _, c := range certs {
		subjects = append(subjects, subjectAndExpiry(c))
	}
	l.log.Info(l.msg, "component", "tls", "source", l.content.Name(), "certificates", subjects)
}

func subjectAndExpiry(c *x509.Certificate) string {
	return c.Subject.String() + " (until " + c.NotAfter.UTC().Format("2006-01-02T15:04:05Z") + ")"
}
