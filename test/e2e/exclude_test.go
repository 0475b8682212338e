package e2e

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// Two GitTargets mirror the same ConfigMaps; one excludes the field manager of a GitOps tool
// (kustomize-controller) and the user bob. The tool's server-side apply that changes data, and
// bob's patch, reach only the other folder; a later edit by alice and a DELETE reach both.
func TestWriteExclusions(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-exclude", "plain", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	create(t, v1alpha1.GitTargetsResource, m.ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "filtered", Namespace: m.ns},
		Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main", Path: "filtered"},
	})
	create(t, v1alpha1.WatchRulesResource, m.ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "filtered", Namespace: m.ns},
		Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "filtered"}, Rules: []v1alpha1.ResourceRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps"},
			ExcludeFieldManagers: []string{"kustomize-controller"}, ExcludeUsers: []string{"bob"},
		}}},
	})
	waitReady(t, v1alpha1.WatchRulesResource, m.ns, "filtered", metav1.ConditionTrue, v1alpha1.ReasonReady)
	excluded := func(reason string) float64 {
		return metricValue(t, `kubescribe_watch_events_excluded_total{gittarget_name="filtered",gittarget_namespace="e2e-exclude",group="",reason="`+reason+`",resource="configmaps"}`)
	}
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)
	plain, filtered := "plain/"+m.ns+"/core/configmaps/x.yaml", "filtered/"+m.ns+"/core/configmaps/x.yaml"
	show := func(file string) string {
		out, err := exec.Command("git", "--git-dir", m.repoDir, "show", "main:"+file).Output()
		if err != nil {
			return "" // no such file (yet)
		}
		return string(out)
	}

	_, err := alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool { return strings.Contains(show(plain), "v1") && strings.Contains(show(filtered), "v1") }))

	// managedFields times have a one-second resolution, and a write whose newest entries tie
	// is excluded only when every tied manager is: the tool writes in a second of its own.
	created := time.Now()
	require.True(t, poll(5*time.Second, func() bool { return time.Now().Unix() > created.Unix() }))
	_, err = alice.Apply(ctx, corev1ac.ConfigMap("x", m.ns).WithData(map[string]string{"k": "v1", "tool": "1"}),
		metav1.ApplyOptions{FieldManager: "kustomize-controller", Force: true})
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool { return strings.Contains(show(plain), "tool") }), "the tool's apply reaches the other folder")
	require.True(t, poll(30*time.Second, func() bool { return excluded("field_manager") >= 1 }))
	require.NotContains(t, show(filtered), "tool")

	_, err = bob.Patch(ctx, "x", types.MergePatchType, []byte(`{"data":{"bob":"1"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool { return strings.Contains(show(plain), "bob") }))
	require.True(t, poll(30*time.Second, func() bool { return excluded("user") >= 1 }))
	require.NotContains(t, show(filtered), "bob")

	_, err = alice.Patch(ctx, "x", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{FieldManager: "kubectl"})
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool { return strings.Contains(show(plain), "v2") && strings.Contains(show(filtered), "v2") }),
		"a human edit reaches both folders, with the state the excluded writes left")
	require.Contains(t, show(filtered), "tool: \"1\"")

	require.NoError(t, alice.Delete(ctx, "x", metav1.DeleteOptions{}))
	require.True(t, poll(60*time.Second, func() bool { return show(plain) == "" && show(filtered) == "" }), "a DELETE reaches both")
}

// An object whose newest write is a GitOps tool's excluded apply keeps the older version in Git.
// When someone else's commit removes its file, the branch check has the target replay, and the
// file comes back with the object's current form, written by the committer: the folder keeps
// every object, although the tool's write itself is still not mirrored where the file exists.
func TestExcludedObjectIsRestoredWhenItsFileIsLost(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-exclude-lost", "", []string{"alice"}, configMapWriters, []v1alpha1.ResourceRule{{
		APIGroups: []string{""}, Resources: []string{"configmaps"}, ExcludeFieldManagers: []string{"kustomize-controller"},
	}})
	m.setFetchInterval(t, "1s")
	alice := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "synced", "other")
	synced, other := objectFile(m, "", "configmaps", "synced"), objectFile(m, "", "configmaps", "other")
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(m.files(t), []string{other, synced}) }), "files: %v", m.files(t))
	committer := strings.Split(m.commits(t)[0], "|")[2]

	// The tool applies in a second of its own (managedFields times have a one-second resolution).
	created := time.Now()
	require.True(t, poll(5*time.Second, func() bool { return time.Now().Unix() > created.Unix() }))
	for _, name := range []string{"synced", "other"} {
		_, err := alice.Apply(ctx, corev1ac.ConfigMap(name, m.ns).WithData(map[string]string{"k": "v1", "tool": "1"}),
			metav1.ApplyOptions{FieldManager: "kustomize-controller", Force: true})
		require.NoError(t, err)
	}
	require.True(t, poll(30*time.Second, func() bool {
		return metricValue(t, `kubescribe_watch_events_excluded_total{gittarget_name="target",gittarget_namespace="e2e-exclude-lost",group="",reason="field_manager",resource="configmaps"}`) >= 2
	}))
	before := len(m.commits(t))

	m.carolCommits(t, "carol removes a file", map[string]string{synced: ""})
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(m.files(t), []string{other, synced}) }),
		"the removed file of the excluded object must come back: %v", m.files(t))
	require.Contains(t, m.git(t, "show", "main:"+synced), "tool: \"1\"", "the lost file gets the object's current form")
	require.NotContains(t, m.git(t, "show", "main:"+other), "tool", "a file that exists keeps the version before the excluded write")
	require.Equal(t, map[string]string{"synced": committer + " create"}, m.lastChanges(t, before))
}
