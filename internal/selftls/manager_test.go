package selftls

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kubescribe/kubescribe/internal/testlog"
)

const (
	testNS     = "kubescribe"
	testSecret = "kubescribe-tls"
	testHooks  = "kubescribe-commitrequests"
)

// counter counts listener notifications.
type counter struct{ n atomic.Int32 }

func (c *counter) Enqueue() { c.n.Add(1) }

type fixture struct {
	client *fake.Clientset
	clock  *clocktesting.FakeClock
	log    *testlog.Buffer
	reg    *prometheus.Registry
}

func newFixture(objs ...runtime.Object) *fixture {
	return &fixture{client: fake.NewClientset(objs...), clock: clocktesting.NewFakeClock(t0), log: &testlog.Buffer{}, reg: prometheus.NewRegistry()}
}

func (f *fixture) manager(t *testing.T, p Policy) *Manager {
	t.Helper()
	m, err := New(Options{Client: f.client, Namespace: testNS, Name: testSecret, Policy: p, Webhooks: []string{testHooks, "absent"},
		CheckInterval: time.Hour, Clock: f.clock, Registerer: f.reg,
		Logger: slog.New(slog.NewJSONHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	return m
}

func (f *fixture) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	s, err := f.client.CoreV1().Secrets(testNS).Get(context.Background(), testSecret, metav1.GetOptions{})
	require.NoError(t, err)
	return s
}

func (f *fixture) bundles(t *testing.T) [][]byte {
	t.Helper()
	c, err := f.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), testHooks, metav1.GetOptions{})
	require.NoError(t, err)
	var b [][]byte
	for _, w := range c.Webhooks {
		b = append(b, w.ClientConfig.CABundle)
	}
	return b
}

// noKeyLogged checks that no private key of data, in any of the forms it could be written
// (PEM, its base64 body, the base64 of the PEM as in a Secret's JSON), reached the log.
func noKeyLogged(t *testing.T, log string, data map[string][]byte) {
	t.Helper()
	for _, k := range []string{KeyCAKey, KeyNextCAKey, KeyKey} {
		pem := data[k]
		if len(pem) == 0 {
			continue
		}
		lines := strings.Split(string(pem), "\n")
		require.NotContains(t, log, lines[1], "%s logged", k)
		require.NotContains(t, log, base64.StdEncoding.EncodeToString(pem)[:40], "%s logged", k)
	}
}

func webhookConfiguration() *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: testHooks},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "one.kubescribe.dev"}, {Name: "two.kubescribe.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: []byte("stale")}}},
	}
}

// TestManagerCreatesAndServes: Start creates the Secret, serves its certificate (telling the
// listeners), and sets the caBundle of every webhook of the named configuration; a named
// configuration that does not exist is skipped and logged once. No key reaches the log.
func TestManagerCreatesAndServes(t *testing.T) {
	f := newFixture(webhookConfiguration())
	m := f.manager(t, testPolicy)
	var l counter
	m.AddListener(&l)
	c, k := m.CurrentCertKeyContent()
	require.Nil(t, c)
	require.Nil(t, k)
	require.NoError(t, m.Start(context.Background()))

	s := f.secret(t)
	require.Equal(t, SecretType, s.Type)
	require.Equal(t, "kubescribe", s.Labels["app.kubernetes.io/name"])
	c, k = m.CurrentCertKeyContent()
	require.Equal(t, s.Data[KeyCert], c)
	require.Equal(t, s.Data[KeyKey], k)
	require.Equal(t, s.Data[KeyCABundle], m.CABundle())
	require.EqualValues(t, 1, l.n.Load())
	require.Equal(t, [][]byte{s.Data[KeyCABundle], s.Data[KeyCABundle]}, f.bundles(t))
	ca, err := CAFromSecret(s)
	require.NoError(t, err)
	require.Equal(t, s.Data[KeyCABundle], ca)

	require.Contains(t, f.log.String(), "self-managed TLS Secret created")
	require.Contains(t, f.log.String(), `"webhookConfiguration":"absent"`)
	require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.issued.WithLabelValues("ca")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.issued.WithLabelValues("serving")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.metrics.bundleUpdates.WithLabelValues(testHooks)))
	noKeyLogged(t, f.log.String(), s.Data)

	// A second start (a restart) takes what the Secret holds.
	m2 := newFixtureSharing(f).manager(t, testPolicy)
	require.NoError(t, m2.Start(context.Background()))
	c2, _ := m2.CurrentCertKeyContent()
	require.Equal(t, c, c2)
	require.Equal(t, 0.0, testutil.ToFloat64(m2.metrics.issued.WithLabelValues("serving")))
	require.Equal(t, 0.0, testutil.ToFloat64(m2.metrics.bundleUpdates.WithLabelValues(testHooks)), "the caBundle is already right")
}

