package watch

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// TestObjectsOutsideTheInformersScopeAreRefused: a namespaced informer keeps only objects of
// its namespace, and every informer only objects of its resource's API group. A conformant
// apiserver never sends others; a hostile remote might, to write into another folder.
func TestObjectsOutsideTheInformersScopeAreRefused(t *testing.T) {
	var refused []string
	c := &compactor{render: renderData, gvr: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, namespace: "demo",
		refused: func(u *unstructured.Unstructured, reason string) { refused = append(refused, u.GetName()+":"+reason) }}

	other := configMap("other-ns", "1", nil)
	other.SetNamespace("..")
	group := configMap("other-group", "1", nil)
	group.SetAPIVersion(".github/v1")
	badVersion := configMap("bad-version", "1", nil)
	badVersion.SetAPIVersion("a/b/c")
	l := &unstructured.UnstructuredList{Items: []unstructured.Unstructured{
		*configMap("ok", "1", nil), *other, *group, *badVersion,
	}}
	out, err := c.compactList(l)
	require.NoError(t, err)
	cl := out.(*compactList)
	require.Len(t, cl.Items, 1)
	require.Equal(t, "ok", cl.Items[0].GetName())
	require.Equal(t, []string{"other-ns:namespace", "other-group:group", "bad-version:group"}, refused)

	refused = nil
	for _, u := range []*unstructured.Unstructured{other, group} {
		for _, typ := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted} {
			_, ok := c.compactEvent(watch.Event{Type: typ, Object: u.DeepCopy()})
			require.False(t, ok, "%s %s", typ, u.GetName())
		}
	}
	require.Len(t, refused, 6)
	e, ok := c.compactEvent(watch.Event{Type: watch.Added, Object: configMap("fine", "2", nil)})
	require.True(t, ok)
	require.Equal(t, "fine", e.Object.(*compactObject).GetName())

	// An informer of every namespace takes any namespace; the path's parts are checked by the
	// writer (internal/git validChange).
	all := &compactor{render: renderData, gvr: c.gvr}
	require.Empty(t, all.outOfScope(other))
	require.Equal(t, RefusedGroup, all.outOfScope(group))
}
