package selftls

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/utils/clock"
)

// FieldManager is the field manager of kubescribe's writes to the Secret and to the webhook
// configurations' caBundle.
const FieldManager = "kubescribe-tls"

// DefaultCheckInterval is how often the Secret and the webhook configurations are read again
// when nothing is due sooner.
const DefaultCheckInterval = time.Minute

// maxConflicts bounds how often one sync reads the Secret again after another replica wrote it
// first.
const maxConflicts = 5

// Options configure a Manager.
type Options struct {
	// Client reads and writes the Secret and the webhook configurations.
	Client kubernetes.Interface
	// Namespace and Name are the Secret's.
	Namespace, Name string
	Policy          Policy
	// Webhooks are the ValidatingWebhookConfigurations whose every webhook's caBundle is kept
	// equal to the CA bundle.
	Webhooks []string
	// CheckInterval is how often the Secret and the webhooks are read again when nothing is
	// due sooner; 0 is DefaultCheckInterval.
	CheckInterval time.Duration
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Logger defaults to slog.Default(); Registerer receives the metrics (none when nil).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// content is what the Manager serves.
type content struct {
	cert, key, bundle []byte
	state             State
}

// Manager keeps the Secret's certificates current and serves them: it is a
// dynamiccertificates.CertKeyContentProvider, whose listeners are told when the serving
// certificate changes.
type Manager struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics

	mu        sync.Mutex
	current   *content
	listeners []dynamiccertificates.Listener
	// absent are the webhook configurations found missing, logged once.
	absent map[string]bool
}

var _ dynamiccertificates.CertKeyContentProvider = (*Manager)(nil)

// New checks opts; the Manager serves nothing until Start.
func New(opts Options) (*Manager, error) {
	if opts.Client == nil || opts.Namespace == "" || opts.Name == "" {
		return nil, errors.New("selftls: a client, and the Secret's namespace and name, are required")
	}
	if err := opts.Policy.Validate(); err != nil {
		return nil, err
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = DefaultCheckInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Manager{opts: opts, log: opts.Logger.With("secret", opts.Namespace+"/"+opts.Name), metrics: newMetrics(opts.Registerer),
		absent: map[string]bool{}}, nil
}

// Name names the content in the certificate controller's logs.
func (m *Manager) Name() string { return "self-managed Secret " + m.opts.Namespace + "/" + m.opts.Name }

// AddListener is told when the serving certificate changes.
func (m *Manager) AddListener(l dynamiccertificates.Listener) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listeners = append(m.listeners, l)
}

// CurrentCertKeyContent is the serving certificate and key in force (nil before Start).
func (m *Manager) CurrentCertKeyContent() ([]byte, []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.current == nil {
		return nil, nil
	}
	return m.current.cert, m.current.key
}

// CABundle is the CA bundle in force (nil before Start): what the apiserver verifies
// kubescribe's serving certificate with.
func (m *Manager) CABundle() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.current == nil {
		return nil
	}
	return m.current.bundle
}

// Start brings the Secret up to date (creating it when it does not exist) and serves its
// certificate, trying again for as long as ctx lasts unless the apiserver refuses for good
// (RBAC, a Secret of another type); then it sets the webhook configurations' caBundle once,
// whose failure is only logged (Run tries again).
func (m *Manager) Start(ctx context.Context) error {
	delay := 500 * time.Millisecond
	for {
		_, err := m.syncSecret(ctx)
		if err == nil {
			break
		}
		if permanent(err) {
			return err
		}
		m.log.Warn("self-managed TLS: cannot bring the Secret up to date yet; retrying", "component", "tls", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %v)", err, context.Cause(ctx))
		case <-m.opts.Clock.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
	if err := m.syncWebhooks(ctx); err != nil {
		m.log.Error("self-managed TLS: cannot set the webhook configurations' caBundle yet; retrying", "component", "tls", "err", err)
	}
	return nil
}

// permanent are errors that retrying does not cure.
func permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err) || errors.Is(err, errForeignSecret)
}

// Run keeps the Secret and the webhook configurations current until ctx ends: at each renewal,
// introduction, promotion or expiry the Secret's content calls for, and every CheckInterval
// besides (another replica may have renewed it, someone may have removed a key or changed a
// caBundle). A failed step is retried sooner, with backoff; meanwhile the certificate in
// memory is served.
func (m *Manager) Run(ctx context.Context) {
	failures := 0
	for {
		wait := m.opts.CheckInterval
		next, err := m.syncSecret(ctx)
		if err == nil {
			err = m.syncWebhooks(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			wait = min(wait, time.Second<<min(failures, 6))
			m.log.Error("self-managed TLS: sync failed; serving the certificate in memory, retrying", "component", "tls", "err", err, "in", wait)
		} else {
			failures = 0
		}
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(m.opts.Clock.Now()), time.Second))
		}
		select {
		case <-ctx.Done():
			return
		case <-m.opts.Clock.After(wait):
		}
	}
}