// newFixtureSharing is a fixture with f's client and clock and registry and log of its own:
// another replica.
func newFixtureSharing(f *fixture) *fixture {
	return &fixture{client: f.client, clock: f.clock, log: &testlog.Buffer{}, reg: prometheus.NewRegistry()}
}

// TestManagerConcurrentStart: replicas that start at once both find no Secret and both mint.
// Replica b creates the Secret between replica a's read and a's create: a's create fails
// (AlreadyExists), and a reads b's Secret and serves that. One CA for all, and only the stored
// certificates count as issued.
func TestManagerConcurrentStart(t *testing.T) {
	// b's Secret, made by a Manager of its own.
	fb := newFixture()
	b := fb.manager(t, testPolicy)
	require.NoError(t, b.Start(context.Background()))
	bSecret := fb.secret(t)

	f := newFixture(webhookConfiguration())
	var gets atomic.Int32
	f.client.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if gets.Add(1) > 1 {
			return false, nil, nil
		}
		// a finds nothing; b creates its Secret right after.
		require.NoError(t, f.client.Tracker().Add(bSecret.DeepCopy()))
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, testSecret)
	})
	a := f.manager(t, testPolicy)
	require.NoError(t, a.Start(context.Background()))
	var verbs []string
	for _, act := range f.client.Actions() {
		if act.GetResource().Resource == "secrets" {
			verbs = append(verbs, act.GetVerb())
		}
	}
	require.Equal(t, []string{"get", "create", "get"}, verbs, "read, lost the create, read b's: no update")

	s := f.secret(t)
	require.Equal(t, bSecret.Data, s.Data, "b's Secret is kept")
	c, k := a.CurrentCertKeyContent()
	require.Equal(t, s.Data[KeyCert], c)
	require.Equal(t, s.Data[KeyKey], k)
	require.Equal(t, s.Data[KeyCABundle], a.CABundle())
	require.Equal(t, 0.0, testutil.ToFloat64(a.metrics.issued.WithLabelValues("serving")), "a stored nothing")
	require.Equal(t, [][]byte{s.Data[KeyCABundle], s.Data[KeyCABundle]}, f.bundles(t))

	// Started truly at once, any number of replicas end up serving the one Secret.
	f = newFixture()
	replicas := make([]*Manager, 4)
	var wg sync.WaitGroup
	for i := range replicas {
		replicas[i] = newFixtureSharing(f).manager(t, testPolicy)
		wg.Go(func() { require.NoError(t, replicas[i].Start(context.Background())) })
	}
	wg.Wait()
	s = f.secret(t)
	for _, m := range replicas {
		c, _ := m.CurrentCertKeyContent()
		require.Equal(t, s.Data[KeyCert], c)
	}
}

// TestManagerRunRenews: with a fake clock, Run wakes at the serving certificate's renewal (2/3
// of its life), stores a new one signed by the same CA, serves it and tells the listeners; an
// update that conflicts with another replica's write is read again and planned anew.
func TestManagerRunRenews(t *testing.T) {
	f := newFixture(webhookConfiguration())
	p := shortPolicy
	p.CAValidity = 100 * time.Hour
	m := f.manager(t, p)
	var l counter
	m.AddListener(&l)
	require.NoError(t, m.Start(context.Background()))
	first := f.secret(t)
	renewAt := RenewAt(certOf(t, first.Data[KeyCert]))

	var conflicts atomic.Int32
	f.client.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts.Add(1) == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, testSecret, nil)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	require.Eventually(t, f.clock.HasWaiters, 10*time.Second, time.Millisecond)
	f.clock.SetTime(renewAt.Add(-time.Second))
	time.Sleep(50 * time.Millisecond)
	c, _ := m.CurrentCertKeyContent()
	require.Equal(t, first.Data[KeyCert], c, "not due yet")
	require.Eventually(t, f.clock.HasWaiters, 10*time.Second, time.Millisecond)
	f.clock.SetTime(renewAt)
	require.Eventually(t, func() bool { c, _ := m.CurrentCertKeyContent(); return !bytes.Equal(c, first.Data[KeyCert]) }, 10*time.Second, time.Millisecond)
	second := f.secret(t)
	c, k := m.CurrentCertKeyContent()
	require.Equal(t, second.Data[KeyCert], c)
	require.Equal(t, second.Data[KeyKey], k)
	require.Equal(t, first.Data[KeyCABundle], second.Data[KeyCABundle])
	require.EqualValues(t, 2, l.n.Load())
	require.GreaterOrEqual(t, conflicts.Load(), int32(2), "the conflicting update was tried again")
	require.True(t, RenewAt(certOf(t, second.Data[KeyCert])).After(renewAt))
	noKeyLogged(t, f.log.String(), first.Data)
	noKeyLogged(t, f.log.String(), second.Data)
}

