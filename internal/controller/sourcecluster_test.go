package controller

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// kubeconfigFor is a kubeconfig for server with an inline token; edit changes it before it
// is written out.
func kubeconfigFor(server, token string, edit ...string) string {
	kc := `apiVersion: v1
kind: Config
current-context: edge
contexts:
- name: edge
  context: {cluster: edge, user: kubescribe}
clusters:
- name: edge
  cluster:
    server: ` + server + `
    certificate-authority-data: ` + "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==" + `
users:
- name: kubescribe
  user:
    token: ` + token + "\n"
	for _, e := range edit {
		kc += e
	}
	return kc
}

func TestRestConfigFromKubeconfig(t *testing.T) {
	const server = "https://edge.example:6443"
	tests := []struct {
		name              string
		kubeconfig        string
		allowExec, allowI bool
		wantReason        string
		wantMsg           string
	}{
		{name: "inline token", kubeconfig: kubeconfigFor(server, "tok")},
		{name: "empty", kubeconfig: " \n", wantReason: v1alpha1.ReasonSecretInvalid, wantMsg: "empty"},
		{name: "not yaml", kubeconfig: "{", wantReason: v1alpha1.ReasonSecretInvalid, wantMsg: "not a kubeconfig"},
		{name: "no context", kubeconfig: "apiVersion: v1\nkind: Config\n", wantReason: v1alpha1.ReasonSecretInvalid, wantMsg: "current-context"},
		{name: "exec plugin", kubeconfig: kubeconfigFor(server, "tok", "    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, interactiveMode: Never}\n"),
			wantReason: v1alpha1.ReasonKubeConfigExecPlugin, wantMsg: "--allow-remote-kubeconfig-exec"},
		{name: "exec plugin allowed", allowExec: true,
			kubeconfig: kubeconfigFor(server, "", "    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/true, interactiveMode: Never}\n")},
		{name: "auth provider", kubeconfig: kubeconfigFor(server, "", "    auth-provider: {name: oidc}\n"),
			wantReason: v1alpha1.ReasonKubeConfigExecPlugin, wantMsg: `"oidc"`},
		{name: "token file", kubeconfig: kubeconfigFor(server, "tok", "    tokenFile: /var/run/token\n"),
			wantReason: v1alpha1.ReasonKubeConfigFileReference, wantMsg: "tokenFile"},
		{name: "client certificate files", kubeconfig: kubeconfigFor(server, "", "    client-certificate: /etc/c.crt\n    client-key: /etc/c.key\n"),
			wantReason: v1alpha1.ReasonKubeConfigFileReference, wantMsg: "client-certificate, client-key"},
		{name: "insecure", kubeconfig: kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", insecure-skip-tls-verify: true}\n"),
			wantReason: v1alpha1.ReasonKubeConfigInsecure, wantMsg: "insecure-skip-tls-verify"},
		{name: "insecure allowed", allowI: true, kubeconfig: kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", insecure-skip-tls-verify: true}\n")},
		{name: "plain http", kubeconfig: kubeconfigFor("http://edge.example:8080", "tok"),
			wantReason: v1alpha1.ReasonKubeConfigInsecure, wantMsg: "http://"},
		{name: "proxy", kubeconfig: kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", proxy-url: \"http://user:pw@proxy.example:3128\"}\n"),
			wantReason: v1alpha1.ReasonKubeConfigProxy, wantMsg: "proxy-url"},
		{name: "socks proxy", kubeconfig: kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", proxy-url: \"socks5://proxy.example:1080\"}\n"),
			wantReason: v1alpha1.ReasonKubeConfigProxy, wantMsg: "HTTPS_PROXY"},
		{name: "tls-server-name and extensions are fine", kubeconfig: kubeconfigFor(server, "tok",
			"clusters:\n- name: edge\n  cluster: {server: "+server+", tls-server-name: edge.internal, disable-compression: true, extensions: [{name: x, extension: {a: b}}]}\n")},
		{name: "CA file", kubeconfig: kubeconfigFor(server, "tok", "clusters:\n- name: edge\n  cluster: {server: "+server+", certificate-authority: /etc/ca.crt}\n"),
			wantReason: v1alpha1.ReasonKubeConfigFileReference, wantMsg: "certificate-authority"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, ref := restConfigFromKubeconfig([]byte(tt.kubeconfig), tt.allowExec, tt.allowI)
			if tt.wantReason == "" {
				require.Nil(t, ref)
				require.Equal(t, server, cfg.Host)
				return
			}
			require.NotNil(t, ref)
			require.Equal(t, tt.wantReason, ref.reason, ref.msg)
			require.Contains(t, ref.msg, tt.wantMsg)
			require.NotContains(t, ref.msg, "tok\n")
			require.NotContains(t, ref.msg, "pw@", "a proxy's password is not quoted")
		})
	}
}

