package deploy

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	"github.com/kubescribe/kubescribe/internal/app"
	"github.com/kubescribe/kubescribe/test/controlplane"
)

// The objects deploy/components/monitoring adds to an installation.
var monitoringObjects = []struct{ kind, name string }{
	{"ServiceMonitor", "kubescribe"},
	{"PrometheusRule", "kubescribe"},
	{"ClusterRoleBinding", "kubescribe-metrics-prometheus"},
	{"ConfigMap", "kubescribe-dashboard"},
}

// TestMonitoringComponent: the component added to each overlay adds its four objects and
// changes nothing else; its ServiceMonitor reaches the metrics Service's port over TLS under a
// name the serving certificate holds, verified with the CA of the Secret the Deployment serves
// (hashed name included), with a token of a ServiceAccount bound to kubescribe-metrics-reader;
// the dashboard is a Grafana dashboard for the sidecar.
func TestMonitoringComponent(t *testing.T) {
	for _, overlay := range Overlays {
		t.Run(overlay, func(t *testing.T) {
			kustomization, err := WithComponent(root, overlay, "monitoring")
			require.NoError(t, err)
			with, err := BuildOverlay(root, t.TempDir(), overlay+"-monitoring", kustomization)
			require.NoError(t, err)
			without := buildOverlay(t, overlay)
			require.Len(t, with, len(without)+len(monitoringObjects))
			for _, o := range without {
				got := Find(with, o.GetKind(), o.GetName())
				if got == nil && (o.GetKind() == "Secret" || o.GetKind() == "ConfigMap") {
					continue // generated: a hash of other random content in its name
				}
				require.NotNil(t, got, "%s %s", o.GetKind(), o.GetName())
				if o.GetKind() != "Secret" && o.GetKind() != "ValidatingWebhookConfiguration" && o.GetKind() != "Deployment" &&
					o.GetKind() != "StatefulSet" {
					require.Equal(t, o.Object, got.Object, "the component changes %s %s", o.GetKind(), o.GetName())
				}
			}
			checkMonitoring(t, with)
		})
	}
}

// TestMonitoringDocOverlays: the monitoring overlays docs/install.md shows build, and their
// patches reach the objects they name.
func TestMonitoringDocOverlays(t *testing.T) {
	docs, err := MonitoringDocOverlays(root)
	require.NoError(t, err)
	for name, kustomization := range docs {
		t.Run(name, func(t *testing.T) {
			objs, err := BuildOverlay(root, t.TempDir(), name, kustomization)
			require.NoError(t, err)
			checkMonitoring(t, objs)
			crb := Find(objs, "ClusterRoleBinding", "kubescribe-metrics-prometheus")
			subjects, _, _ := unstructured.NestedSlice(crb.Object, "subjects")
			require.NotEqual(t, "kube-prometheus-stack-prometheus", subjects[0].(map[string]any)["name"], "the example overrides the subject")
		})
	}
}

// checkMonitoring checks the component's objects in a build.
func checkMonitoring(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, m := range monitoringObjects {
		o := Find(objs, m.kind, m.name)
		require.NotNil(t, o, "%s %s", m.kind, m.name)
		if m.kind != "ClusterRoleBinding" {
			require.Equal(t, namespace, o.GetNamespace(), "%s %s", m.kind, m.name)
		}
	}

	// The ServiceMonitor selects the metrics Service, and no other, and names its port.
	sm := Find(objs, "ServiceMonitor", "kubescribe")
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	require.NotEmpty(t, selector)
	var selected []string
	for _, o := range objs {
		if o.GetKind() == "Service" && hasLabels(o.GetLabels(), selector) {
			selected = append(selected, o.GetName())
		}
	}
	require.Equal(t, []string{"kubescribe-metrics"}, selected)
	svc := Find(objs, "Service", "kubescribe-metrics")
	svcPorts, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	require.Len(t, endpoints, 1)
	ep := endpoints[0].(map[string]any)
	require.Equal(t, svcPorts[0].(map[string]any)["name"], ep["port"])
	require.Equal(t, "https", ep["scheme"])
	require.Equal(t, "/metrics", ep["path"])
	require.Equal(t, "/var/run/secrets/kubernetes.io/serviceaccount/token", ep["bearerTokenFile"])

	// TLS: the CA of the Secret kubescribe serves, under a name its certificate holds.
	serverName, _, _ := unstructured.NestedString(ep, "tlsConfig", "serverName")
	require.Equal(t, "kubescribe-metrics."+namespace+".svc", serverName)
	caSecret, _, _ := unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "name")
	caKey, _, _ := unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "key")
	require.Equal(t, "ca.crt", caKey)
	dep := Find(objs, "Deployment", "kubescribe")
	c, volumes, err := Container(dep, "kubescribe")
	require.NoError(t, err)
	// Self-managed TLS (components/self-managed-tls): kubescribe mints the certificate into the
	// Secret it names, for its Services' names (the metrics Service's among them).
	if i := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--tls-self-managed-secret=") }); i >= 0 {
		require.Equal(t, "--tls-self-managed-secret="+namespace+"/"+caSecret, c.Args[i], "the ServiceMonitor trusts the CA of the Secret kubescribe serves")
		require.False(t, slices.ContainsFunc(c.Args, func(a string) bool {
			return strings.HasPrefix(a, "--tls-self-managed-services=") && !strings.Contains(a, "kubescribe-metrics")
		}), "the certificate names the metrics Service")
	} else {
		checkServedCA(t, objs, volumes, caSecret, serverName)
	}

	// The binding gives a ServiceAccount kubescribe-metrics-reader, which grants get /metrics.
	var crb rbacv1.ClusterRoleBinding
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(Find(objs, "ClusterRoleBinding", "kubescribe-metrics-prometheus").Object, &crb))
	require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubescribe-metrics-reader"}, crb.RoleRef)
	require.Len(t, crb.Subjects, 1)
	require.Equal(t, rbacv1.ServiceAccountKind, crb.Subjects[0].Kind)
	require.NotEmpty(t, crb.Subjects[0].Namespace)
	var reader rbacv1.ClusterRole
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(Find(objs, "ClusterRole", "kubescribe-metrics-reader").Object, &reader))
	require.Equal(t, []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}, reader.Rules)

	// The dashboard: one JSON document under the sidecar's label.
	cm := Find(objs, "ConfigMap", "kubescribe-dashboard")
	require.Equal(t, "1", cm.GetLabels()["grafana_dashboard"])
	files, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	require.Len(t, files, 1)
	var dash map[string]any
	require.NoError(t, json.Unmarshal([]byte(files["kubescribe.json"]), &dash))
	require.Equal(t, "kubescribe", dash["uid"])
}

func hasLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestDashboardAndAlertsUseRegisteredMetrics: every metric the dashboard and the alerts query
// is one kubescribe registers, with the labels it has, and the dashboard shows what
// docs/operations.md says to watch.
func TestDashboardAndAlertsUseRegisteredMetrics(t *testing.T) {
	registered := registeredMetrics(t)
	dir := filepath.Join(root, "deploy", "components", "monitoring")

	b, err := os.ReadFile(filepath.Join(dir, "dashboard.json"))
	require.NoError(t, err)
	var dash dashboard
	require.NoError(t, json.Unmarshal(b, &dash))
	used := map[string]bool{}
	check := func(where, expr string) {
		t.Helper()
		refs, err := parsePromQL(expr)
		require.NoError(t, err, "%s: %s", where, expr)
		require.NotEmpty(t, refs.metrics, "%s: %s names no metric", where, expr)
		for _, problem := range refs.check(registered) {
			t.Errorf("%s: %s\n  in %s", where, problem, expr)
		}
		for _, m := range refs.metrics {
			used[m.name] = true
		}
	}
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		require.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, "panel %q is wider than the dashboard", p.Title)
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Description, "panel %q says what it shows", p.Title)
		require.Equal(t, "${datasource}", p.Datasource.UID, "panel %q", p.Title)
		require.NotEmpty(t, p.Targets, "panel %q", p.Title)
		for _, target := range p.Targets {
			require.Equal(t, "${datasource}", target.Datasource.UID, "panel %q", p.Title)
			check("panel "+p.Title, target.Expr)
		}
		// A description that names a metric names a real one.
		for _, name := range metricToken.FindAllString(p.Description, -1) {
			_, ok := registered[histogramBase(name, registered)]
			require.True(t, ok, "panel %q describes %s, which kubescribe does not register", p.Title, name)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		require.NotNil(t, m, "variable %s: want label_values(SELECTOR, LABEL)", v.Name)
		refs, err := parsePromQL(m[1])
		require.NoError(t, err)
		refs.grouping = append(refs.grouping, m[2])
		require.Empty(t, refs.check(registered), "variable %s", v.Name)
	}

	// What docs/operations.md lists as worth watching is on the dashboard.
	for _, name := range []string{
		"kubescribe_audit_requests_total", "kubescribe_audit_refused_total",
		"kubescribe_attribution_joins_total", "kubescribe_attribution_resume_waits_total",
		"kubescribe_attribution_resume_waiting_changes", "kubescribe_attribution_pending_changes",
		"kubescribe_git_pending_changes", "kubescribe_git_unpushed_commits", "kubescribe_git_push_total",
		"kubescribe_admission_candidates_total", "kubescribe_watch_informers", "kubescribe_redis_requests_total",
		"process_resident_memory_bytes",
	} {
		require.True(t, used[name], "the dashboard shows no %s", name)
	}

	b, err = os.ReadFile(filepath.Join(dir, "prometheusrule.yaml"))
	require.NoError(t, err)
	objs, err := Objects(b)
	require.NoError(t, err)
	require.Len(t, objs, 1)
	groups, _, _ := unstructured.NestedSlice(objs[0].Object, "spec", "groups")
	require.NotEmpty(t, groups)
	alerts := map[string]bool{}
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			require.NotEmpty(t, name, "every rule is an alert")
			require.False(t, alerts[name], "alert %s twice", name)
			alerts[name] = true
			expr, _ := rule["expr"].(string)
			check("alert "+name, expr)
			severity, _, _ := unstructured.NestedString(rule, "labels", "severity")
			require.NotEmpty(t, severity, "alert %s", name)
			for _, a := range []string{"summary", "description"} {
				text, _, _ := unstructured.NestedString(rule, "annotations", a)
				require.NotEmpty(t, text, "alert %s: %s", name, a)
			}
			if d, ok := rule["for"].(string); ok {
				_, err := time.ParseDuration(d)
				require.NoError(t, err, "alert %s", name)
			}
		}
	}
}

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	Panels []struct {
		ID          int    `json:"id"`
		Type        string `json:"type"`
		Title       string `json:"title"`
		Description string `json:"description"`
		GridPos     struct {
			X int `json:"x"`
			W int `json:"w"`
		} `json:"gridPos"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr       string `json:"expr"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

var (
	metricToken = regexp.MustCompile(`\b(?:kubescribe|go|process)_[a-z0-9_]+`)
	labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	// descName and descLabels read a prometheus.Desc's String(), which is the only place its
	// name and variable labels are exported.
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// registeredMetrics are the metrics a kubescribe server registers, with their labels: those of
// the Registry internal/app builds (the Go and process collectors as cmd/server adds them, and
// the admission listener's, enabled here), read from its descriptors, so that a vector with
// no series yet counts.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	dir := t.TempDir()
	ca, err := controlplane.NewCA("test")
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.Issue("kubescribe", []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, false)
	require.NoError(t, err)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	o := app.DefaultOptions()
	o.TLSCertFile, o.TLSKeyFile = write("tls.crt", certPEM), write("tls.key", keyPEM)
	o.AuditTokenFile = write("audit-token", []byte("audit-token\n"))
	o.AdmissionTokenFile = write("admission-token", []byte("admission-token\n"))
	o.AuditListenAddress, o.OpsListenAddress, o.MetricsListenAddress, o.AdmissionListenAddress = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	o.RedisAddr = "127.0.0.1:1" // never dialled: the app does not run
	o.RestConfig = &rest.Config{Host: "https://127.0.0.1:1"}
	o.ShutdownTimeout, o.ShutdownDelay = 5*time.Second, 0
	o.Logger = slog.New(slog.DiscardHandler)
	o.Registry = prometheus.NewRegistry()
	// As cmd/server does (internal/app adds the same when it makes the Registry itself).
	o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a, err := app.New(o)
	require.NoError(t, err)
	t.Cleanup(func() {
		// Run on a cancelled context starts nothing that lasts and releases the listeners.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = a.Run(ctx)
	})

	descs := make(chan *prometheus.Desc)
	go func() { o.Registry.Describe(descs); close(descs) }()
	out := map[string][]string{}
	for d := range descs {
		s := d.String()
		name, labels := descName.FindStringSubmatch(s), descLabels.FindStringSubmatch(s)
		require.NotNil(t, name, "cannot read the name of %s", s)
		require.NotNil(t, labels, "cannot read the labels of %s", s)
		var ls []string
		for _, l := range strings.Split(labels[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				ls = append(ls, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
			}
		}
		out[name[1]] = ls
	}
	require.Contains(t, out, "kubescribe_audit_requests_total", "the registry was read")
	require.Equal(t, []string{"code"}, out["kubescribe_audit_requests_total"])
	return out
}

// checkServedCA: the Secret mounted as the Deployment's volume tls is caSecret, and its CA
// verifies its certificate under serverName (or cert-manager issues it for that name).
func checkServedCA(t *testing.T, objs []*unstructured.Unstructured, volumes []corev1.Volume, caSecret, serverName string) {
	t.Helper()
	i := slices.IndexFunc(volumes, func(v corev1.Volume) bool { return v.Name == "tls" })
	require.GreaterOrEqual(t, i, 0)
	require.Equal(t, volumes[i].Secret.SecretName, caSecret, "the ServiceMonitor trusts the CA of the Secret kubescribe serves")
	data, err := secretData(objs, caSecret)
	require.NoError(t, err)
	if string(data["tls.crt"]) == IssuedByCertManager {
		cert := Find(objs, "Certificate", caSecret)
		dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		require.Contains(t, dnsNames, serverName)
	} else {
		block, _ := pem.Decode(data["tls.crt"])
		require.NotNil(t, block)
		serving, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		roots := x509.NewCertPool()
		require.True(t, roots.AppendCertsFromPEM(data["ca.crt"]))
		_, err = serving.Verify(x509.VerifyOptions{DNSName: serverName, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		require.NoError(t, err, "Prometheus verifies the serving certificate with ca.crt under %s", serverName)
	}
}
