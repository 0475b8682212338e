package watch

import (
	"context"
	"fmt"
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
			require.Equal(t, tt.want, newestManagersExcluded(tt.u, excl))
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
	m.Set("demo/rule", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo",
		ExcludeFieldManagers: []string{"argocd-controller"}, ExcludeUsers: []string{"system:serviceaccount:argocd:app"}}})
	snap := nextChange(t, changes)
	require.True(t, snap.Snapshot, "the initial state is never excluded")
	require.Equal(t, []string{"system:serviceaccount:argocd:app"}, snap.ExcludeUsers, "user exclusions travel to the join")

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
	out, err := compactTransform(renderData)(u)
	require.NoError(t, err)
	c := out.(*unstructured.Unstructured)
	require.Equal(t, "cfg", c.GetName())
	require.Equal(t, "demo", c.GetNamespace())
	require.Equal(t, types.UID("uid-cfg"), c.GetUID())
	require.Equal(t, "7", c.GetResourceVersion())
	require.Nil(t, c.Object["data"])
	require.Nil(t, c.GetLabels())
	require.Nil(t, c.GetManagedFields(), "only the newest writers are kept")
	require.Equal(t, []string{"kubectl", "helm"}, newestManagers(c))
	require.True(t, newestManagersExcluded(c, []string{"kubectl", "helm"}))
	require.False(t, newestManagersExcluded(c, []string{"kubectl"}))
	manifest, err := manifestOf(c)
	require.NoError(t, err)
	require.JSONEq(t, `{"a":"1"}`, string(manifest))
	again, err := compactTransform(renderData)(c)
	require.NoError(t, err)
	require.Same(t, c, again, "a compact object is kept as is")
}

// Values many compact objects share are stored once per informer: objects of one namespace,
// kind and writers hold the same strings, not copies of the decoded ones.
func TestCompactTransformInterns(t *testing.T) {
	transform := compactTransform(renderData)
	var outs []*unstructured.Unstructured
	for i := range 3 {
		u := configMap(fmt.Sprintf("cfg-%d", i), "7", map[string]any{"a": "1"})
		u.SetManagedFields([]metav1.ManagedFieldsEntry{entry("kubectl", 3, "")})
		out, err := transform(u)
		require.NoError(t, err)
		outs = append(outs, out.(*unstructured.Unstructured))
	}
	same := func(get func(*unstructured.Unstructured) string) {
		t.Helper()
		a, b := get(outs[0]), get(outs[2])
		require.Equal(t, a, b)
		require.Equal(t, unsafe.StringData(a), unsafe.StringData(b), "one string for every object")
	}
	same((*unstructured.Unstructured).GetNamespace)
	same((*unstructured.Unstructured).GetKind)
	same((*unstructured.Unstructured).GetAPIVersion)
	same(func(u *unstructured.Unstructured) string { return u.Object[writersKey].(string) })
	require.NotEqual(t, outs[0].GetName(), outs[2].GetName())
}
