package controller

import (
	"cmp"
	"context"
	"github.com/kubescribe/kubescribe/internal/testlog"
	"k8s.io/apimachinery/pkg/api/equality"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubescribe/kubescribe/internal/gittest"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/git"
	"github.com/kubescribe/kubescribe/internal/watch"
)

const (
	testNS      = "team-a"
	testCluster = "local"
	// testPassword is the access token every credentials Secret of these tests holds; no status
	// message, sync error or log may ever contain it.
	testPassword = "tok-7f3c9a1e-never-print-me"
	// testGeneration is the metadata.generation of every seeded object, so observedGeneration
	// assertions cannot pass by accident with a zero value.
	testGeneration = 3
)

// bareRepo, as a GitProvider URL, stands for the fixture's bare repository (created in
// t.TempDir() by newFixture, reached offline through a file:// URL).
const bareRepo = "file:///the-fixture-bare-repository.git"

var (
	configMapsGVR   = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	widgetsGVR      = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	clusterRolesGVR = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}
)

func nn(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: testNS, Name: name}
}

// ---------------------------------------------------------------------------------------------
// Fakes for the controller's seams.

type probeCall struct {
	url   string
	creds git.Credentials
}

// fakeProbe stands in for git.Probe: it records every call and answers with err.
type fakeProbe struct {
	mu    sync.Mutex
	err   error
	calls []probeCall
}

func (p *fakeProbe) probe(_ context.Context, url string, creds git.Credentials) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, probeCall{url: url, creds: creds})
	return p.err
}

func (p *fakeProbe) setErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

func (p *fakeProbe) recorded() []probeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]probeCall(nil), p.calls...)
}

// joinRecorder stands in for the attribution joiner: it records each change and delivers it,
// attributed to alice.
type joinRecorder struct {
	mu      sync.Mutex
	changes []watch.Change
}

func (j *joinRecorder) join(ch watch.Change, deliver func(attribution.AttributedChange)) {
	j.mu.Lock()
	j.changes = append(j.changes, ch)
	j.mu.Unlock()
	deliver(attributed(ch))
}

func (j *joinRecorder) recorded() []watch.Change {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]watch.Change(nil), j.changes...)
}

// fakeDropper stands in for the cursor store: it records which cursors the controller drops.
type fakeDropper struct {
	mu      sync.Mutex
	err     error    // when set, every drop fails with it
	dropped []string // "<cluster> <target> <destination>", or "<target>" for a whole target
}

func (d *fakeDropper) setErr(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.err = err
}

func (d *fakeDropper) DropDestination(_ context.Context, cluster string, target types.NamespacedName, destination string) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return 0, d.err
	}
	d.dropped = append(d.dropped, cluster+" "+target.String()+" "+destination)
	return 1, nil
}

func (d *fakeDropper) DropTarget(_ context.Context, target types.NamespacedName) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return 0, d.err
	}
	d.dropped = append(d.dropped, target.String())
	return 1, nil
}

func (d *fakeDropper) recorded() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dropped...)
}

func attributed(ch watch.Change) attribution.AttributedChange {
	return attribution.AttributedChange{
		Change: ch,
		Author: attribution.Author{Identity: audit.Identity{Username: "alice"}, Resolved: true, AuditID: "audit-1", Verb: "update"},
	}
}

// renderName is a trivial Render: the declared form is the object's name.
func renderName(u *unstructured.Unstructured) ([]byte, error) {
	return []byte("name: " + u.GetName() + "\n"), nil
}

// gatedClient delays List of one resource until gate is closed, outside the fake client's
// lock (a blocking reactor would hold that lock and stall every other fake call). It lets a
// test observe a stream that has started but not finished its initial list.
type gatedClient struct {
	dynamic.Interface
	gvr  schema.GroupVersionResource
	gate <-chan struct{}
}

// IsWatchListSemanticsUnSupported keeps the reflector on list+watch, as it does for the
// wrapped fake.
func (g gatedClient) IsWatchListSemanticsUnSupported() bool { return true }