// remoteFake is a remote cluster: it serves widgets, not configmaps, and its probe answers
// with the error setErr set.
type remoteFake struct {
	builds []*rest.Config
	dyns   []*dynamicfake.FakeDynamicClient // the remote's objects, one client per build
	mu     sync.Mutex
	err    error
	// forbidNamespaceWatch has the remote refuse watches of Namespaces (RBAC with list but no
	// watch); namespaceWatches counts them.
	forbidNamespaceWatch bool
	namespaceWatches     atomic.Int32
}

func (r *remoteFake) setErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *remoteFake) probe(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// syncProbed syncs GitTarget name until its SourceClusterReachable condition has reason: the
// remote's probe answers in the background, and a sync reads its last answer.
func (f *fixture) syncProbed(t *testing.T, name, reason string) v1alpha1.GitTarget {
	t.Helper()
	var got v1alpha1.GitTarget
	require.Eventually(t, func() bool {
		require.NoError(t, f.syncTarget(name))
		got = f.target(name)
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionSourceClusterReachable)
		return c != nil && c.Reason == reason
	}, 5*time.Second, 5*time.Millisecond, "GitTarget %s: SourceClusterReachable never became %s", name, reason)
	return got
}

func (r *remoteFake) clients(cfg *rest.Config) (SourceClients, error) {
	r.builds = append(r.builds, cfg)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{widgetsGVR: "WidgetList", namespacesResource: "NamespaceList"},
		newNamespace("edge-a", map[string]string{"team": "a"}), newNamespace("edge-b", map[string]string{"team": "b"}))
	_, dc := newDiscovery([]*metav1.APIResourceList{{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{apiResource("widgets", true, listWatch...)}}})
	if r.forbidNamespaceWatch {
		dyn.PrependWatchReactor("namespaces", func(clienttesting.Action) (bool, watch.Interface, error) {
			r.namespaceWatches.Add(1)
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "", errors.New("RBAC: watch not granted"))
		})
	}
	r.mu.Lock()
	r.dyns = append(r.dyns, dyn)
	r.mu.Unlock()
	return SourceClients{Dynamic: dyn, Discovery: dc, Probe: r.probe}, nil
}

func remoteTarget(name, secret, route string) *v1alpha1.GitTarget {
	return newTarget(name, "git", "main", name, func(t *v1alpha1.GitTarget) {
		t.Spec.SourceCluster = &v1alpha1.SourceCluster{KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: secret}, AuditRoute: route}
	})
}

