package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/controlplane"
)

// fakeKubescribe is a kubescribe process for doctor: an ops listener answering /readyz as
// told, and a TLS metrics listener that wants the reader's token and serves the audit
// counters, which a delivery moves.
type fakeKubescribe struct {
	ops, metrics *httptest.Server
	caPEM        []byte

	mu          sync.Mutex
	readyCode   int
	readyBody   string
	metricsCode int // 0: serve the page

	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	handler  *prometheus.HistogramVec
	refused  *prometheus.CounterVec
	scrapes  atomic.Int64
	// deliver, when set, is called at every scrape after the probe write, to move counters.
	deliver func(f *fakeKubescribe)
	probed  atomic.Bool
}

const fakeReaderToken = "reader-token"

func newFakeKubescribe(t *testing.T, started time.Time) *fakeKubescribe {
	t.Helper()
	f := &fakeKubescribe{readyCode: 200, readyBody: "ok", reg: prometheus.NewRegistry()}
	f.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubescribe_audit_requests_total", Help: "h"}, []string{"code"})
	f.handler = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kubescribe_audit_handler_duration_seconds", Help: "h"}, []string{"route"})
	f.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kubescribe_audit_refused_total", Help: "h"}, []string{"reason"})
	for _, code := range []string{"200", "401", "403", "503"} {
		f.requests.WithLabelValues(code)
	}
	f.reg.MustRegister(f.requests, f.handler, f.refused,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "process_start_time_seconds", Help: "h"}, func() float64 { return float64(started.Unix()) }))

	f.ops = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(f.readyCode)
		_, _ = w.Write([]byte(f.readyBody))
	}))
	t.Cleanup(f.ops.Close)

	ca, err := controlplane.NewCA("kubescribe-test")
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.Issue("kubescribe", []string{"kubescribe-metrics.kubescribe.svc"}, []net.IP{net.IPv4(127, 0, 0, 1)}, false)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	f.caPEM = ca.CertPEM
	page := promhttp.HandlerFor(f.reg, promhttp.HandlerOpts{})
	f.metrics = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		code := f.metricsCode
		f.mu.Unlock()
		switch {
		case r.Header.Get("Authorization") != "Bearer "+fakeReaderToken:
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		case code != 0:
			http.Error(w, http.StatusText(code), code)
			return
		}
		f.scrapes.Add(1)
		if f.deliver != nil && f.probed.Load() {
			f.deliver(f)
		}
		page.ServeHTTP(w, r)
	}))
	f.metrics.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	f.metrics.StartTLS()
	t.Cleanup(f.metrics.Close)
	return f
}

func (f *fakeKubescribe) setReady(code int, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readyCode, f.readyBody = code, body
}

// Forward maps kubescribe's Pod ports to the fake listeners.
func (f *fakeKubescribe) Forward(_ context.Context, _, _ string, port int) (string, func(), error) {
	switch port {
	case 8080:
		return f.ops.Listener.Addr().String(), func() {}, nil
	case 8081:
		return f.metrics.Listener.Addr().String(), func() {}, nil
	}
	return "", nil, errAt("no such port")
}

type errAt string

func (e errAt) Error() string { return string(e) }

// doctorFixture is a cluster with kubescribe installed the default way, a reader bound to
// kubescribe-metrics-reader, and a mirror of ConfigMaps in namespace team: everything Ready.
type doctorFixture struct {
	kube   *kubefake.Clientset
	ks     *fakeKubescribe
	now    time.Time
	denied map[string]bool // "verb resource namespace" a SubjectAccessReview refuses
	probes atomic.Int64

	providers []v1alpha1.GitProvider
	targets   []v1alpha1.GitTarget
	rules     []v1alpha1.WatchRule
	opts      doctorOptions
}