// errForeignSecret: the Secret exists and is not kubescribe's.
var errForeignSecret = errors.New("exists and is not a self-managed TLS Secret")

// syncSecret reads the Secret, writes what its plan changes (creating it when it does not
// exist), serves its content and returns when it is due next. When another replica wrote it
// first (an AlreadyExists or a Conflict), it reads it again and plans anew: several replicas
// starting at once agree on one CA.
func (m *Manager) syncSecret(ctx context.Context) (time.Time, error) {
	secrets := m.opts.Client.CoreV1().Secrets(m.opts.Namespace)
	for attempt := 1; ; attempt++ {
		s, err := secrets.Get(ctx, m.opts.Name, metav1.GetOptions{})
		exists := err == nil
		if err != nil && !apierrors.IsNotFound(err) {
			m.metrics.errors.WithLabelValues("secret").Inc()
			return time.Time{}, fmt.Errorf("reading the Secret %s/%s: %w", m.opts.Namespace, m.opts.Name, err)
		}
		if exists && s.Type != SecretType {
			m.metrics.errors.WithLabelValues("secret").Inc()
			return time.Time{}, fmt.Errorf("the Secret %s/%s %w (type %q, not %q): kubescribe does not overwrite it; name another Secret",
				m.opts.Namespace, m.opts.Name, errForeignSecret, s.Type, SecretType)
		}
		var data map[string][]byte
		if exists {
			data = s.Data
		}
		out, state, did, next, err := m.opts.Policy.Plan(m.opts.Clock.Now(), data)
		if err != nil {
			return time.Time{}, err
		}
		switch {
		case !exists:
			_, err = secrets.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: m.opts.Name, Namespace: m.opts.Namespace,
					Labels: map[string]string{"app.kubernetes.io/name": "kubescribe", "app.kubernetes.io/managed-by": "kubescribe"}},
				Type: SecretType, Data: out,
			}, metav1.CreateOptions{FieldManager: FieldManager})
		case !sameData(out, data):
			s = s.DeepCopy()
			s.Data = out
			_, err = secrets.Update(ctx, s, metav1.UpdateOptions{FieldManager: FieldManager})
		}
		if (apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err)) && attempt < maxConflicts {
			m.log.Debug("self-managed TLS: another replica wrote the Secret first; reading it again", "component", "tls")
			continue
		}
		if err != nil {
			m.metrics.errors.WithLabelValues("secret").Inc()
			return time.Time{}, fmt.Errorf("writing the Secret %s/%s: %w", m.opts.Namespace, m.opts.Name, err)
		}
		m.report(did, state, !exists)
		m.serve(out, state)
		return next, nil
	}
}

// report logs and counts what a written plan changed.
func (m *Manager) report(did Changes, s State, created bool) {
	log := m.log.With("component", "tls")
	if created {
		log.Info("self-managed TLS Secret created")
	}
	if did.CA {
		m.metrics.issued.WithLabelValues("ca").Inc()
		log.Warn("self-managed TLS: minted a new CA; the apiserver's audit webhook kubeconfig must be given the new CA bundle "+
			"(kubescribe audit-webhook-config --ca-from-secret); webhook configurations kubescribe keeps in step get it now",
			"ca", s.Signer.Subject.CommonName, "notAfter", s.Signer.NotAfter)
	}
	if did.NextCA {
		m.metrics.issued.WithLabelValues("ca").Inc()
		log.Warn("self-managed TLS: introduced the next CA into the CA bundle; regenerate the apiserver's audit webhook kubeconfig "+
			"(kubescribe audit-webhook-config --ca-from-secret) before it signs", "ca", s.Next.Subject.CommonName,
			"signsFrom", m.opts.Policy.promoteAt(s.Signer), "notAfter", s.Next.NotAfter)
	}
	if did.Promoted {
		log.Info("self-managed TLS: the next CA signs from now on", "ca", s.Signer.Subject.CommonName, "notAfter", s.Signer.NotAfter)
	}
	if did.Serving {
		m.metrics.issued.WithLabelValues("serving").Inc()
		log.Info("self-managed TLS: issued a serving certificate", "serial", s.Serving.SerialNumber.Text(16),
			"dnsNames", s.Serving.DNSNames, "ips", s.Serving.IPAddresses, "notAfter", s.Serving.NotAfter, "renewAt", RenewAt(s.Serving),
			"issuer", s.Signer.Subject.CommonName)
	}
}