// TestRemoteSourceCluster: targets naming one route and one kubeconfig share one registry
// entry; their rules resolve against the remote's discovery only; another kubeconfig on the
// route is refused; a rotated kubeconfig rebuilds the clients once; a deleted Secret stops the
// mirror and the entry goes with its last target.
func TestRemoteSourceCluster(t *testing.T) {
	remote := &remoteFake{}
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo),
			remoteTarget("a", "edge-kc", "edge"), remoteTarget("b", "edge-kc", "edge"), remoteTarget("c", "other-kc", "edge"),
			newRule("widgets", "a", rule([]string{"example.com"}, []string{"widgets"})),
			newRule("configmaps", "a", rule([]string{""}, []string{"configmaps"}))},
		secrets: []runtime.Object{credsSecret(),
			newSecret("edge-kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "first")}),
			newSecret("other-kc", map[string]string{"value.yaml": kubeconfigFor("https://other.example:6443", "other")})},
		sourceClients: remote.clients,
	})
	require.NoError(t, f.syncProvider("git"))
	for _, name := range []string{"a", "b"} {
		got := f.syncProbed(t, name, v1alpha1.ReasonReachable)
		requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	}
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "a", SourceCluster: "edge"}, f.target("a").Status.ObservedDestination)
	require.Len(t, remote.builds, 1, "two targets on one route and one kubeconfig share the clients")
	require.NotNil(t, f.sources.Cluster("edge"))

	require.NoError(t, f.syncTarget("c"))
	got := f.target("c")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterConflict, `audit route "edge"`, `team-a/other-kc`)

	// Rules resolve in the remote's catalog: widgets are served there, configmaps only locally.
	var r v1alpha1.WatchRule
	require.Eventually(t, func() bool {
		require.NoError(t, f.syncRule("widgets"))
		r = f.watchRule("widgets")
		return meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ConditionReady)
	}, 5*time.Second, 10*time.Millisecond, "the widgets stream did not finish its initial list")
	requireReady(t, r.Status.Conditions, r.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady, `in cluster "edge"`)
	require.Contains(t, meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ConditionResourcesResolved).Message, `resolved in cluster "edge" to example.com/v1/widgets`)
	require.NoError(t, f.syncRule("configmaps"))
	r = f.watchRule("configmaps")
	requireReady(t, r.Status.Conditions, r.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonNoResourcesMatched, `cluster "edge" serves`)

	// Rotation: new content rebuilds the clients once; the same content again does not.
	sec := newSecret("edge-kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "second")})
	sec.ResourceVersion = "2"
	_, err := f.kube.CoreV1().Secrets(testNS).Update(context.Background(), sec, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.syncTarget("a"))
	require.NoError(t, f.syncTarget("b"))
	require.Len(t, remote.builds, 2)
	require.Equal(t, "second", remote.builds[1].BearerToken)

	// An unreachable or refusing remote fails its own targets only.
	remote.setErr(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
	got = f.syncProbed(t, "a", v1alpha1.ReasonUnreachable)
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterUnreachable, "connection refused")
	_, routed := f.route("a")
	require.True(t, routed, "an unreachable remote keeps its targets routed: the watches recover by themselves")
	for err, reason := range map[error]string{
		apierrors.NewUnauthorized("Unauthorized"):                            v1alpha1.ReasonUnauthorized,
		apierrors.NewForbidden(schema.GroupResource{}, "", errors.New("no")): v1alpha1.ReasonForbidden,
	} {
		remote.setErr(err)
		got = f.syncProbed(t, "a", reason)
		requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterUnreachable)
	}
	remote.setErr(nil)

	// Deleting the Secret stops the mirror; the entry goes with its last target.
	require.NoError(t, f.kube.CoreV1().Secrets(testNS).Delete(context.Background(), "edge-kc", metav1.DeleteOptions{}))
	require.NoError(t, f.syncTarget("a"))
	got = f.target("a")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound, `Secret "edge-kc"`)
	_, routed = f.route("a")
	require.False(t, routed)
	require.NotNil(t, f.sources.Cluster("edge"), "target b still uses the cluster")
	require.NoError(t, f.syncTarget("b"))
	require.Nil(t, f.sources.Cluster("edge"), "no target uses the cluster: its entry is removed")

	// Unused is not free: the route still belongs to its oldest claimant, a, whose Secret is
	// gone; c's other kubeconfig stays refused until a and b no longer name the route.
	require.NoError(t, f.syncTarget("c"))
	got = f.target("c")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterConflict, "team-a/a")
	require.Nil(t, f.sources.Cluster("edge"))
	for _, name := range []string{"a", "b"} {
		require.NoError(t, f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Delete(context.Background(), name, metav1.DeleteOptions{}))
		require.NoError(t, f.syncTarget(name))
	}
	require.NoError(t, f.syncTarget("c"))
	got = f.target("c")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Len(t, remote.builds, 3)
}

