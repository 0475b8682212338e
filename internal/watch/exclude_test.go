package watch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

func managed(entries ...metav1.ManagedFieldsEntry) *unstructured.Unstructured {
	u := configMap("x", "1", nil)
	u.SetManagedFields(entries)
	return u
}

func entry(manager string, sec int, subresource string) metav1.ManagedFieldsEntry {
	t := metav1.NewTime(time.Date(2026, 11, 30, 10, 0, sec, 0, time.UTC))
	return metav1.ManagedFieldsEntry{Manager: manager, Time: &t, Subresource: subresource, Operation: metav1.ManagedFieldsOperationUpdate}
}

func TestNewestManagersExcluded(t *testing.T) {
	excl := []string{"argocd-controller", "kustomize-controller"}
	for _, tt := range []struct {
		name string
		u    *unstructured.Unstructured
		want bool
	}{
		{"no managedFields", managed(), false},
		{"newest is excluded", managed(entry("kubectl", 1, ""), entry("argocd-controller", 2, "")), true},
		{"newest is not excluded", managed(entry("argocd-controller", 1, ""), entry("kubectl", 2, "")), false},
		{"a status write does not count", managed(entry("argocd-controller", 1, ""), entry("kubelet", 2, "status")), true},
		{"a tie excludes only when every tied manager is excluded", managed(entry("argocd-controller", 2, ""), entry("kubectl", 2, "")), false},
		{"a tie of excluded managers excludes", managed(entry("argocd-controller", 2, ""), entry("kustomize-controller", 2, "")), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &compactor{render: renderData}
			require.Equal(t, tt.want, newestManagersExcluded(c.compact(tt.u).managers(), excl))
		})
	}
}

// TestExcludeFieldManagers: a live write whose newest field manager a stream excludes is not
// handed on and is counted; the next write by someone else is, and deletes never are excluded.
func TestExcludeFieldManagers(t *testing.T) {
	existing := configMap("cfg", "1", map[string]any{"a": "1"})
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"}, existing)
	metrics := NewMetrics(prometheus.NewRegistry())
	m, changes := startCluster(t, client, RegistryOptions{Metrics: metrics})
	ctx := context.Background()
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	m.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo",
		ExcludeFieldManagers: []string{"argocd-controller"}, ExcludeUsers: []string{"system:serviceaccount:argocd:app"}}})
	snap := nextChange(t, changes)
	require.True(t, snap.Snapshot, "the initial state is never excluded")
	require.Equal(t, []string{"system:serviceaccount:argocd:app"}, snap.ExcludeUsers, "user exclusions travel to the join")
	// The fake client replays nothing to a watch that starts after a write: write once the
	// informer watches.
	require.Eventually(t, func() bool {
		for _, a := range client.Actions() {
			if a.GetVerb() == "watch" && a.GetResource() == configMaps {
				return true
			}
		}
		return false
	}, 10*time.Second, time.Millisecond, "the informer never watched")

	cms := client.Resource(configMaps).Namespace("demo")
	byArgo := configMap("cfg", "2", map[string]any{"a": "2"})
	byArgo.SetManagedFields([]metav1.ManagedFieldsEntry{entry("kubectl", 1, ""), entry("argocd-controller", 5, "")})
	_, err := cms.Update(ctx, byArgo, metav1.UpdateOptions{})
	require.NoError(t, err)
	byHuman := configMap("cfg", "3", map[string]any{"a": "3"})
	byHuman.SetManagedFields([]metav1.ManagedFieldsEntry{entry("argocd-controller", 5, ""), entry("kubectl", 9, "")})
	_, err = cms.Update(ctx, byHuman, metav1.UpdateOptions{})
	require.NoError(t, err)
	got := nextChange(t, changes)
	require.Equal(t, "3", got.ResourceVersion, "the excluded write is skipped, the next one is not")
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.excludes.WithLabelValues("demo", "t", "", "configmaps", "field_manager")))

	byArgoAgain := configMap("cfg", "4", map[string]any{"a": "4"})
	byArgoAgain.SetManagedFields([]metav1.ManagedFieldsEntry{entry("argocd-controller", 12, "")})
	_, err = cms.Update(ctx, byArgoAgain, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, cms.Delete(ctx, "cfg", metav1.DeleteOptions{}))
	del := nextChange(t, changes)
	require.Equal(t, OpDelete, del.Op, "a delete is never excluded by field manager")
}

// TestCompactTransform: the informers keep identity, the declared form and the managers of
// the newest write (status writes and older writers left out), nothing else of the object.
func TestCompactTransform(t *testing.T) {
	u := configMap("cfg", "7", map[string]any{"a": "1"})
	u.SetManagedFields([]metav1.ManagedFieldsEntry{entry("admin", 1, ""), entry("kubectl", 3, ""),
		entry("kubelet", 4, "status"), entry("helm", 3, "")})
	u.SetLabels(map[string]string{"app": "x"})
	c := (&compactor{render: renderData}).compact(u)
	require.Equal(t, "cfg", c.GetName())
	require.Equal(t, "demo", c.GetNamespace())
	require.Equal(t, types.UID("uid-cfg"), c.GetUID())
	require.Equal(t, "7", c.GetResourceVersion())
	require.Equal(t, "v1", c.APIVersion)
	require.Equal(t, "ConfigMap", c.Kind)
	require.Nil(t, c.GetLabels())
	require.Nil(t, c.GetManagedFields(), "only the newest writers are kept")
	require.Nil(t, c.GetDeletionTimestamp())
	require.Equal(t, []string{"kubectl", "helm"}, c.managers())
	require.True(t, newestManagersExcluded(c.managers(), []string{"kubectl", "helm"}))
	require.False(t, newestManagersExcluded(c.managers(), []string{"kubectl"}))
	manifest, err := manifestOf(c)
	require.NoError(t, err)
	require.JSONEq(t, `{"a":"1"}`, string(manifest))

	copied := c.DeepCopyObject().(*compactObject)
	require.Equal(t, c, copied)
	require.NotSame(t, c, copied)

	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	require.True(t, terminating((&compactor{render: renderData}).compact(u)))
}