func (g gatedClient) Resource(r schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	ri := g.Interface.Resource(r)
	if r != g.gvr {
		return ri
	}
	return gatedResource{NamespaceableResourceInterface: ri, gate: g.gate}
}

type gatedResource struct {
	dynamic.NamespaceableResourceInterface
	gate <-chan struct{}
}

func (g gatedResource) Namespace(ns string) dynamic.ResourceInterface {
	return gatedNamespaced{ResourceInterface: g.NamespaceableResourceInterface.Namespace(ns), gate: g.gate}
}

type gatedNamespaced struct {
	dynamic.ResourceInterface
	gate <-chan struct{}
}

func (g gatedNamespaced) List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.ResourceInterface.List(ctx, opts)
}

type lockedBuffer = testlog.Buffer

// ---------------------------------------------------------------------------------------------
// Discovery.

func apiResource(name string, namespaced bool, verbs ...string) metav1.APIResource {
	return metav1.APIResource{Name: name, Namespaced: namespaced, Verbs: verbs}
}

var listWatch = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// coreV1 serves v1 configmaps (namespaced) and v1 namespaces (cluster-scoped).
func coreV1() []*metav1.APIResourceList {
	return []*metav1.APIResourceList{{
		GroupVersion: "v1",
		APIResources: []metav1.APIResource{
			apiResource("configmaps", true, listWatch...),
			apiResource("namespaces", false, listWatch...),
		},
	}}
}

// newDiscovery returns the fake clientset's discovery serving resources, behind the in-memory
// cache the application puts in front of discovery (FakeDiscovery alone answers
// ServerPreferredResources with nothing).
func newDiscovery(resources []*metav1.APIResourceList) (*fakediscovery.FakeDiscovery, discovery.CachedDiscoveryInterface) {
	fd := kubefake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
	fd.Resources = resources
	return fd, memory.NewMemCacheClient(fd)
}

// rawDiscovery answers ServerPreferredResources with its lists exactly as given, subresources
// and all, to exercise resolveRules' own filtering.
type rawDiscovery struct {
	*fakediscovery.FakeDiscovery
	lists []*metav1.APIResourceList
	err   error
}

func (d rawDiscovery) ServerPreferredResources() ([]*metav1.APIResourceList, error) {
	return d.lists, d.err
}

// ServerGroupsAndResources serves the lists as given; the first list of a group is its
// preferred version.
func (d rawDiscovery) ServerGroupsAndResourcesWithContext(context.Context) ([]*metav1.APIGroup, []*metav1.APIResourceList, error) {
	return d.ServerGroupsAndResources()
}

func (d rawDiscovery) ServerGroupsAndResources() ([]*metav1.APIGroup, []*metav1.APIResourceList, error) {
	fd := kubefake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
	fd.Resources = d.lists
	groups, lists, _ := fd.ServerGroupsAndResources()
	return groups, lists, d.err
}

// ---------------------------------------------------------------------------------------------
// Object builders.

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: kind}
}

func objectMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: testNS, Name: name, Generation: testGeneration, UID: types.UID("uid-" + name)}
}

