package watch

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/kubescribe/kubescribe/internal/testlog"
)

var widgetsSelector = []Selector{{APIGroups: []string{"example.com"}, Resources: []string{"widgets"}}}

func coreList() *metav1.APIResourceList {
	return &metav1.APIResourceList{GroupVersion: "v1", APIResources: []metav1.APIResource{res("configmaps", true, lw...)}}
}

func widgetsList() *metav1.APIResourceList {
	return &metav1.APIResourceList{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{res("widgets", true, lw...)}}
}

func crdList() *metav1.APIResourceList {
	return &metav1.APIResourceList{GroupVersion: "apiextensions.k8s.io/v1", APIResources: []metav1.APIResource{res("customresourcedefinitions", false, lw...)}}
}

func apiServiceList() *metav1.APIResourceList {
	return &metav1.APIResourceList{GroupVersion: "apiregistration.k8s.io/v1", APIResources: []metav1.APIResource{res("apiservices", false, lw...)}}
}

type discoveryFixture struct {
	reg     *Registry
	cluster *Cluster
	disc    *lockedDiscovery
	client  *dynamicfake.FakeDynamicClient
	logs    *testlog.Buffer
	metrics *Metrics
}

func newDiscoveryFixture(t *testing.T, every time.Duration, lists ...*metav1.APIResourceList) *discoveryFixture {
	t.Helper()
	f := &discoveryFixture{disc: newLockedDiscovery(lists...), logs: &testlog.Buffer{}, metrics: NewMetrics(prometheus.NewRegistry())}
	f.client = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		CRDsResource:        "CustomResourceDefinitionList",
		APIServicesResource: "APIServiceList",
	})
	var err error
	f.reg, err = NewRegistry(RegistryOptions{
		Render:           renderData,
		Emit:             func(Change) {},
		Logger:           slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		DiscoveryRefresh: every,
		Metrics:          f.metrics,
	})
	require.NoError(t, err)
	f.cluster, err = f.reg.AddCluster("local", f.client, f.disc)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	f.reg.Start(ctx)
	t.Cleanup(func() {
		f.reg.Stop()
		cancel()
	})
	return f
}

// waitChanged waits for the registry's signal and returns the clusters it names.
func (f *discoveryFixture) waitChanged(t *testing.T) []string {
	t.Helper()
	select {
	case <-f.reg.Updates():
		return f.reg.Changed()
	case <-time.After(10 * time.Second):
		t.Fatal("no catalog change was signalled")
		return nil
	}
}

// watching reports whether the fake client was asked to watch gvr.
func (f *discoveryFixture) watching(gvr schema.GroupVersionResource) bool {
	for _, a := range f.client.Actions() {
		if a.GetVerb() == "watch" && a.GetResource() == gvr {
			return true
		}
	}
	return false
}

func (f *discoveryFixture) resolvedWidgets(t *testing.T) bool {
	t.Helper()
	r, err := f.cluster.Resolve(widgetsSelector, true)
	require.NoError(t, err)
	return len(r.Resources) == 1
}

// TestDiscoveryRefreshOnTimer: a resource served after start is resolved once the timer
// re-reads discovery, and the change is signalled.
func TestDiscoveryRefreshOnTimer(t *testing.T) {
	f := newDiscoveryFixture(t, 20*time.Millisecond, coreList())
	require.False(t, f.resolvedWidgets(t))
	f.disc.set(coreList(), widgetsList())
	require.Equal(t, []string{"local"}, f.waitChanged(t))
	require.True(t, f.resolvedWidgets(t))
	require.Equal(t, 1.0, testutil.ToFloat64(f.metrics.refreshes.WithLabelValues("local", refreshChanged)))
}

// TestDiscoveryRefreshOnCRDChange: where CRDs are served, a CRD event triggers a refresh
// long before the timer would.
func TestDiscoveryRefreshOnCRDChange(t *testing.T) {
	f := newDiscoveryFixture(t, time.Hour, coreList(), crdList())
	require.Eventually(t, func() bool { return f.watching(CRDsResource) }, 10*time.Second, 5*time.Millisecond, "the CRD trigger did not start")
	require.False(t, f.watching(APIServicesResource), "apiservices are not served")

	f.disc.set(coreList(), crdList(), widgetsList())
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "widgets.example.com"},
	}}
	_, err := f.client.Resource(CRDsResource).Create(context.Background(), crd, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"local"}, f.waitChanged(t))
	require.True(t, f.resolvedWidgets(t))
}