func newDoctorFixture(t *testing.T) *doctorFixture {
	t.Helper()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	fx := &doctorFixture{now: now, denied: map[string]bool{}}
	fx.ks = newFakeKubescribe(t, now.Add(-time.Hour))
	labels := map[string]string{"app.kubernetes.io/name": "kubescribe"}
	podSpec := corev1.PodSpec{ServiceAccountName: "kubescribe", Containers: []corev1.Container{{Name: "kubescribe",
		Args:  []string{"--redis-addr=$(REDIS_ADDR)", "--ops-listen-address=:8080", "--metrics-listen-address=:8081"},
		Ports: []corev1.ContainerPort{{Name: "health", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 8081}}}},
		Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kubescribe-tls-abc"}}}}}
	one := int32(1)
	fx.kube = kubefake.NewClientset(
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "kubescribe"},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: podSpec}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "kubescribe-7c9d", Labels: labels}, Spec: podSpec,
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "kubescribe", Ready: true,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "kubescribe-tls-abc"}, Data: map[string][]byte{"ca.crt": fx.ks.caPEM}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kubescribe", Name: "kubescribe-redis"}, Spec: appsv1.StatefulSetSpec{Replicas: &one},
			Status: appsv1.StatefulSetStatus{ReadyReplicas: 1}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "prometheus-reads-kubescribe"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: metricsReaderRole},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "monitoring", Name: "prometheus"}}},
	)
	fx.kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		ra := sar.Spec.ResourceAttributes
		if sar.Spec.User != "system:serviceaccount:kubescribe:kubescribe" {
			return true, nil, errAt("unexpected user " + sar.Spec.User)
		}
		sar.Status.Allowed = !fx.denied[ra.Verb+" "+ra.Resource+" "+ra.Namespace]
		return true, sar, nil
	})
	fx.kube.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" || a.GetNamespace() != "monitoring" {
			return true, nil, errAt("unexpected token request")
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest)
		if tr.Spec.ExpirationSeconds == nil || *tr.Spec.ExpirationSeconds != 600 {
			return true, nil, errAt("want a 10-minute token")
		}
		tr.Status.Token = fakeReaderToken
		return true, tr, nil
	})
	fx.kube.PrependReactor("create", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca := a.(k8stesting.CreateActionImpl)
		if len(ca.CreateOptions.DryRun) != 1 || ca.GetNamespace() != "kubescribe" {
			return true, nil, errAt("the probe must be a dry run in kubescribe's namespace")
		}
		fx.probes.Add(1)
		fx.ks.probed.Store(true)
		return true, ca.GetObject(), nil
	})
	fd := fx.kube.Discovery().(*fakediscovery.FakeDiscovery)
	lw := []string{"get", "list", "watch", "create"}
	fd.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "configmaps", Namespaced: true, Verbs: lw}, {Name: "secrets", Namespaced: true, Verbs: lw}}},
		{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{{Name: "widgets", Namespaced: true, Verbs: lw}}},
	}
	// By default every scrape after the probe sees one more batch delivered for route local.
	fx.ks.deliver = func(f *fakeKubescribe) {
		f.requests.WithLabelValues("200").Inc()
		f.handler.WithLabelValues("local").Observe(0.01)
	}

	ready := func(reason string) []metav1.Condition {
		return []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: reason}}
	}
	p := gitProvider("team", "repo", "git-credentials")
	p.Status.Conditions = ready(v1alpha1.ReasonReady)
	tg := gitTarget("team", "target", nil)
	tg.Status.Conditions = ready(v1alpha1.ReasonReady)
	wr := watchRule("team", "configmaps", "target", rule([]string{""}, "configmaps"))
	wr.Status.Conditions = ready(v1alpha1.ReasonReady)
	fx.providers, fx.targets, fx.rules = []v1alpha1.GitProvider{p}, []v1alpha1.GitTarget{tg}, []v1alpha1.WatchRule{wr}
	fx.opts = doctorOptions{ksNamespace: "kubescribe", deployment: "kubescribe", auditWait: 20 * time.Second, probe: true, format: "text"}
	return fx
}

