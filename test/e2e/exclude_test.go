package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// A rule's exclusions keep a GitOps tool's own writes (by field manager) and a user's writes
// out of Git, while everyone else's are committed.
func TestWriteExclusions(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-exclude", "", []string{"alice", "bob"}, configMapWriters, []v1alpha1.ResourceRule{{
		APIGroups: []string{""}, Resources: []string{"configmaps"},
		ExcludeFieldManagers: []string{"argocd-controller"}, ExcludeUsers: []string{"bob"},
	}})
	byManager := `kubescribe_watch_excluded_changes_total{cluster="local",reason="field_manager",resource="configmaps"}`
	byUser := `kubescribe_attribution_excluded_changes_total`
	managerBefore, userBefore := metricValue(t, byManager), metricValue(t, byUser)
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)

	_, err := alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 1)
	// managedFields times have a one-second resolution, and a write whose newest entries tie
	// is excluded only when every tied manager is: the tool writes in a second of its own.
	created := time.Now()
	require.True(t, poll(5*time.Second, func() bool { return time.Now().Unix() > created.Unix() }))
	_, err = alice.Apply(ctx, corev1ac.ConfigMap("x", m.ns).WithData(map[string]string{"tool": "1"}),
		metav1.ApplyOptions{FieldManager: "argocd-controller", Force: true})
	require.NoError(t, err)
	_, err = bob.Patch(ctx, "x", types.MergePatchType, []byte(`{"data":{"bob":"1"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.True(t, poll(30*time.Second, func() bool {
		return metricValue(t, byManager) > managerBefore && metricValue(t, byUser) > userBefore
	}), "both exclusions are counted")

	_, err = alice.Patch(ctx, "x", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{FieldManager: "kubectl"})
	require.NoError(t, err)
	got := m.waitCommits(t, 2)
	require.Equal(t, []string{
		"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-exclude/x",
		"alice|alice@users.kubescribe.invalid|kubescribe|update configmaps e2e-exclude/x",
	}, got, "no commit for bob's write or the tool's apply")
	require.Contains(t, m.git(t, "show", "main:"+objectFile(m, "", "configmaps", "x")), "k: v2")
}