// serve makes data's certificate the one served, and tells the listeners when it changed.
func (m *Manager) serve(data map[string][]byte, s State) {
	m.metrics.caExpiry.Set(float64(s.Signer.NotAfter.Unix()))
	m.mu.Lock()
	old := m.current
	m.current = &content{cert: data[KeyCert], key: data[KeyKey], bundle: data[KeyCABundle], state: s}
	changed := old == nil || !bytes.Equal(old.cert, m.current.cert) || !bytes.Equal(old.key, m.current.key)
	listeners := m.listeners
	m.mu.Unlock()
	if changed {
		for _, l := range listeners {
			l.Enqueue()
		}
	}
}

// syncWebhooks sets every webhook's caBundle of the configurations named in Options.Webhooks
// to the CA bundle in force. A configuration that does not exist (yet) is skipped: it gets the
// bundle at a later check once someone created it.
func (m *Manager) syncWebhooks(ctx context.Context) error {
	bundle := m.CABundle()
	if bundle == nil {
		return nil
	}
	client := m.opts.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	var errs []error
	for _, name := range m.opts.Webhooks {
		for attempt := 1; ; attempt++ {
			c, err := client.Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				m.noteAbsent(name, true)
				break
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("reading the ValidatingWebhookConfiguration %s: %w", name, err))
				break
			}
			m.noteAbsent(name, false)
			changed := false
			for i := range c.Webhooks {
				if !bytes.Equal(c.Webhooks[i].ClientConfig.CABundle, bundle) {
					c.Webhooks[i].ClientConfig.CABundle, changed = bundle, true
				}
			}
			if !changed {
				break
			}
			_, err = client.Update(ctx, c, metav1.UpdateOptions{FieldManager: FieldManager})
			if apierrors.IsConflict(err) && attempt < maxConflicts {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("updating the caBundle of the ValidatingWebhookConfiguration %s: %w", name, err))
				break
			}
			m.metrics.bundleUpdates.WithLabelValues(name).Inc()
			m.log.Info("self-managed TLS: set the CA bundle of a webhook configuration", "component", "tls", "webhookConfiguration", name,
				"webhooks", len(c.Webhooks))
			break
		}
	}
	if len(errs) > 0 {
		m.metrics.errors.WithLabelValues("webhooks").Inc()
	}
	return errors.Join(errs...)
}

// noteAbsent logs once that a webhook configuration does not exist.
func (m *Manager) noteAbsent(name string, absent bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if absent && !m.absent[name] {
		m.log.Info("self-managed TLS: no such webhook configuration yet; its caBundle is set once it exists", "component", "tls",
			"webhookConfiguration", name)
	}
	m.absent[name] = absent
}

// ServiceDNSNames are the names of Services in namespace as a client in the cluster dials
// them: <service>.<namespace>.svc and the same under cluster.local.
func ServiceDNSNames(namespace string, services ...string) []string {
	var names []string
	for _, s := range services {
		names = append(names, s+"."+namespace+".svc", s+"."+namespace+".svc.cluster.local")
	}
	return names
}

// CAFromSecret is the CA bundle of a self-managed TLS Secret's data (for the CLI, which reads
// it with the user's credentials).
func CAFromSecret(s *corev1.Secret) ([]byte, error) {
	if s.Type != SecretType {
		return nil, fmt.Errorf("the Secret %s/%s is of type %q, not a self-managed TLS Secret (%q)", s.Namespace, s.Name, s.Type, SecretType)
	}
	bundle := s.Data[KeyCABundle]
	if _, err := cert.ParseCertsPEM(bundle); err != nil {
		return nil, fmt.Errorf("the Secret %s/%s: %s: %w", s.Namespace, s.Name, KeyCABundle, err)
	}
	return bundle, nil
}

type metrics struct {
	issued, errors, bundleUpdates *prometheus.CounterVec
	caExpiry                      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		issued: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_tls_self_managed_issued_total",
			Help: "Certificates this kubescribe minted and stored in the self-managed TLS Secret, by certificate: ca (a CA, first or next) or serving.",
		}, []string{"certificate"}),
		errors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_tls_self_managed_sync_errors_total",
			Help: "Failed syncs of self-managed TLS, by step: secret (reading or writing the Secret) or webhooks (setting a webhook configuration's caBundle).",
		}, []string{"step"}),
		bundleUpdates: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_tls_self_managed_ca_bundle_updates_total",
			Help: "caBundle updates of a webhook configuration kubescribe keeps in step with its self-managed CA, by configuration.",
		}, []string{"webhook_configuration"}),
		caExpiry: f.NewGauge(prometheus.GaugeOpts{
			Name: "kubescribe_tls_self_managed_ca_expiry_timestamp_seconds",
			Help: "When the self-managed CA that signs the serving certificate expires, as a Unix time.",
		}),
	}
	for _, c := range []string{"ca", "serving"} {
		m.issued.WithLabelValues(c)
	}
	for _, s := range []string{"secret", "webhooks"} {
		m.errors.WithLabelValues(s)
	}
	return m
}