// env is a doctorEnv on the fixture's clients, with a clock that moves only when doctor
// sleeps.
func (fx *doctorFixture) env(t *testing.T) *doctorEnv {
	t.Helper()
	var objs []runtime.Object
	add := func(gvr schema.GroupVersionResource, kind string, obj any) {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		require.NoError(t, err)
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion(v1alpha1.SchemeGroupVersion.String())
		u.SetKind(kind)
		objs = append(objs, u)
	}
	for i := range fx.providers {
		add(v1alpha1.GitProvidersResource, "GitProvider", &fx.providers[i])
	}
	for i := range fx.targets {
		add(v1alpha1.GitTargetsResource, "GitTarget", &fx.targets[i])
	}
	for i := range fx.rules {
		add(v1alpha1.WatchRulesResource, "WatchRule", &fx.rules[i])
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.GitProvidersResource: "GitProviderList", v1alpha1.GitTargetsResource: "GitTargetList",
		v1alpha1.WatchRulesResource: "WatchRuleList", v1alpha1.ClusterWatchRulesResource: "ClusterWatchRuleList",
	}, objs...)
	now := fx.now
	var mu sync.Mutex
	opts := fx.opts
	return &doctorEnv{opts: &opts, contextName: "test", kube: fx.kube, dyn: dyn, disc: fx.kube.Discovery(), forward: fx.ks,
		now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		sleep: func(_ context.Context, d time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			now = now.Add(d)
			return nil
		}}
}

func (fx *doctorFixture) run(t *testing.T) (*doctorReport, map[string]*doctorCheck, string) {
	t.Helper()
	r, err := fx.env(t).run(context.Background())
	require.NoError(t, err)
	checks := map[string]*doctorCheck{}
	for _, c := range r.Checks {
		checks[c.Name] = c
	}
	var out bytes.Buffer
	require.NoError(t, writeDoctorReport(&out, "text", r))
	return r, checks, out.String()
}

func verdicts(checks map[string]*doctorCheck) map[string]verdict {
	out := map[string]verdict{}
	for name, c := range checks {
		out[name] = c.Verdict
	}
	return out
}

// TestDoctorHealthy: an installation with nothing wrong passes every check; the audit check
// made one dry-run write and saw the batch it provoked.
func TestDoctorHealthy(t *testing.T) {
	fx := newDoctorFixture(t)
	r, checks, out := fx.run(t)
	require.Equal(t, map[string]verdict{"kubescribe": verdictOK, "redis": verdictOK, "audit-delivery": verdictOK, "audit-routes": verdictOK,
		"rbac": verdictOK, "rules": verdictOK, "git": verdictOK}, verdicts(checks), out)
	require.Zero(t, r.Failed)
	require.EqualValues(t, 1, fx.probes.Load())
	require.Contains(t, checks["audit-delivery"].Summary, "the apiserver delivered 1 audit batch within 1s, answered 200 (route local)")
	require.Contains(t, checks["rbac"].Summary, "ServiceAccount kubescribe/kubescribe may do the 3 requests")
	require.Contains(t, out, "Nothing wrong found.")
	require.Contains(t, out, "- /metrics: read with a 10-minute token of ServiceAccount monitoring/prometheus; certificate verified with ca.crt of Secret kubescribe/kubescribe-tls-abc")

	var buf bytes.Buffer
	require.NoError(t, writeDoctorReport(&buf, "json", r))
	var decoded doctorReport
	require.NoError(t, json.Unmarshal(buf.Bytes(), &decoded))
	require.Len(t, decoded.Checks, 7)
	require.Equal(t, "kubescribe", decoded.KubescribeNamespace)
}