// TestRemoteProbeDoesNotHoldTheController: a remote that does not answer (its probe blocks)
// holds up no reconcile: the GitTargets of its route share one probe, running in the
// background, and say SourceClusterReachable=Unknown until it answers.
func TestRemoteProbeDoesNotHoldTheController(t *testing.T) {
	release := make(chan struct{})
	var calls atomic.Int32
	blocked := func(cfg *rest.Config) (SourceClients, error) {
		c, err := (&remoteFake{}).clients(cfg)
		c.Probe = func(context.Context) error {
			calls.Add(1)
			<-release // a blackholed address: no answer, whatever the context says
			return nil
		}
		return c, err
	}
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), remoteTarget("a", "edge-kc", "edge"), remoteTarget("b", "edge-kc", "edge")},
		secrets: []runtime.Object{credsSecret(),
			newSecret("edge-kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "first")})},
		sourceClients: blocked,
	})
	defer close(release)
	require.NoError(t, f.syncProvider("git"))
	for _, name := range []string{"a", "b", "a"} {
		require.NoError(t, f.syncTarget(name)) // returns although the probe does not
		reach := meta.FindStatusCondition(f.target(name).Status.Conditions, v1alpha1.ConditionSourceClusterReachable)
		require.NotNil(t, reach)
		require.Equal(t, metav1.ConditionUnknown, reach.Status)
		require.Equal(t, v1alpha1.ReasonProgressing, reach.Reason)
	}
	require.Equal(t, int32(1), calls.Load(), "one probe per route at a time")
}

// TestRemoteSourceClusterRefusals: the route of the local cluster cannot be claimed, and a
// refused kubeconfig leaves nothing registered.
func TestRemoteSourceClusterRefusals(t *testing.T) {
	remote := &remoteFake{}
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), remoteTarget("local", "kc", testCluster), remoteTarget("exec", "exec-kc", "edge")},
		secrets: []runtime.Object{credsSecret(),
			newSecret("kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "tok")}),
			newSecret("exec-kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "", "    exec: {apiVersion: client.authentication.k8s.io/v1, command: x, interactiveMode: Never}\n")})},
		sourceClients: remote.clients,
	})
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("local"))
	got := f.target("local")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterConflict, "--cluster-name")
	require.NoError(t, f.syncTarget("exec"))
	got = f.target("exec")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonKubeConfigExecPlugin, `Secret "exec-kc" key "value"`)
	require.Nil(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionSourceClusterReachable))
	require.Empty(t, remote.builds)
	require.Equal(t, []string{testCluster}, f.sources.Names())
}