func newProvider(name, url string, mutate ...func(*v1alpha1.GitProvider)) *v1alpha1.GitProvider {
	p := &v1alpha1.GitProvider{
		TypeMeta:   typeMeta("GitProvider"),
		ObjectMeta: objectMeta(name),
		Spec: v1alpha1.GitProviderSpec{
			URL:          url,
			SecretRef:    &v1alpha1.LocalObjectReference{Name: "creds"},
			CommitWindow: &metav1.Duration{Duration: 20 * time.Millisecond},
		},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func newTarget(name, provider, branch, path string, mutate ...func(*v1alpha1.GitTarget)) *v1alpha1.GitTarget {
	t := &v1alpha1.GitTarget{
		TypeMeta:   typeMeta("GitTarget"),
		ObjectMeta: objectMeta(name),
		Spec: v1alpha1.GitTargetSpec{
			ProviderRef: v1alpha1.LocalObjectReference{Name: provider},
			Branch:      branch,
			Path:        path,
		},
	}
	for _, m := range mutate {
		m(t)
	}
	return t
}

func newRule(name, target string, rules ...v1alpha1.ResourceRule) *v1alpha1.WatchRule {
	return &v1alpha1.WatchRule{
		TypeMeta:   typeMeta("WatchRule"),
		ObjectMeta: objectMeta(name),
		Spec: v1alpha1.WatchRuleSpec{
			TargetRef: v1alpha1.LocalObjectReference{Name: target},
			Rules:     rules,
		},
	}
}

func rule(groups, resources []string, ops ...v1alpha1.Operation) v1alpha1.ResourceRule {
	return v1alpha1.ResourceRule{APIGroups: groups, Resources: resources, Operations: ops}
}

func newSecret(name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name},
		Data:       map[string][]byte{},
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func newConfigMap(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace(testNS)
	u.SetName(name)
	u.SetUID(types.UID("uid-cm-" + name))
	_ = unstructured.SetNestedField(u.Object, "on", "data", "feature")
	return u
}

func toUnstructured(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	require.NoError(t, err)
	return &unstructured.Unstructured{Object: content}
}

// ---------------------------------------------------------------------------------------------
// The fixture: a Controller over fake clients, running.

type fixtureConfig struct {
	// objects are kubescribe objects (typed) and source objects (unstructured) to seed.
	objects []runtime.Object
	secrets []runtime.Object
	// sourceDiscovery, when set, replaces the cached fake discovery serving coreV1().
	sourceDiscovery discovery.DiscoveryInterface
	// workers is passed to Run. 0 starts the informers (and what Run sets up for the git
	// workers and watches) without reconcile workers: the test calls the sync functions itself.
	workers int
	// sourceGate, when set, delays the first List of configmaps by the watch streams.
	sourceGate <-chan struct{}
	// sourceClients, when set, builds the clients of remote source clusters.
	sourceClients func(*rest.Config) (SourceClients, error)
	// sourceProbeInterval is Options.SourceProbeInterval; 0: every sync probes again (in the
	// background), and each answer syncs the route's GitTargets (and their rules) again.
	sourceProbeInterval time.Duration
	// ownership is Options.Ownership (nil: a single replica).
	ownership Ownership
	// attributionWebhook is Options.AttributionWebhook.
	attributionWebhook *AttributionWebhookOptions
	// probe, when set, is Options.ProbeRemote instead of the fake (git.Probe, say).
	probe func(context.Context, string, git.Credentials) error
	// routeNamespaces is Options.AuditRouteNamespaces; nil binds the route "edge" to testNS.
	routeNamespaces map[string][]string
	// secretRefs is Options.SecretRefs (nil: Secret references are not checked).
	secretRefs SecretRefVerdicts
}

type fixture struct {
	t       *testing.T
	ctx     context.Context
	dyn     *dynamicfake.FakeDynamicClient
	kube    *kubefake.Clientset
	disc    *fakediscovery.FakeDiscovery
	probe   *fakeProbe
	joined  *joinRecorder
	drops   *fakeDropper
	logs    *lockedBuffer
	router  *git.Router
	sources *watch.Registry
	c       *Controller
	repoDir string // the bare repository GitProviders with URL bareRepo write to
}

func newFixture(t *testing.T, cfg fixtureConfig) *fixture {
	t.Helper()
	// Created first so that it is removed last, after the git workers stopped.
	repoDir := filepath.Join(t.TempDir(), "remote.git")
	runGit(t, "", "init", "--bare", "-q", repoDir)

	objs := make([]runtime.Object, 0, len(cfg.objects))
	for _, o := range cfg.objects {
		if p, ok := o.(*v1alpha1.GitProvider); ok && p.Spec.URL == bareRepo {
			p = p.DeepCopy()
			p.Spec.URL = "file://" + repoDir
			o = p
		}
		objs = append(objs, toUnstructured(t, o))
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.GitProvidersResource:      "GitProviderList",
		v1alpha1.GitTargetsResource:        "GitTargetList",
		v1alpha1.WatchRulesResource:        "WatchRuleList",
		v1alpha1.ClusterWatchRulesResource: "ClusterWatchRuleList",
		namespacesResource:                 "NamespaceList",
		clusterRolesGVR:                    "ClusterRoleList",
		configMapsGVR:                      "ConfigMapList",
		widgetsGVR:                         "WidgetList",

		v1alpha1.CommitRequestsResource: "CommitRequestList",
	}, objs...)
	kube := kubefake.NewClientset(cfg.secrets...)
	fd, cached := newDiscovery(coreV1())
	var dc discovery.DiscoveryInterface = cached
	if cfg.sourceDiscovery != nil {
		dc = cfg.sourceDiscovery
	}
	var source dynamic.Interface = dyn
	if cfg.sourceGate != nil {
		source = gatedClient{Interface: dyn, gvr: configMapsGVR, gate: cfg.sourceGate}
	}
	f := &fixture{
		t:       t,
		ctx:     context.Background(),
		dyn:     dyn,
		kube:    kube,
		disc:    fd,
		probe:   &fakeProbe{},
		joined:  &joinRecorder{},
		drops:   &fakeDropper{},
		logs:    &lockedBuffer{},
		repoDir: repoDir,
	}
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sources, err := watch.NewRegistry(watch.RegistryOptions{
		Render: renderName,
		Emit:   func(ch watch.Change) { f.joined.join(ch, f.router.Deliver) },
		Logger: log,
	})
	require.NoError(t, err)
	f.router = git.NewRouter(git.RouterOptions{Logger: log, Streams: sources})
	f.router.Start(context.Background())
	_, err = sources.AddCluster(testCluster, source, dc)
	require.NoError(t, err)
	sources.Start(context.Background())
	f.sources = sources
	probe := f.probe.probe
	if cfg.probe != nil {
		probe = cfg.probe
	}
	routeNamespaces := cfg.routeNamespaces
	if routeNamespaces == nil {
		routeNamespaces = map[string][]string{"edge": {testNS}}
	}
	c, err := New(Options{
		Client:      dyn,
		Kube:        kube,
		Sources:     sources,
		Cluster:     testCluster,
		Router:      f.router,
		ProbeRemote: probe,
		Logger:      log,
		Cursors:     f.drops,

		NewSourceClients:    cfg.sourceClients,
		SourceProbeInterval: cmp.Or(cfg.sourceProbeInterval, time.Nanosecond),
		Ownership:           cfg.ownership,
		AttributionWebhook:  cfg.attributionWebhook,

		AuditRouteNamespaces: routeNamespaces,
		SecretRefs:           cfg.secretRefs,
	})
	require.NoError(t, err)
	f.c = c

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cfg.workers) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after its context ended")
		}
		f.sources.Stop()
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		require.NoError(t, f.router.Stop(sctx))
		require.NotContains(t, f.logs.String(), testPassword, "the controller logged the password")
	})
	require.Eventually(t, c.Synced, 10*time.Second, 5*time.Millisecond, "controller caches did not sync")
	return f
}