// TestDoctorNamesWhatIsWrong: each broken thing is named by its check, with what to do.
func TestDoctorNamesWhatIsWrong(t *testing.T) {
	fx := newDoctorFixture(t)
	fx.ks.setReady(503, "redis: not answering")
	fx.ks.deliver = nil // the apiserver sends nothing
	fx.denied["list configmaps team"] = true
	fx.denied["get secrets team"] = true
	fx.providers[0].Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonRemoteUnreachable, Message: "dial tcp: lookup git.example.invalid: no such host"}}
	fx.targets[0].Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonProviderNotReady, Message: "GitProvider repo is not Ready"}}
	remote := gitTarget("team", "prod", &v1alpha1.SourceCluster{AuditRoute: "prod"})
	remote.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady}}
	fx.targets = append(fx.targets, remote)
	fx.ks.handler.WithLabelValues("staging").Observe(0.01) // a route nobody mirrors
	fx.ks.requests.WithLabelValues("503").Add(4)           // earlier, while Redis was down
	orphan := watchRule("team", "orphan", "nowhere", rule([]string{""}, "configmaps"))
	orphan.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonTargetNotFound, Message: `GitTarget "nowhere" not found`}}
	fx.rules = append(fx.rules, orphan)

	r, checks, out := fx.run(t)
	t.Log("\n" + out)
	require.Equal(t, map[string]verdict{"kubescribe": verdictWarn, "redis": verdictFail, "audit-delivery": verdictFail, "audit-routes": verdictFail,
		"rbac": verdictFail, "rules": verdictFail, "git": verdictFail}, verdicts(checks), out)
	require.Equal(t, 6, r.Failed)

	require.Contains(t, out, "Pod kubescribe-7c9d: /readyz: redis: not answering")
	require.Contains(t, checks["audit-delivery"].Summary, "no audit batch reached kubescribe within 20s of a write")
	require.Contains(t, checks["audit-delivery"].Summary, "it has received 4 audit requests since it started 1h0m0s ago")
	require.Contains(t, checks["audit-delivery"].Fix, "/audit/local")
	require.Contains(t, out, "HTTP 503: 4 audit requests answered 503 since kubescribe started")
	require.Contains(t, out, "route prod: GitTarget team/prod mirrors source cluster \"prod\", but no audit batch came for route prod")
	require.Contains(t, out, "route staging: 1 audit batch came for route staging, but no GitTarget mirrors")
	require.Contains(t, out, "ServiceAccount kubescribe/kubescribe may not list configmaps in namespace team, which WatchRule team/configmaps, WatchRule team/orphan need")
	require.Contains(t, out, "ServiceAccount kubescribe/kubescribe may not get secret git-credentials in namespace team, which GitProvider team/repo (spec.secretRef) need")
	require.Contains(t, out, "Ready: 0 of 1 GitProvider, 1 of 2 GitTargets")
	require.Contains(t, out, "fix: grant what the rules need: kubescribe rbac | kubectl apply -f -")
	require.Contains(t, out, "WatchRule team/orphan: TargetNotFound: GitTarget \"nowhere\" not found")
	require.Contains(t, out, "GitProvider team/repo: RemoteUnreachable: dial tcp: lookup git.example.invalid: no such host")
	require.Contains(t, out, "fix: check spec.url")
	require.Contains(t, out, "6 checks failed, 1 warning.")
}

// TestDoctorWatchForbidden: a rule whose watch the apiserver refused is the RBAC check's, even
// where no SubjectAccessReview shows it (a remote cluster), and not counted twice.
func TestDoctorWatchForbidden(t *testing.T) {
	fx := newDoctorFixture(t)
	fx.rules[0].Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonWatchFailed,
		Message: `watching v1/configmaps: configmaps is forbidden: User "system:serviceaccount:kubescribe:kubescribe" cannot list resource "configmaps"`}}
	_, checks, out := fx.run(t)
	require.Equal(t, verdictFail, checks["rbac"].Verdict, out)
	require.Equal(t, verdictOK, checks["rules"].Verdict, out)
	require.Contains(t, out, "WatchRule team/configmaps: WatchFailed: watching v1/configmaps: configmaps is forbidden")
}

// TestDoctorMetricsUnreadable: without a reader to request a token for, or when the reader is
// refused, the checks that need /metrics say so and what to do, and fail nothing.
func TestDoctorMetricsUnreadable(t *testing.T) {
	fx := newDoctorFixture(t)
	require.NoError(t, fx.kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), "prometheus-reads-kubescribe", metav1.DeleteOptions{}))
	r, checks, out := fx.run(t)
	require.Zero(t, r.Failed, out)
	require.Equal(t, verdictSkip, checks["audit-delivery"].Verdict)
	require.Contains(t, checks["audit-delivery"].Summary, "no ServiceAccount is bound to kubescribe-metrics-reader")
	require.Contains(t, checks["audit-delivery"].Fix, "deploy/components/monitoring")
	require.Equal(t, verdictSkip, checks["audit-routes"].Verdict)
	require.Zero(t, fx.probes.Load(), "no write when nothing can be watched")

	fx = newDoctorFixture(t)
	fx.ks.metricsCode = http.StatusForbidden
	_, checks, _ = fx.run(t)
	require.Equal(t, verdictSkip, checks["audit-delivery"].Verdict)
	require.Equal(t, "a 10-minute token of ServiceAccount monitoring/prometheus may not get /metrics (403)", checks["audit-delivery"].Summary)
}