// A compact object is one allocation of one size class, its identity inside it; a name too
// long for that room still comes back whole.
func TestCompactObjectIsOneAllocation(t *testing.T) {
	var _ metav1.Object = &compactObject{} // what client-go's store and reflector read
	require.EqualValues(t, 256, unsafe.Sizeof(compactObject{}))

	c := &compactor{render: renderData}
	u := configMap("cfg", "123456789", map[string]any{"a": "1"})
	u.SetUID("0d4c3a4e-6a8e-4c47-9d8c-6f3e2d1b0a99")
	o := c.compact(u)
	inside := func(s string) bool {
		p := uintptr(unsafe.Pointer(unsafe.StringData(s)))
		start := uintptr(unsafe.Pointer(&o.identity[0]))
		return p >= start && p+uintptr(len(s)) <= start+compactIdentityBytes
	}
	require.True(t, inside(string(o.UID)) && inside(o.Name) && inside(o.ResourceVersion))
	require.Equal(t, types.UID("0d4c3a4e-6a8e-4c47-9d8c-6f3e2d1b0a99"), o.GetUID())
	require.Equal(t, "cfg", o.GetName())
	require.Equal(t, "123456789", o.GetResourceVersion())
	copied := o.DeepCopyObject().(*compactObject)
	require.Equal(t, o.GetUID(), copied.GetUID())
	require.Equal(t, "cfg", copied.GetName())

	long := strings.Repeat("n", 200)
	u.SetName(long)
	o = c.compact(u)
	require.False(t, inside(o.Name))
	require.Equal(t, long, o.GetName())
	require.Equal(t, types.UID("0d4c3a4e-6a8e-4c47-9d8c-6f3e2d1b0a99"), o.GetUID())
	require.Equal(t, "123456789", o.GetResourceVersion())

	allocs := func(name string) float64 {
		u.SetName(name)
		return testing.AllocsPerRun(100, func() { c.compact(u) })
	}
	require.Equal(t, allocs("cfg")+1, allocs(long), "an identity that fits takes no allocation of its own")
}

// A render error travels in the compact object and is returned where the manifest would be.
func TestCompactTransformKeepsRenderError(t *testing.T) {
	c := (&compactor{render: func(*unstructured.Unstructured) ([]byte, error) { return nil, errors.New("no form") }}).
		compact(configMap("cfg", "7", nil))
	_, err := manifestOf(c)
	require.EqualError(t, err, "no form")
	require.Equal(t, "cfg", c.GetName())
	require.Equal(t, "7", c.GetResourceVersion())
}

// A list page becomes a compactList with the list's metadata; a bookmark keeps its version and
// annotations, which tell the reflector where a watch-list's initial events end.
func TestCompactListAndBookmark(t *testing.T) {
	c := &compactor{render: renderData}
	l := &unstructured.UnstructuredList{Items: []unstructured.Unstructured{*configMap("a", "3", nil), *configMap("b", "4", nil)}}
	l.SetResourceVersion("9")
	l.SetContinue("next")
	out, err := c.compactList(l)
	require.NoError(t, err)
	cl := out.(*compactList)
	require.Equal(t, "9", cl.GetResourceVersion())
	require.Equal(t, "next", cl.GetContinue())
	require.Len(t, cl.Items, 2)
	require.Equal(t, "b", cl.Items[1].GetName())
	_, err = c.compactList(&metav1.Status{})
	require.Error(t, err)

	bm := &unstructured.Unstructured{}
	bm.SetAPIVersion("v1")
	bm.SetKind("ConfigMap")
	bm.SetResourceVersion("12")
	bm.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	e, ok := c.compactEvent(watch.Event{Type: watch.Bookmark, Object: bm})
	require.True(t, ok)
	o := e.Object.(*compactObject)
	require.Equal(t, "12", o.GetResourceVersion())
	require.Equal(t, "true", o.GetAnnotations()[metav1.InitialEventsAnnotationKey])
	status := &metav1.Status{Message: "gone"}
	e, ok = c.compactEvent(watch.Event{Type: watch.Error, Object: status})
	require.True(t, ok)
	require.Same(t, status, e.Object)
}

// Values many compact objects share are stored once per informer: objects of one namespace,
// kind and writers hold the same strings, not copies of the decoded ones.
func TestCompactTransformInterns(t *testing.T) {
	c := &compactor{render: renderData}
	var outs []*compactObject
	for i := range 3 {
		u := configMap(fmt.Sprintf("cfg-%d", i), "7", map[string]any{"a": "1"})
		u.SetManagedFields([]metav1.ManagedFieldsEntry{entry("kubectl", 3, "")})
		outs = append(outs, c.compact(u))
	}
	same := func(get func(*compactObject) string) {
		t.Helper()
		a, b := get(outs[0]), get(outs[2])
		require.Equal(t, a, b)
		require.Equal(t, unsafe.StringData(a), unsafe.StringData(b), "one string for every object")
	}
	same((*compactObject).GetNamespace)
	same(func(o *compactObject) string { return o.Kind })
	same(func(o *compactObject) string { return o.APIVersion })
	same(func(o *compactObject) string { return o.writers })
	require.NotEqual(t, outs[0].GetName(), outs[2].GetName())
}