// TestRemoteClusterRuleNamespaceSelector: a ClusterWatchRule's namespaceSelector on a remote
// GitTarget selects the remote's namespaces, not the local ones, and follows them as they are
// relabelled there (the rule's own recheck is a minute away: the remote's Namespaces are
// watched).
func TestRemoteClusterRuleNamespaceSelector(t *testing.T) {
	remote := &remoteFake{}
	f := remoteSelectorFixture(t, remote)
	var got v1alpha1.ClusterWatchRule
	waitFor(t, 15*time.Second, "the rule to be Ready", func() bool {
		got = f.clusterRule("by-label")
		return conditionOf(got.Status.Conditions, v1alpha1.ConditionReady).Status == metav1.ConditionTrue
	})
	require.Equal(t, []string{"edge-a"}, got.Status.Namespaces)
	require.Contains(t, conditionOf(got.Status.Conditions, v1alpha1.ConditionReady).Message, `in cluster "edge"`)
	require.Contains(t, f.logs.String(), "watching the namespaces of a remote source cluster for namespaceSelector")

	remote.mu.Lock()
	dyn := remote.dyns[len(remote.dyns)-1]
	remote.mu.Unlock()
	_, err := dyn.Resource(namespacesResource).Update(context.Background(), newNamespace("edge-b", map[string]string{"team": "a"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, 15*time.Second, "the namespace watch to see the change", func() bool {
		return strings.Contains(f.logs.String(), "a namespace of a remote source cluster changed; re-evaluating the ClusterWatchRules that select namespaces") &&
			strings.Contains(f.logs.String(), "namespace=edge-b")
	})
	waitFor(t, 15*time.Second, "the relabelled remote namespace selected", func() bool {
		return slices.Equal(f.clusterRule("by-label").Status.Namespaces, []string{"edge-a", "edge-b"})
	})
	require.NoError(t, dyn.Resource(namespacesResource).Delete(context.Background(), "edge-a", metav1.DeleteOptions{}))
	waitFor(t, 15*time.Second, "the deleted remote namespace dropped", func() bool {
		return slices.Equal(f.clusterRule("by-label").Status.Namespaces, []string{"edge-b"})
	})
}

// remoteSelectorFixture runs the controller with GitTarget "web" mirroring the remote cluster
// "edge" of remote, and ClusterWatchRule "by-label" selecting its widgets in the namespaces
// labelled team=a; the local cluster has such a namespace too.
func remoteSelectorFixture(t *testing.T, remote *remoteFake) *fixture {
	t.Helper()
	return newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", bareRepo), remoteTarget("web", "edge-kc", "edge"),
			newNamespace("local-a", map[string]string{"team": "a"}),
			newClusterRule("by-label", func(r *v1alpha1.ClusterWatchRule) {
				r.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
			}, rule([]string{"example.com"}, []string{"widgets"}))},
		secrets: []runtime.Object{credsSecret(),
			newSecret("edge-kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "tok")})},
		sourceClients: remote.clients,
		workers:       1,
		// No probe answer syncs the GitTarget (and so its rules) again while the test runs.
		sourceProbeInterval: time.Hour,
	})
}

// TestRemoteNamespaceWatchRefused: a remote that grants list but not watch on Namespaces. The
// failing watch is reported once, its cache is not trusted, and the rule lists the namespaces
// at each evaluation (one per failed attempt), so a relabel is still followed; the reflector's
// relists do not re-evaluate the rules for every unchanged namespace.
func TestRemoteNamespaceWatchRefused(t *testing.T) {
	remote := &remoteFake{forbidNamespaceWatch: true}
	f := remoteSelectorFixture(t, remote)
	waitFor(t, 15*time.Second, "the rule to be Ready", func() bool {
		got := f.clusterRule("by-label")
		return conditionOf(got.Status.Conditions, v1alpha1.ConditionReady).Status == metav1.ConditionTrue &&
			slices.Equal(got.Status.Namespaces, []string{"edge-a"})
	})
	waitFor(t, 20*time.Second, "the refused watch to be tried again", func() bool { return remote.namespaceWatches.Load() >= 3 })
	logs := f.logs.String()
	require.Equal(t, 1, strings.Count(logs, "the watch of a remote source cluster's namespaces failed"), "reported once: %s", logs)
	require.NotContains(t, logs, "a namespace of a remote source cluster changed", "a relist of unchanged namespaces re-evaluates nothing")

	remote.mu.Lock()
	dyn := remote.dyns[len(remote.dyns)-1]
	remote.mu.Unlock()
	_, err := dyn.Resource(namespacesResource).Update(context.Background(), newNamespace("edge-b", map[string]string{"team": "a"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the relabelled namespace selected, from a list", func() bool {
		return slices.Equal(f.clusterRule("by-label").Status.Namespaces, []string{"edge-a", "edge-b"})
	})
}