// TestDoctorWithoutKubescribe: no Deployment: the first check says so, and the checks that
// need kubescribe's answers cannot run; those of the objects still do.
func TestDoctorWithoutKubescribe(t *testing.T) {
	fx := newDoctorFixture(t)
	require.NoError(t, fx.kube.AppsV1().Deployments("kubescribe").Delete(context.Background(), "kubescribe", metav1.DeleteOptions{}))
	r, checks, out := fx.run(t)
	require.Equal(t, 1, r.Failed, out)
	require.Equal(t, verdictFail, checks["kubescribe"].Verdict)
	require.Equal(t, "no Deployment kubescribe in namespace kubescribe", checks["kubescribe"].Summary)
	require.Equal(t, verdictSkip, checks["redis"].Verdict)
	require.Equal(t, verdictSkip, checks["audit-delivery"].Verdict)
	require.Equal(t, verdictOK, checks["git"].Verdict)
}

// TestDoctorPodNotRunning: a Pod that cannot start is named with its reason.
func TestDoctorPodNotRunning(t *testing.T) {
	fx := newDoctorFixture(t)
	pod, err := fx.kube.CoreV1().Pods("kubescribe").Get(context.Background(), "kubescribe-7c9d", metav1.GetOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{Name: "kubescribe",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: `secret "kubescribe-redis" not found`}}}}}
	_, err = fx.kube.CoreV1().Pods("kubescribe").UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, checks, out := fx.run(t)
	require.Equal(t, verdictFail, checks["kubescribe"].Verdict, out)
	require.Contains(t, out, `Pod kubescribe-7c9d: CreateContainerConfigError: secret "kubescribe-redis" not found`)
	require.Contains(t, out, "run deploy/secrets.sh for the overlay")
}

// TestDoctorAdmissionSource: with the attribution webhook as the source of authors, no audit
// batch is expected.
func TestDoctorAdmissionSource(t *testing.T) {
	fx := newDoctorFixture(t)
	fx.ks.deliver = nil
	fx.opts.attributionSource = "admission"
	_, checks, out := fx.run(t)
	require.Equal(t, verdictWarn, checks["audit-delivery"].Verdict, out)
	require.Contains(t, checks["audit-delivery"].Summary, "--attribution-source=admission")
	require.Zero(t, fx.probes.Load())
}

// TestDoctorNamespaceFilter: -n checks that namespace's objects only, but a route another
// namespace's GitTarget mirrors is not unknown.
func TestDoctorNamespaceFilter(t *testing.T) {
	fx := newDoctorFixture(t)
	other := gitProvider("other", "broken", "")
	other.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonAuthenticationFailed}}
	remote := gitTarget("other", "staging", &v1alpha1.SourceCluster{AuditRoute: "staging"})
	remote.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady}}
	fx.providers, fx.targets = append(fx.providers, other), append(fx.targets, remote)
	fx.ks.handler.WithLabelValues("staging").Observe(0.01)
	fx.opts.namespace = "team"
	r, checks, out := fx.run(t)
	require.Zero(t, r.Failed, out)
	require.Zero(t, r.Warnings, out)
	require.Contains(t, checks["git"].Summary, "1 GitProvider and 1 GitTarget Ready")

	fx.opts.namespace = ""
	_, checks, out = fx.run(t)
	require.Equal(t, verdictFail, checks["git"].Verdict, out)
	require.Contains(t, out, "GitProvider other/broken: AuthenticationFailed\n")
	require.Contains(t, out, "route staging: 1 batch since kubescribe started")
}

func TestDoctorFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseDoctorFlags([]string{"-n", "team", "--format", "json", "--service-account", "ops/kubescribe", "--no-probe"}, &stderr)
	require.NoError(t, err)
	require.Equal(t, "team", o.namespace)
	require.Equal(t, "json", o.format)
	require.False(t, o.probe)
	require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "ops", Name: "kubescribe"}}, o.subjects)
	require.Equal(t, 45*time.Second, o.auditWait)
	require.Equal(t, "kubescribe", o.ksNamespace)

	for args, want := range map[string]string{
		"--format yaml":                                   "want text or json",
		"--attribution-source webhook":                    "want audit, admission or both",
		"--attribution-source both":                       "",
		"--audit-wait 0s":                                 "want a positive duration",
		"--service-account kubescribe":                    "want NAMESPACE/NAME",
		"--metrics-service-account prometheus":            "want NAMESPACE/NAME",
		"--group admins":                                  "--group needs --user",
		"--user a --service-account ns/b":                 "give kubescribe's identity once",
		"extra":                                           `unexpected argument "extra"`,
		"--kubescribe-namespace=":                         "must not be empty",
		"--user a --group g":                              "",
		"--metrics-service-account monitoring/prometheus": "",
	} {
		_, err := parseDoctorFlags(strings.Fields(args), &stderr)
		if want == "" {
			require.NoError(t, err, args)
			continue
		}
		require.ErrorContains(t, err, want, args)
	}
}