// TestManagerFollowsTheSecret: what someone does to the Secret is repaired at the next check:
// a removed serving certificate is issued anew by the same CA; a deleted Secret is created
// again with a new CA, and the webhooks' caBundle follows it; a caBundle someone changed is
// set back.
func TestManagerFollowsTheSecret(t *testing.T) {
	f := newFixture(webhookConfiguration())
	m := f.manager(t, testPolicy)
	require.NoError(t, m.Start(context.Background()))
	first := f.secret(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	check := func() {
		require.Eventually(t, f.clock.HasWaiters, 10*time.Second, time.Millisecond)
		f.clock.Step(time.Hour) // the check interval
	}

	s := first.DeepCopy()
	delete(s.Data, KeyCert)
	_, err := f.client.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{})
	require.NoError(t, err)
	check()
	require.Eventually(t, func() bool { c, _ := m.CurrentCertKeyContent(); return !bytes.Equal(c, first.Data[KeyCert]) }, 10*time.Second, time.Millisecond)
	require.Equal(t, first.Data[KeyCABundle], f.secret(t).Data[KeyCABundle])

	vwc, err := f.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), testHooks, metav1.GetOptions{})
	require.NoError(t, err)
	vwc.Webhooks[1].ClientConfig.CABundle = []byte("edited")
	_, err = f.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(context.Background(), vwc, metav1.UpdateOptions{})
	require.NoError(t, err)
	check()
	require.Eventually(t, func() bool { return bytes.Equal(f.bundles(t)[1], first.Data[KeyCABundle]) }, 10*time.Second, time.Millisecond)

	require.NoError(t, f.client.CoreV1().Secrets(testNS).Delete(context.Background(), testSecret, metav1.DeleteOptions{}))
	check()
	require.Eventually(t, func() bool { return !bytes.Equal(m.CABundle(), first.Data[KeyCABundle]) }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return bytes.Equal(f.bundles(t)[0], m.CABundle()) }, 10*time.Second, time.Millisecond)
	require.Contains(t, f.log.String(), "minted a new CA")
	noKeyLogged(t, f.log.String(), f.secret(t).Data)
}

// TestManagerRefusesAForeignSecret: a Secret of that name that is not kubescribe's (cert-manager's
// kubernetes.io/tls, say) is never overwritten, and Start says so at once.
func TestManagerRefusesAForeignSecret(t *testing.T) {
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: testSecret, Namespace: testNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{KeyCert: []byte("theirs"), KeyKey: []byte("theirs")}}
	f := newFixture(foreign)
	m := f.manager(t, testPolicy)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := m.Start(ctx)
	require.ErrorContains(t, err, `type "kubernetes.io/tls"`)
	require.ErrorContains(t, err, "does not overwrite it")
	require.Equal(t, []byte("theirs"), f.secret(t).Data[KeyCert])
	_, err = CAFromSecret(foreign)
	require.ErrorContains(t, err, "not a self-managed TLS Secret")
}

// TestManagerStartStopsOnForbidden: RBAC refusing the Secret is not retried at start.
func TestManagerStartStopsOnForbidden(t *testing.T) {
	f := newFixture()
	f.client.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, testSecret, nil)
	})
	err := f.manager(t, testPolicy).Start(context.Background())
	require.True(t, apierrors.IsForbidden(err), "%v", err)
}
