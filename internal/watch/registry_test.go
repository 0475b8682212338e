package watch

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func configMap(name, rv string, data map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "namespace": "demo", "uid": "uid-" + name, "resourceVersion": rv},
		"data":     data,
	}}
	return u
}

// renderData is a stand-in for the declared form: the data only.
func renderData(u *unstructured.Unstructured) ([]byte, error) {
	return json.Marshal(u.Object["data"])
}

func TestStreamEmitsSnapshotChangesAndDedups(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("existing", "1", map[string]any{"a": "1"}))
	m, changes := startCluster(t, client, RegistryOptions{})
	ctx := context.Background()
	target := types.NamespacedName{Namespace: "demo", Name: "target"}
	m.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo", Operations: []Op{OpCreate, OpUpdate}}})

	next := func() Change { t.Helper(); return nextChange(t, changes) }
	snap := next()
	require.True(t, snap.Snapshot)
	require.Equal(t, "existing", snap.Name)
	require.Equal(t, "local", snap.Cluster)
	require.Equal(t, target, snap.Target)
	require.Eventually(t, func() bool { ok, _ := m.Status("demo/rule"); return ok }, 5*time.Second, 10*time.Millisecond)

	cms := client.Resource(configMaps).Namespace("demo")
	_, err := cms.Create(ctx, configMap("new", "2", map[string]any{"b": "2"}), metav1.CreateOptions{})
	require.NoError(t, err)
	created := next()
	require.Equal(t, OpCreate, created.Op)
	require.False(t, created.Snapshot)
	require.Equal(t, "uid-new", created.UID)

	// A write that changes nothing declared (only the resourceVersion here) is not a change.
	_, err = cms.Update(ctx, configMap("new", "3", map[string]any{"b": "2"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = cms.Update(ctx, configMap("new", "4", map[string]any{"b": "3"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	updated := next()
	require.Equal(t, OpUpdate, updated.Op)
	require.Equal(t, "4", updated.ResourceVersion)

	// DELETE is not selected by the rule.
	require.NoError(t, cms.Delete(ctx, "new", metav1.DeleteOptions{}))
	select {
	case c := <-changes:
		t.Fatalf("unexpected change %+v", c)
	case <-time.After(100 * time.Millisecond):
	}

	// A second owner selecting DELETE widens the shared stream in place.
	m.Set("demo/other", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo", Operations: []Op{OpDelete}}})
	require.NoError(t, cms.Delete(ctx, "existing", metav1.DeleteOptions{}))
	deleted := next()
	require.Equal(t, OpDelete, deleted.Op)
	require.Nil(t, deleted.Manifest)

	m.Remove("demo/rule")
	m.Remove("demo/other")
}

// TestTargetsShareOneInformer: two targets selecting one resource in one namespace share one
// informer; a target that subscribes later is handed the objects already there as snapshot
// changes, and each target gets every later change once.
func TestTargetsShareOneInformer(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("existing", "1", map[string]any{"a": "1"}))
	m, changes := startCluster(t, client, RegistryOptions{})
	ctx := context.Background()
	next := func() Change { t.Helper(); return nextChange(t, changes) }

	first := types.NamespacedName{Namespace: "demo", Name: "first"}
	second := types.NamespacedName{Namespace: "demo", Name: "second"}
	m.Set("demo/a", "", []StreamSpec{{Target: first, GVR: configMaps, Namespace: "demo"}})
	snap := next()
	require.Equal(t, first, snap.Target)
	require.True(t, snap.Snapshot)
	require.Eventually(t, func() bool { ok, _ := m.Status("demo/a"); return ok }, 5*time.Second, 10*time.Millisecond)

	m.Set("demo/b", "", []StreamSpec{{Target: second, GVR: configMaps, Namespace: "demo"}})
	snap = next()
	require.Equal(t, second, snap.Target, "the late subscriber gets the current state")
	require.True(t, snap.Snapshot)
	require.Equal(t, "existing", snap.Name)
	ok, _ := m.Status("demo/b")
	require.True(t, ok)
	m.mu.Lock()
	require.Len(t, m.informers, 1, "one informer serves both targets")
	m.mu.Unlock()

	_, err := client.Resource(configMaps).Namespace("demo").Create(ctx, configMap("new", "2", map[string]any{"b": "2"}), metav1.CreateOptions{})
	require.NoError(t, err)
	got := map[types.NamespacedName]Change{}
	for range 2 {
		c := next()
		got[c.Target] = c
	}
	require.Equal(t, "new", got[first].Name)
	require.Equal(t, "new", got[second].Name)
	require.False(t, got[second].Snapshot)

	m.Remove("demo/a")
	m.Remove("demo/b")
	m.mu.Lock()
	require.Empty(t, m.informers, "an informer nobody wants stops")
	m.mu.Unlock()
}

func TestRegistryRejectsDuplicateCluster(t *testing.T) {
	reg, err := NewRegistry(RegistryOptions{Render: renderData, Emit: func(Change) {}})
	require.NoError(t, err)
	client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	_, err = reg.AddCluster("local", client, fakeDiscovery())
	require.NoError(t, err)
	_, err = reg.AddCluster("local", client, fakeDiscovery())
	require.ErrorContains(t, err, "already registered")
	require.Nil(t, reg.Cluster("remote"))
}

func fakeDiscovery() discovery.DiscoveryInterface {
	return kubefake.NewClientset().Discovery()
}

func TestUnionOps(t *testing.T) {
	require.Nil(t, unionOps(nil, []Op{OpCreate}))
	require.Equal(t, []Op{OpCreate, OpDelete}, unionOps([]Op{OpDelete}, []Op{OpCreate, OpDelete}))
}

// nextChange returns the next change that is not a sweep.
func nextChange(t *testing.T, changes <-chan Change) Change {
	t.Helper()
	for {
		select {
		case c := <-changes:
			if c.Op == OpSweep {
				continue
			}
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no change emitted")
			return Change{}
		}
	}
}

// startCluster runs a registry with one cluster, "local", over client; the changes it emits
// arrive on the returned channel. opts' Render and Emit are filled in; the registry stops at
// cleanup.
func startCluster(t *testing.T, client dynamic.Interface, opts RegistryOptions) (*Cluster, chan Change) {
	t.Helper()
	changes := make(chan Change, 64)
	opts.Render, opts.Emit = renderData, func(c Change) { changes <- c }
	reg, err := NewRegistry(opts)
	require.NoError(t, err)
	m, err := reg.AddCluster("local", client, fakeDiscovery())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	reg.Start(ctx)
	t.Cleanup(func() { reg.Stop(); cancel() })
	return m, changes
}

// demoTarget is the GitTarget streamDemoConfigMaps streams to, demoStream its stream.
var (
	demoTarget = types.NamespacedName{Namespace: "demo", Name: "t"}
	demoStream = StreamID{Cluster: "local", Target: demoTarget, GVR: configMaps, Namespace: "demo"}
)

// streamDemoConfigMaps runs a cluster over client (startCluster with opts) whose rule streams
// namespace demo's ConfigMaps to demoTarget, sealed by seal when set; it returns the cluster's
// changes once the stream's initial state was handed over, and that state's changes by name.
func streamDemoConfigMaps(t *testing.T, client dynamic.Interface, opts RegistryOptions, seal Sealer) (chan Change, map[string]Change) {
	t.Helper()
	m, changes := startCluster(t, client, opts)
	m.Set("demo/rule", "", []StreamSpec{{Target: demoTarget, GVR: configMaps, Namespace: "demo", Seal: seal}})
	got, _ := collectUntilSweep(t, changes)
	return changes, got
}

// TestReplaceAndRemoveCluster: a cluster whose clients are replaced (a rotated kubeconfig)
// keeps its owners' streams, now fed by the new clients; a removed cluster stops emitting and
// is forgotten.
func TestReplaceAndRemoveCluster(t *testing.T) {
	listKinds := map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"}
	before := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds,
		configMap("old", "1", map[string]any{"a": "1"}))
	after := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds,
		configMap("new", "1", map[string]any{"b": "1"}))
	changes := make(chan Change, 64)
	reg, err := NewRegistry(RegistryOptions{Render: renderData, Emit: func(c Change) { changes <- c }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { reg.Stop(); cancel() })
	reg.Start(ctx)
	_, err = reg.AddCluster("local", dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), fakeDiscovery())
	require.NoError(t, err)
	edge, err := reg.AddCluster("edge", before, fakeDiscovery())
	require.NoError(t, err)
	require.Equal(t, []string{"edge", "local"}, reg.Names())

	target := types.NamespacedName{Namespace: "demo", Name: "target"}
	edge.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})
	c := nextChange(t, changes)
	require.Equal(t, "old", c.Name)
	require.Equal(t, "edge", c.Cluster)

	replaced, err := reg.ReplaceCluster("edge", after, fakeDiscovery())
	require.NoError(t, err)
	require.Same(t, replaced, reg.Cluster("edge"))
	c = nextChange(t, changes)
	require.Equal(t, "new", c.Name, "the owner's stream runs on the new clients")
	require.Eventually(t, func() bool { ok, _ := replaced.Status("demo/rule"); return ok }, 5*time.Second, 10*time.Millisecond)
	// The old clients are no longer watched.
	_, err = before.Resource(configMaps).Namespace("demo").Create(ctx, configMap("ignored", "2", nil), metav1.CreateOptions{})
	require.NoError(t, err)

	require.True(t, reg.RemoveCluster("edge"))
	require.False(t, reg.RemoveCluster("edge"))
	require.Nil(t, reg.Cluster("edge"))
	require.Equal(t, []string{"local"}, reg.Names())
	_, err = after.Resource(configMaps).Namespace("demo").Create(ctx, configMap("late", "2", nil), metav1.CreateOptions{})
	require.NoError(t, err)
	// Everything emitted so far came from the new clients before the removal: drain and check.
	for {
		select {
		case c := <-changes:
			require.NotContains(t, []string{"ignored", "late"}, c.Name, "change %+v emitted after its clients were replaced or removed", c)
			continue
		default:
		}
		break
	}
	replaced.mu.Lock()
	require.Empty(t, replaced.informers)
	replaced.mu.Unlock()
}

// TestFollowingRecordsADestinationWithoutStreams: an owner that declares a destination with no
// streams (its rule matches nothing) still follows it, until it is removed; its changes carry
// the destination it declared.
func TestFollowingRecordsADestinationWithoutStreams(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("existing", "1", map[string]any{"a": "1"}))
	m, changes := startCluster(t, client, RegistryOptions{})
	target := types.NamespacedName{Namespace: "demo", Name: "target"}

	_, ok := m.Following("demo/rule")
	require.False(t, ok, "an owner that declared nothing follows nothing")

	m.Set("demo/rule", "main:apps", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})
	snap := nextChange(t, changes)
	require.Equal(t, "main:apps", snap.Destination)

	m.Set("demo/rule", "main:other", nil)
	d, ok := m.Following("demo/rule")
	require.True(t, ok)
	require.Equal(t, "main:other", d)
	require.Empty(t, m.Streams())
	synced, err := m.Status("demo/rule")
	require.NoError(t, err)
	require.True(t, synced, "no stream waits for its initial state")

	m.Remove("demo/rule")
	_, ok = m.Following("demo/rule")
	require.False(t, ok)
}