func TestDoctorHelpers(t *testing.T) {
	e := &doctorEnv{opts: &doctorOptions{ksNamespace: "kubescribe", subjects: []rbacv1.Subject{
		{Kind: rbacv1.UserKind, Name: "kubescribe"}, {Kind: rbacv1.GroupKind, Name: "mirrors"}}}}
	who, user, groups := e.identity(&kubescribeProcs{})
	require.Equal(t, "user kubescribe", who)
	require.Equal(t, "kubescribe", user)
	require.Equal(t, []string{"system:authenticated", "mirrors"}, groups)
	e.opts.subjects = nil
	who, user, _ = e.identity(&kubescribeProcs{})
	require.Equal(t, "ServiceAccount kubescribe/kubescribe", who, "the default install's")
	require.Equal(t, "system:serviceaccount:kubescribe:kubescribe", user)

	v, ok := argValue([]string{"--cluster-name=a", "--cluster-name", "b", "--x"}, "--cluster-name")
	require.True(t, ok)
	require.Equal(t, "b", v)
	_, ok = argValue([]string{"--cluster-name"}, "--cluster-name")
	require.False(t, ok)
	v, ok = argValue([]string{"--metrics-listen-address="}, "--metrics-listen-address")
	require.True(t, ok)
	require.Empty(t, v)

	c := &corev1.Container{Args: []string{"--ops-listen-address=127.0.0.1:9090"}, Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9191}}}
	require.Equal(t, 9090, containerPort(c, "health", "--ops-listen-address", 8080))
	require.Equal(t, 9191, containerPort(c, "metrics", "--metrics-listen-address", 8081))
	require.Equal(t, 9443, containerPort(c, "admission", "--admission-listen-address", 9443))

	require.Contains(t, redisFix("cannot connect to Redis: WRONGPASS invalid username-password pair"), "password")
	require.Contains(t, redisFix("dial tcp: lookup kubescribe-redis: no such host"), "redis-addr")
	require.Contains(t, redisFix("dial tcp 10.0.0.5:6379: connect: connection refused"), "NetworkPolicy")

	reason, msg := podProblem(&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes are available"}}}})
	require.Equal(t, "Unschedulable", reason)
	require.Equal(t, "0/1 nodes are available", msg)
	reason, msg = podProblem(&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}}}}})
	require.Equal(t, "CrashLoopBackOff", reason)
	require.Equal(t, "back-off 5m0s (last exit: code 1, Error)", msg)
	reason, _ = podProblem(&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	require.Empty(t, reason)
}

// TestDoctorCRDsMissing: a cluster without kubescribe's CRDs is a finding, not an error.
func TestDoctorCRDsMissing(t *testing.T) {
	fx := newDoctorFixture(t)
	e := fx.env(t)
	dyn := e.dyn.(*dynamicfake.FakeDynamicClient)
	dyn.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "kubescribe.dev", Resource: "watchrules"}, "")
	})
	r, err := e.run(context.Background())
	require.NoError(t, err)
	for _, c := range r.Checks {
		if c.Name == "rules" {
			require.Equal(t, verdictFail, c.Verdict)
			require.Contains(t, c.Summary, "CRDs are not installed")
		}
	}
}

// TestDoctorCannotReachPods: when doctor cannot port-forward, a Ready Pod is a warning about
// doctor's access, not a failure of kubescribe, and the checks that need its answers say
// they could not run.
func TestDoctorCannotReachPods(t *testing.T) {
	fx := newDoctorFixture(t)
	pod, err := fx.kube.CoreV1().Pods("kubescribe").Get(context.Background(), "kubescribe-7c9d", metav1.GetOptions{})
	require.NoError(t, err)
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	_, err = fx.kube.CoreV1().Pods("kubescribe").UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
	require.NoError(t, err)
	e := fx.env(t)
	e.forward = failingForwarder{}
	r, err := e.run(context.Background())
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, writeDoctorReport(&out, "text", r))
	require.Zero(t, r.Failed, out.String())
	require.Contains(t, out.String(), "WARN  kubescribe runs: Deployment kubescribe/kubescribe: 1 of 1 Pod ready")
	require.Contains(t, out.String(), "it needs create on pods/portforward in its namespace")
	require.Contains(t, out.String(), "SKIP  The apiserver sends audit events: cannot read /metrics")
}