// The sync helpers first wait until the controller's cache holds the object as stored. The
// controller compares a new status with the cached one and skips an unchanged write; in the
// running controller the informer's update event brings a stale cache back to another sync,
// but these tests run no reconcile workers, so they sync only against a current cache.
func (f *fixture) syncProvider(name string) error {
	f.waitCached(kindProvider, v1alpha1.GitProvidersResource, name)
	return f.c.syncProvider(f.ctx, nn(name))
}

func (f *fixture) syncTarget(name string) error {
	f.waitCached(kindTarget, v1alpha1.GitTargetsResource, name)
	return f.c.syncTarget(f.ctx, nn(name))
}

func (f *fixture) syncRule(name string) error {
	f.waitCached(kindRule, v1alpha1.WatchRulesResource, name)
	return f.c.syncRule(f.ctx, nn(name))
}

// waitCached waits until the informer cache holds the object as stored, or its absence when it
// does not exist. The fake dynamic client assigns no resourceVersions, so whole objects are
// compared.
func (f *fixture) waitCached(k kind, gvr schema.GroupVersionResource, name string) {
	f.t.Helper()
	f.waitCachedIn(k, gvr, nn(name))
}

// waitCachedIn is waitCached for an object of any namespace.
func (f *fixture) waitCachedIn(k kind, gvr schema.GroupVersionResource, name types.NamespacedName) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		var want map[string]any
		if u, err := f.dyn.Resource(gvr).Namespace(name.Namespace).Get(context.Background(), name.Name, metav1.GetOptions{}); err == nil {
			want = u.Object
		}
		var got map[string]any
		if obj, exists, _ := f.c.informers[k].GetIndexer().GetByKey(name.String()); exists {
			got = obj.(*unstructured.Unstructured).Object
		}
		return equality.Semantic.DeepEqual(got, want)
	}, 5*time.Second, time.Millisecond, "the controller's cache of %s %q did not catch up", k, name)
}

