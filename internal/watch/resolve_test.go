package watch

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	fakediscovery "k8s.io/client-go/discovery/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
)

var lw = []string{"get", "list", "watch"}

func res(name string, namespaced bool, verbs ...string) metav1.APIResource {
	return metav1.APIResource{Name: name, Namespaced: namespaced, Verbs: verbs}
}

// lockedDiscovery is the fake discovery with a lock, so a test may change what it serves while
// the cluster's refresh loop reads it. The first list of a group is its preferred version.
type lockedDiscovery struct {
	*fakediscovery.FakeDiscovery
	mu    sync.Mutex
	reads int
	fail  error
}

func newLockedDiscovery(lists ...*metav1.APIResourceList) *lockedDiscovery {
	fd := kubefake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
	fd.Resources = lists
	return &lockedDiscovery{FakeDiscovery: fd}
}

func (d *lockedDiscovery) ServerGroupsAndResourcesWithContext(context.Context) ([]*metav1.APIGroup, []*metav1.APIResourceList, error) {
	return d.ServerGroupsAndResources()
}

func (d *lockedDiscovery) ServerGroupsAndResources() ([]*metav1.APIGroup, []*metav1.APIResourceList, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reads++
	if d.fail != nil {
		return nil, nil, d.fail
	}
	return d.FakeDiscovery.ServerGroupsAndResources()
}

func (d *lockedDiscovery) set(lists ...*metav1.APIResourceList) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Resources = lists
}

func (d *lockedDiscovery) setFail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail = err
}

func (d *lockedDiscovery) readCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reads
}

var _ discovery.DiscoveryInterface = (*lockedDiscovery)(nil)

func catalogLists() []*metav1.APIResourceList {
	return []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			res("configmaps", true, lw...),
			res("secrets", true, lw...),
			res("bindings", true, "create"),
			res("namespaces", false, lw...),
			res("pods", true, lw...),
			res("pods/status", true, "get", "list", "watch"),
		}},
		{GroupVersion: "batch/v1", APIResources: []metav1.APIResource{ // preferred
			res("jobs", true, lw...),
			res("cronjobs", true, lw...),
		}},
		{GroupVersion: "batch/v1beta1", APIResources: []metav1.APIResource{
			res("cronjobs", true, lw...),
			res("legacyjobs", true, lw...),
		}},
		{GroupVersion: "rbac.authorization.k8s.io/v1", APIResources: []metav1.APIResource{
			res("clusterroles", false, lw...),
			res("roles", true, lw...),
		}},
	}
}

func resolveNames(t *testing.T, sels []Selector, namespacedOnly bool) ([]string, []Unresolved) {
	t.Helper()
	r, err := Resolve(newLockedDiscovery(catalogLists()...), sels, namespacedOnly)
	require.NoError(t, err)
	names := []string{}
	for _, x := range r.Resources {
		names = append(names, x.GVR.String())
	}
	return names, r.Unresolved
}

func TestResolveVersions(t *testing.T) {
	batch := []string{"batch"}
	tests := []struct {
		name     string
		versions []string
		want     []string
		unres    []Unresolved
	}{
		{"preferred by default, else the version that serves it", nil,
			[]string{"batch/v1, Resource=cronjobs", "batch/v1, Resource=jobs", "batch/v1beta1, Resource=legacyjobs"}, nil},
		{"restricted to one version", []string{"v1beta1"},
			[]string{"batch/v1beta1, Resource=cronjobs", "batch/v1beta1, Resource=legacyjobs"}, nil},
		{"several versions: the most preferred of them", []string{"v1beta1", "v1"},
			[]string{"batch/v1, Resource=cronjobs", "batch/v1, Resource=jobs", "batch/v1beta1, Resource=legacyjobs"}, nil},
		{"a version the group does not serve", []string{"v2"}, []string{},
			[]Unresolved{{Selector: 0, Resource: "*", Reason: UnresolvedVersionNotServed}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, unres := resolveNames(t, []Selector{{APIGroups: batch, APIVersions: tt.versions, Resources: []string{"*"}}}, true)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.unres, unres)
		})
	}

	// A named resource served only outside the allowed versions says so.
	_, unres := resolveNames(t, []Selector{{APIGroups: batch, APIVersions: []string{"v1"}, Resources: []string{"jobs", "legacyjobs"}}}, true)
	require.Equal(t, []Unresolved{{Selector: 0, Resource: "legacyjobs", Reason: UnresolvedVersionNotServed}}, unres)
}

func TestResolveUnresolvedReasons(t *testing.T) {
	sels := []Selector{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}},                          // 0: secrets refused
		{APIGroups: []string{"example.com"}, Resources: []string{"widgets"}},                             // 1: not served
		{APIGroups: []string{""}, Resources: []string{"bindings"}},                                       // 2: not listable
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles", "roles"}}, // 3: cluster-scoped in a WatchRule
		{APIGroups: []string{""}, Resources: []string{"pods/status"}},                                    // 4: subresources are not served as resources
		{APIGroups: []string{"example.com", "batch"}, Resources: []string{"*"}},                          // 5: resolves through batch
	}
	got, unres := resolveNames(t, sels, true)
	require.Equal(t, []string{
		"/v1, Resource=configmaps",
		"batch/v1, Resource=cronjobs", "batch/v1, Resource=jobs", "batch/v1beta1, Resource=legacyjobs",
		"rbac.authorization.k8s.io/v1, Resource=roles",
	}, got)
	require.Equal(t, []Unresolved{
		{Selector: 0, Resource: "secrets", Reason: UnresolvedSecret},
		{Selector: 1, Resource: "widgets", Reason: UnresolvedNotServed},
		{Selector: 2, Resource: "bindings", Reason: UnresolvedNotListable},
		{Selector: 3, Resource: "clusterroles", Reason: UnresolvedClusterScoped},
		{Selector: 4, Resource: "pods/status", Reason: UnresolvedNotServed},
	}, unres)

	// Cluster-wide (a ClusterWatchRule), cluster-scoped resources resolve.
	got, unres = resolveNames(t, sels[3:4], false)
	require.Equal(t, []string{"rbac.authorization.k8s.io/v1, Resource=clusterroles", "rbac.authorization.k8s.io/v1, Resource=roles"}, got)
	require.Empty(t, unres)

	// "*" over the core group resolves although it meets Secrets and bindings: only the note
	// lists the Secrets.
	r, err := Resolve(newLockedDiscovery(catalogLists()...), []Selector{{APIGroups: []string{""}, Resources: []string{"*"}}}, true)
	require.NoError(t, err)
	require.Empty(t, r.Unresolved)
	require.Len(t, r.Secrets, 1)
	require.Len(t, r.ClusterScoped, 1)
}