type failingForwarder struct{}

func (failingForwarder) Forward(context.Context, string, string, int) (string, func(), error) {
	return "", nil, errAt(`pods "kubescribe-7c9d" is forbidden: User "dev" cannot create resource "pods/portforward"`)
}

func TestLastLogRecord(t *testing.T) {
	log := []byte(`{"time":"t","level":"INFO","msg":"kubescribe running"}
{"time":"t","level":"WARN","msg":"cannot connect to Redis","component":"redis","err":"dial tcp 10.0.0.5:6379: connect: connection refused"}
{"time":"t","level":"ERROR","msg":"git worker stopped","component":"git"}
{"time":"t","level":"DEBUG","msg":"audit batch stored","component":"audit"}
`)
	require.Equal(t, "cannot connect to Redis: dial tcp 10.0.0.5:6379: connect: connection refused", lastLogRecord(log, "redis"))
	require.Equal(t, "git worker stopped", lastLogRecord(log, ""))
	require.Equal(t, "panic: boom", lastLogRecord(append(log, "panic: boom\n"...), ""))
	require.Empty(t, lastLogRecord(log, "watch"))
}

// TestAPIPortForwarderRefused: a port-forward the apiserver refuses ends in its error, over
// WebSockets and SPDY alike, rather than hanging.
func TestAPIPortForwarderRefused(t *testing.T) {
	var paths sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.Method+" "+r.URL.Path, true)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,` +
			`"message":"pods \"kubescribe-7c9d\" is forbidden: User \"dev\" cannot create resource \"pods/portforward\""}`))
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	kube, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _, err = (&apiPortForwarder{cfg: cfg, kube: kube}).Forward(ctx, "kubescribe", "kubescribe-7c9d", 8080)
	require.ErrorContains(t, err, "forbidden")
	require.NoError(t, ctx.Err(), "Forward returned because of the timeout")
	_, asked := paths.Load("POST /api/v1/namespaces/kubescribe/pods/kubescribe-7c9d/portforward")
	_, askedWS := paths.Load("GET /api/v1/namespaces/kubescribe/pods/kubescribe-7c9d/portforward")
	require.True(t, asked || askedWS, "the port-forward subresource was asked for")
}

// TestDoctorReplicas: a Deployment scaled to zero fails; a single replica is a warning.
func TestDoctorReplicas(t *testing.T) {
	for replicas, want := range map[int32]string{0: "FAIL  kubescribe runs: Deployment kubescribe/kubescribe is scaled to 0 replicas",
		1: "Deployment kubescribe: 1 replica: a rollout, a drain or a crash leaves the apiserver without an audit endpoint"} {
		fx := newDoctorFixture(t)
		dep, err := fx.kube.AppsV1().Deployments("kubescribe").Get(context.Background(), "kubescribe", metav1.GetOptions{})
		require.NoError(t, err)
		dep.Spec.Replicas = &replicas
		_, err = fx.kube.AppsV1().Deployments("kubescribe").Update(context.Background(), dep, metav1.UpdateOptions{})
		require.NoError(t, err)
		_, _, out := fx.run(t)
		require.Contains(t, out, want)
	}
}

// TestDoctorProbeRefused: a probe the apiserver refuses is still audited and counts as made.
func TestDoctorProbeRefused(t *testing.T) {
	fx := newDoctorFixture(t)
	fx.ks.deliver = nil
	fx.kube.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		fx.probes.Add(1)
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "", errAt("no"))
	})
	_, checks, out := fx.run(t)
	require.EqualValues(t, 1, fx.probes.Load())
	require.Equal(t, verdictFail, checks["audit-delivery"].Verdict, out)
	require.Contains(t, checks["audit-delivery"].Summary, "within 20s of a write")
}