// getObject reads an object back through the fake dynamic client: what the controller wrote.
func (f *fixture) getObject(gvr schema.GroupVersionResource, name string, out runtime.Object) {
	f.t.Helper()
	u, err := f.dyn.Resource(gvr).Namespace(testNS).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(f.t, err)
	require.NoError(f.t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out))
}

// settings are the last settings of provider name that worked, as the controller keeps them
// (nil for none).
func (f *fixture) settings(name string) *git.Remote {
	f.c.mu.RLock()
	defer f.c.mu.RUnlock()
	return f.c.providers[nn(name)]
}

func (f *fixture) provider(name string) v1alpha1.GitProvider {
	f.t.Helper()
	var p v1alpha1.GitProvider
	f.getObject(v1alpha1.GitProvidersResource, name, &p)
	return p
}

func (f *fixture) target(name string) v1alpha1.GitTarget {
	f.t.Helper()
	var t v1alpha1.GitTarget
	f.getObject(v1alpha1.GitTargetsResource, name, &t)
	return t
}

func (f *fixture) watchRule(name string) v1alpha1.WatchRule {
	f.t.Helper()
	var r v1alpha1.WatchRule
	f.getObject(v1alpha1.WatchRulesResource, name, &r)
	return r
}

// route returns the target's route, if it has one.
func (f *fixture) route(name string) (git.RouteInfo, bool) {
	return f.router.RouteOf(nn(name))
}

// readyCondition returns the Ready condition, failing the test when there is none.
func readyCondition(t *testing.T, conds []metav1.Condition) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(conds, v1alpha1.ConditionReady)
	require.NotNil(t, c, "no Ready condition in %v", conds)
	return *c
}

// requireReady checks the Ready condition and the generation it was computed from.
func requireReady(t *testing.T, conds []metav1.Condition, observed int64, status metav1.ConditionStatus, reason string, msgParts ...string) metav1.Condition {
	t.Helper()
	c := readyCondition(t, conds)
	require.Equal(t, status, c.Status, "Ready status (reason %s: %s)", c.Reason, c.Message)
	require.Equal(t, reason, c.Reason, "Ready reason (message %q)", c.Message)
	require.EqualValues(t, testGeneration, c.ObservedGeneration, "condition observedGeneration")
	require.EqualValues(t, testGeneration, observed, "status observedGeneration")
	for _, part := range msgParts {
		require.Contains(t, c.Message, part)
	}
	require.NotContains(t, c.Message, testPassword)
	return c
}

// ---------------------------------------------------------------------------------------------
// git CLI helpers, for reading what the workers pushed to the bare repository.

func runGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return gittest.Run(t, dir, args...)
}

func gitOutput(dir string, args ...string) (string, error) { return gittest.Output(dir, args...) }

// branchFiles lists the files of branch in the bare repository; nil while the branch does not
// exist.
func branchFiles(gitDir, branch string) []string {
	out, err := gitOutput("", "--git-dir="+gitDir, "ls-tree", "-r", "--name-only", "refs/heads/"+branch)
	if err != nil || out == "" {
		return nil
	}
	return strings.Split(out, "\n")
}
