package watch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// The arena hands out copies; a repack moves the live manifests into fresh chunks and leaves
// every view handed out before intact.
func TestManifestArenaRepack(t *testing.T) {
	var a manifestArena
	require.Empty(t, a.add(nil))
	big := strings.Repeat("b", arenaChunkSize/4+1)
	require.Equal(t, big, a.add([]byte(big)), "a large manifest is allocated on its own")

	var kept []*string
	views := make([]string, 0, 300) // kept points into it
	for i := range 300 {
		src := []byte(fmt.Sprintf("%04d:%s", i, strings.Repeat("x", 500)))
		m := a.add(src)
		src[0] = '!' // the arena holds a copy
		require.Equal(t, fmt.Sprintf("%04d:", i), m[:5])
		views = append(views, m)
		if i%10 == 0 {
			kept = append(kept, &views[len(views)-1])
		}
	}
	live := 0
	for _, m := range kept {
		live += len(*m)
	}
	require.True(t, a.wasteful(live), "nine in ten manifests were replaced")
	old := *kept[3]
	a.repack(kept)
	require.Equal(t, old, *kept[3])
	require.NotSame(t, unsafe.StringData(old), unsafe.StringData(*kept[3]), "moved to a fresh chunk")
	require.False(t, a.wasteful(live))
	require.Equal(t, live, a.allocated)
	for i, m := range views {
		require.Equal(t, fmt.Sprintf("%04d:", i), m[:5], "a view handed out before the repack stays valid")
	}
}

// An informer whose objects were replaced many times repacks its manifests; the objects it
// holds keep their declared form, and changes after the repack are emitted as before.
func TestInformerRepacksManifests(t *testing.T) {
	payload := strings.Repeat("p", 1000)
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"}, configMap("cfg", "1", map[string]any{"p": payload, "n": "0"}))
	metrics := NewMetrics(prometheus.NewRegistry())
	m, changes := startCluster(t, client, RegistryOptions{Metrics: metrics})
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	m.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})
	nextChange(t, changes)

	cms := client.Resource(configMaps).Namespace("demo")
	ctx := context.Background()
	for i := 1; i <= 100; i++ { // ~100 KB of superseded manifests: more than a chunk
		_, err := cms.Update(ctx, configMap("cfg", fmt.Sprint(i+1), map[string]any{"p": payload, "n": fmt.Sprint(i)}), metav1.UpdateOptions{})
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(i+1), nextChange(t, changes).ResourceVersion)
	}
	m.mu.Lock()
	inf := m.informers[informerKey{gvr: configMaps, namespace: "demo"}]
	m.mu.Unlock()
	inf.repackIfWasteful()
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.repacks.WithLabelValues("local", "configmaps")))
	inf.repackIfWasteful()
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.repacks.WithLabelValues("local", "configmaps")), "nothing left to reclaim")

	inf.mu.Lock()
	obj, _, err := inf.informer.GetStore().GetByKey("demo/cfg")
	require.NoError(t, err)
	manifest, err := manifestOf(obj.(*compactObject))
	inf.mu.Unlock()
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"p":%q,"n":"100"}`, payload), string(manifest))

	_, err = cms.Update(ctx, configMap("cfg", "200", map[string]any{"p": payload, "n": "x"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	c := nextChange(t, changes)
	require.Equal(t, "200", c.ResourceVersion)
	require.JSONEq(t, fmt.Sprintf(`{"p":%q,"n":"x"}`, payload), string(c.Manifest))
}

// The idle callback runs once additions stop, not while they go on, and again after the
// next ones; never after stop.
func TestManifestArenaIdle(t *testing.T) {
	calls := make(chan struct{}, 4)
	a := manifestArena{idle: func() { calls <- struct{}{} }, idleAfter: 200 * time.Millisecond}
	a.add([]byte("one"))
	<-calls
	a.add([]byte("two"))
	a.add([]byte("three"))
	<-calls
	require.Empty(t, calls, "one call per quiet period")
	a.add([]byte("four"))
	a.stop()
	require.Never(t, func() bool { return len(calls) > 0 }, 300*time.Millisecond, 20*time.Millisecond)
}