// TestDiscoveryWithoutAPIRegistration: a cluster without apiregistration.k8s.io is refreshed
// on the timer without any APIService watch, says so once, and starts the watch once the
// cluster serves it.
func TestDiscoveryWithoutAPIRegistration(t *testing.T) {
	f := newDiscoveryFixture(t, 10*time.Millisecond, coreList(), crdList())
	require.Eventually(t, func() bool { return f.disc.readCount() >= 10 }, 10*time.Second, 5*time.Millisecond, "the timer did not refresh")
	require.Equal(t, 1, strings.Count(f.logs.String(), "not watching for discovery changes"), f.logs.String())
	require.False(t, f.watching(APIServicesResource))
	require.True(t, f.watching(CRDsResource))
	require.Equal(t, 0.0, testutil.ToFloat64(f.metrics.triggers.WithLabelValues("local", "apiservices.apiregistration.k8s.io")))
	require.Equal(t, 1.0, testutil.ToFloat64(f.metrics.triggers.WithLabelValues("local", "customresourcedefinitions.apiextensions.k8s.io")))
	require.Positive(t, testutil.ToFloat64(f.metrics.refreshes.WithLabelValues("local", refreshUnchanged)))

	f.disc.set(coreList(), crdList(), apiServiceList())
	require.Eventually(t, func() bool { return f.watching(APIServicesResource) }, 10*time.Second, 5*time.Millisecond, "the APIService trigger did not start")
	// The trigger is registered before its start is logged.
	require.Eventually(t, func() bool {
		return strings.Contains(f.logs.String(), `msg="watching for discovery changes" cluster=local resource="apiregistration.k8s.io/v1, Resource=apiservices"`)
	}, 10*time.Second, 5*time.Millisecond, f.logs.String())
	require.Equal(t, 1, strings.Count(f.logs.String(), "not watching for discovery changes"))
}

// TestDiscoveryFailureKeepsCatalog: a failed refresh keeps the last catalog; a cluster whose
// discovery never answered fails resolution with the reason.
func TestDiscoveryFailureKeepsCatalog(t *testing.T) {
	f := newDiscoveryFixture(t, time.Hour, coreList(), widgetsList())
	require.True(t, f.resolvedWidgets(t))
	f.disc.setFail(context.DeadlineExceeded)
	f.cluster.RequestRefresh()
	require.Eventually(t, func() bool { return strings.Contains(f.logs.String(), "discovery refresh failed") }, 10*time.Second, 5*time.Millisecond)
	require.True(t, f.resolvedWidgets(t))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(f.metrics.refreshes.WithLabelValues("local", refreshFailed)) >= 1
	}, 10*time.Second, 5*time.Millisecond)

	g := newDiscoveryFixture(t, time.Hour)
	g.disc.setFail(context.DeadlineExceeded)
	g.cluster.cat.mu.Lock()
	g.cluster.cat.catalog = nil
	g.cluster.cat.mu.Unlock()
	_, err := g.cluster.Resolve(widgetsSelector, true)
	require.ErrorContains(t, err, "discovering the cluster's resources")
}

func TestNewRegistryRejectsNegativeRefresh(t *testing.T) {
	_, err := NewRegistry(RegistryOptions{Render: renderData, Emit: func(Change) {}, DiscoveryRefresh: -time.Second})
	require.ErrorContains(t, err, "DiscoveryRefresh")
}

// TestDiscoverySettlesAfterATrigger: a requested refresh that finds nothing new is followed by
// a few more (a CRD's events can precede discovery serving it), and no more after them.
func TestDiscoverySettlesAfterATrigger(t *testing.T) {
	saved := settleDelays
	settleDelays = []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 15 * time.Millisecond}
	t.Cleanup(func() { settleDelays = saved })

	f := newDiscoveryFixture(t, time.Hour, coreList())
	require.False(t, f.resolvedWidgets(t)) // the catalog is read
	// The loop's first refresh is done once it has looked at the triggers.
	require.Eventually(t, func() bool { return strings.Count(f.logs.String(), "not watching for discovery changes") == 2 }, 10*time.Second, time.Millisecond)
	base := f.disc.readCount()
	f.cluster.RequestRefresh()
	want := base + 1 + len(settleDelays)
	require.Eventually(t, func() bool { return f.disc.readCount() >= want }, 10*time.Second, time.Millisecond,
		"want the requested refresh and %d settling ones", len(settleDelays))
	// Every read but the first counts as a refresh; the counter moves once the read returned.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(f.metrics.refreshes.WithLabelValues("local", refreshUnchanged)) == float64(want-1)
	}, 10*time.Second, time.Millisecond)
	require.Equal(t, want, f.disc.readCount(), "no refresh after the settling ones")
}

// blockingDiscovery answers no discovery read until the read's context ends.
type blockingDiscovery struct {
	*lockedDiscovery
	entered chan struct{}
	once    sync.Once
}

func (b *blockingDiscovery) ServerGroupsAndResourcesWithContext(ctx context.Context) ([]*metav1.APIGroup, []*metav1.APIResourceList, error) {
	b.once.Do(func() { close(b.entered) })
	<-ctx.Done()
	return nil, nil, ctx.Err()
}

// TestStopEndsADiscoveryRead: stopping the registry ends a discovery read that hangs, so a
// shutdown is not held up by an unresponsive apiserver.
func TestStopEndsADiscoveryRead(t *testing.T) {
	dc := &blockingDiscovery{lockedDiscovery: newLockedDiscovery(coreList()), entered: make(chan struct{})}
	reg, err := NewRegistry(RegistryOptions{Render: renderData, Emit: func(Change) {}, DiscoveryRefresh: time.Hour})
	require.NoError(t, err)
	_, err = reg.AddCluster("local", dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), dc)
	require.NoError(t, err)
	reg.Start(context.Background())
	select {
	case <-dc.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the refresh loop did not read discovery")
	}
	stopped := make(chan struct{})
	go func() { reg.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop waited for a hanging discovery read")
	}
}
