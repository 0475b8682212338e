package watch

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// Each change names the version the informer held before it and the digest of its declared
// form, which admission candidates are confirmed against: "" for a create, the old object's
// for an update (even when the previous event changed nothing declared), the last one seen for
// a delete, and, for a delete held by finalizers, the version before deletionTimestamp.
func TestChangesCarryTheirBaseVersionAndDigest(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"})
	m, changes := startCluster(t, client, RegistryOptions{})
	target := types.NamespacedName{Namespace: "demo", Name: "target"}
	m.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})
	require.Eventually(t, func() bool { ok, _ := m.Status("demo/rule"); return ok }, 5*time.Second, 10*time.Millisecond)
	ctx := context.Background()
	cms := client.Resource(configMaps).Namespace("demo")

	_, err := cms.Create(ctx, configMap("a", "2", map[string]any{"k": "1"}), metav1.CreateOptions{})
	require.NoError(t, err)
	c := nextChange(t, changes)
	require.Equal(t, OpCreate, c.Op)
	require.Empty(t, c.BaseResourceVersion)
	require.Equal(t, sha256.Sum256(c.Manifest), c.Digest)

	_, err = cms.Update(ctx, configMap("a", "3", map[string]any{"k": "1"}), metav1.UpdateOptions{}) // nothing declared changed
	require.NoError(t, err)
	_, err = cms.Update(ctx, configMap("a", "4", map[string]any{"k": "2"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	c = nextChange(t, changes)
	require.Equal(t, OpUpdate, c.Op)
	require.Equal(t, "3", c.BaseResourceVersion)
	require.Equal(t, sha256.Sum256(c.Manifest), c.Digest)

	// Held in deletion at version 5 (its declared form unchanged), finalizer removed at 6.
	held := configMap("a", "5", map[string]any{"k": "2"})
	now := metav1.Now()
	held.SetDeletionTimestamp(&now)
	_, err = cms.Update(ctx, held, metav1.UpdateOptions{})
	require.NoError(t, err)
	held.SetResourceVersion("6")
	_, err = cms.Update(ctx, held, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, cms.Delete(ctx, "a", metav1.DeleteOptions{}))
	c = nextChange(t, changes)
	require.Equal(t, OpDelete, c.Op)
	require.Equal(t, "6", c.BaseResourceVersion)
	require.Equal(t, "4", c.DeletionBaseResourceVersion)
}
