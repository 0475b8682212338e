package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// A change kubescribe received and has not pushed (usually still waiting for its author) when
// it is told to stop is committed and pushed, under its author, before kubescribe exits; the
// restarted kubescribe does not commit it again.
func TestShutdownFinishesInFlightChanges(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-shutdown", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)

	created := `kubescribe_watch_events_total{cluster="local",resource="configmaps",type="create"}`
	events := metricValue(t, created)
	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "in-flight"}, Data: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The change is in kubescribe's hands: its watch event arrived. Its audit fact mostly comes
	// later, with the apiserver's next audit batch (at most a second), its push later still.
	// (Waiting for kubescribe_attribution_pending_changes to read 1 raced: when the fact came
	// first, the change was pending for milliseconds, between two scrapes.)
	require.True(t, poll(30*time.Second, func() bool { return metricValue(t, created) > events }),
		"the change never reached kubescribe")
	if len(m.commits(t)) > 0 {
		t.Log("the change was pushed before kubescribe was told to stop: this run did not test the drain")
	}
	// ... when it is told to stop.
	require.NoError(t, env.StopKubescribe())
	require.Equal(t, []string{"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-shutdown/in-flight"}, m.commits(t),
		"the commit must be pushed before kubescribe exits")

	require.NoError(t, env.StartKubescribe(ctx))
	// The rule's Ready=True is still the old instance's. A new generation (same meaning) can only
	// become Ready once the new instance has listed the namespace.
	u, err := dynamicFor(t, "admin").Resource(v1alpha1.WatchRulesResource).Namespace(m.ns).Patch(ctx, "rule", types.MergePatchType,
		[]byte(`{"spec":{"rules":[{"apiGroups":[""],"resources":["configmaps"],"operations":["CREATE","UPDATE","DELETE"]}]}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	cond := waitReady(t, v1alpha1.WatchRulesResource, m.ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady, u.GetGeneration())
	require.Equal(t, u.GetGeneration(), cond.ObservedGeneration)
	_, err = clientFor(t, "bob").CoreV1().ConfigMaps(m.ns).Patch(ctx, "in-flight", types.MergePatchType, []byte(`{"data":{"k":"w"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	got := m.waitCommits(t, 2)
	require.Equal(t, []string{
		"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-shutdown/in-flight",
		"bob|bob@users.kubescribe.invalid|kubescribe|update configmaps e2e-shutdown/in-flight",
	}, got, "the restart's snapshot of an unchanged object must not make a commit")
}
