package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func newClusterRule(name string, mutate func(*v1alpha1.ClusterWatchRule), rules ...v1alpha1.ResourceRule) *v1alpha1.ClusterWatchRule {
	r := &v1alpha1.ClusterWatchRule{
		TypeMeta:   typeMeta("ClusterWatchRule"),
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: testGeneration},
		Spec: v1alpha1.ClusterWatchRuleSpec{
			TargetRef: v1alpha1.NamespacedObjectReference{Namespace: testNS, Name: "web"},
			Rules:     rules,
		},
	}
	if mutate != nil {
		mutate(r)
	}
	return r
}

func newNamespace(name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("Namespace")
	u.SetName(name)
	u.SetUID(types.UID("uid-ns-" + name))
	u.SetLabels(labels)
	return u
}

func newClusterRole(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("rbac.authorization.k8s.io/v1")
	u.SetKind("ClusterRole")
	u.SetName(name)
	u.SetUID(types.UID("uid-cr-" + name))
	u.SetResourceVersion("1")
	return u
}

func configMapIn(ns, name string) *unstructured.Unstructured {
	u := newConfigMap(name)
	u.SetNamespace(ns)
	u.SetUID(types.UID("uid-cm-" + ns + "-" + name))
	return u
}

// rbacDiscovery serves coreV1() and rbac.authorization.k8s.io/v1 clusterroles.
func rbacDiscovery() []*metav1.APIResourceList {
	return append(coreV1(), &metav1.APIResourceList{
		GroupVersion: "rbac.authorization.k8s.io/v1",
		APIResources: []metav1.APIResource{apiResource("clusterroles", false, listWatch...)},
	})
}

func (f *fixture) clusterRule(name string) v1alpha1.ClusterWatchRule {
	f.t.Helper()
	u, err := f.dyn.Resource(v1alpha1.ClusterWatchRulesResource).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(f.t, err)
	var r v1alpha1.ClusterWatchRule
	require.NoError(f.t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r))
	return r
}

func conditionOf(conds []metav1.Condition, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// TestRulePartiallyResolvedUntilServed: a WatchRule naming a resource the cluster does not serve
// yet mirrors the rest, says which entry and why, and turns Ready as soon as the discovery
// catalog changes: the catalog's signal re-evaluates it, long before its periodic re-check.
func TestRulePartiallyResolvedUntilServed(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed(""), newRule("mixed", "web",
			rule([]string{""}, []string{"configmaps"}),
			rule([]string{"example.com"}, []string{"widgets"}))),
		secrets: []runtime.Object{credsSecret()},
		workers: 1,
	})
	var got v1alpha1.WatchRule
	waitFor(t, 15*time.Second, "the rule to be partially resolved", func() bool {
		got = f.watchRule("mixed")
		return conditionOf(got.Status.Conditions, v1alpha1.ConditionReady).Reason == v1alpha1.ReasonPartiallyResolved
	})
	ready := conditionOf(got.Status.Conditions, v1alpha1.ConditionReady)
	require.Equal(t, metav1.ConditionFalse, ready.Status)
	require.Contains(t, ready.Message, `watching v1/configmaps in namespace "team-a"`)
	require.Contains(t, ready.Message, `rules[1] "widgets" in apiGroups ["example.com"]: not served by the cluster (yet)`)
	resolved := conditionOf(got.Status.Conditions, v1alpha1.ConditionResourcesResolved)
	require.Equal(t, metav1.ConditionFalse, resolved.Status)
	require.Equal(t, v1alpha1.ReasonPartiallyResolved, resolved.Reason)
	require.Contains(t, resolved.Message, "(NotServed)")
	require.EqualValues(t, testGeneration, resolved.ObservedGeneration)
	require.Equal(t, []string{"v1/configmaps"}, got.Status.Resources)

	// The CRD is served now; the catalog refresh (a CRD event would trigger it) is signalled.
	f.disc.Resources = append(coreV1(), &metav1.APIResourceList{
		GroupVersion: "example.com/v1",
		APIResources: []metav1.APIResource{apiResource("widgets", true, listWatch...)},
	})
	f.sources.Cluster(testCluster).RequestRefresh()
	waitFor(t, 10*time.Second, "the rule to be Ready", func() bool {
		got = f.watchRule("mixed")
		return conditionOf(got.Status.Conditions, v1alpha1.ConditionReady).Status == metav1.ConditionTrue
	})
	require.Equal(t, []string{"example.com/v1/widgets", "v1/configmaps"}, got.Status.Resources)
	resolved = conditionOf(got.Status.Conditions, v1alpha1.ConditionResourcesResolved)
	require.Equal(t, metav1.ConditionTrue, resolved.Status)
	require.Equal(t, v1alpha1.ReasonResolved, resolved.Reason)
}

// TestRuleClusterScopedEntry: a WatchRule naming a cluster-scoped resource says to use a
// ClusterWatchRule.
func TestRuleClusterScopedEntry(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed(""), newRule("roles", "web", rule([]string{"rbac.authorization.k8s.io"}, []string{"clusterroles"}))),
		secrets: []runtime.Object{credsSecret()},
		sourceDiscovery: func() *rawDiscovery {
			fd, _ := newDiscovery(nil)
			return &rawDiscovery{FakeDiscovery: fd, lists: rbacDiscovery()}
		}(),
	})
	f.makeReady()
	require.NoError(t, f.syncRule("roles"))
	got := f.watchRule("roles")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonNoResourcesMatched,
		`rules[0] "clusterroles"`, "use a ClusterWatchRule", "(ClusterScoped)")
	resolved := conditionOf(got.Status.Conditions, v1alpha1.ConditionResourcesResolved)
	require.Equal(t, metav1.ConditionFalse, resolved.Status)
	require.Equal(t, v1alpha1.ReasonNoResourcesMatched, resolved.Reason)
	require.Empty(t, got.Status.Resources)
}

// TestClusterRuleNamespaceSelector: a ClusterWatchRule mirrors cluster-scoped resources and the
// namespaced ones of the namespaces its selector matches, following relabelled namespaces.
func TestClusterRuleNamespaceSelector(t *testing.T) {
	_, cached := newDiscovery(rbacDiscovery())
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed("all"),
			newNamespace(testNS, map[string]string{"team": "web"}),
			newNamespace("team-b", nil),
			newClusterRole("viewer"),
			newConfigMap("settings"),
			configMapIn("team-b", "other"),
			newClusterRule("everything", func(r *v1alpha1.ClusterWatchRule) {
				r.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}}
			},
				rule([]string{"rbac.authorization.k8s.io"}, []string{"clusterroles"}),
				rule([]string{""}, []string{"configmaps"}))),
		secrets:         []runtime.Object{credsSecret()},
		sourceDiscovery: cached,
		workers:         1,
	})
	var got v1alpha1.ClusterWatchRule
	waitFor(t, 15*time.Second, "the ClusterWatchRule to be Ready", func() bool {
		got = f.clusterRule("everything")
		return conditionOf(got.Status.Conditions, v1alpha1.ConditionReady).Status == metav1.ConditionTrue
	})
	require.Equal(t, []string{"rbac.authorization.k8s.io/v1/clusterroles", "v1/configmaps"}, got.Status.Resources)
	require.Equal(t, []string{testNS}, got.Status.Namespaces)
	require.Contains(t, conditionOf(got.Status.Conditions, v1alpha1.ConditionReady).Message, `in the namespaces matching "team=web": [team-a]`)
	require.Equal(t, v1alpha1.ReasonResolved, conditionOf(got.Status.Conditions, v1alpha1.ConditionResourcesResolved).Reason)

	seen := func(gvrResource, ns, name string) bool {
		for _, ch := range f.joined.recorded() {
			if ch.GVR.Resource == gvrResource && ch.Namespace == ns && ch.Name == name && ch.Target == nn("web") {
				return true
			}
		}
		return false
	}
	waitFor(t, 10*time.Second, "the snapshot of the ClusterRole and the selected ConfigMap", func() bool {
		return seen("clusterroles", "", "viewer") && seen("configmaps", testNS, "settings")
	})
	require.False(t, seen("configmaps", "team-b", "other"), "team-b is not selected")

	// team-b is labelled: it is selected now.
	nsB := newNamespace("team-b", map[string]string{"team": "web"})
	_, err := f.dyn.Resource(namespacesResource).Update(context.Background(), nsB, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "team-b to be watched", func() bool {
		got = f.clusterRule("everything")
		return len(got.Status.Namespaces) == 2
	})
	require.Equal(t, []string{testNS, "team-b"}, got.Status.Namespaces)
	waitFor(t, 10*time.Second, "the ConfigMap of team-b", func() bool { return seen("configmaps", "team-b", "other") })

	// Deleted: its streams stop.
	require.NoError(t, f.dyn.Resource(v1alpha1.ClusterWatchRulesResource).Delete(context.Background(), "everything", metav1.DeleteOptions{}))
	waitFor(t, 10*time.Second, "the streams to stop", func() bool {
		synced, _ := f.sources.Cluster(testCluster).Status(clusterRuleOwner("everything"))
		return synced // an owner with no streams is trivially synced
	})
}

// TestClusterRuleTargetAndSpec: a ClusterWatchRule reports a missing target by namespace and
// name, and an unparsable namespaceSelector as InvalidSpec.
func TestClusterRuleTargetAndSpec(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed(""),
			newClusterRule("elsewhere", func(r *v1alpha1.ClusterWatchRule) { r.Spec.TargetRef.Namespace = "other" },
				rule([]string{""}, []string{"configmaps"})),
			newClusterRule("badsel", func(r *v1alpha1.ClusterWatchRule) {
				r.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Near"}}}
			}, rule([]string{""}, []string{"configmaps"}))),
		secrets: []runtime.Object{credsSecret()},
		workers: 1,
	})
	waitFor(t, 15*time.Second, "both rules to report", func() bool {
		return conditionOf(f.clusterRule("elsewhere").Status.Conditions, v1alpha1.ConditionReady).Reason == v1alpha1.ReasonTargetNotFound &&
			conditionOf(f.clusterRule("badsel").Status.Conditions, v1alpha1.ConditionReady).Reason == v1alpha1.ReasonInvalidSpec
	})
	require.Contains(t, conditionOf(f.clusterRule("elsewhere").Status.Conditions, v1alpha1.ConditionReady).Message, `GitTarget "web" not found in namespace "other"`)
	require.Contains(t, conditionOf(f.clusterRule("badsel").Status.Conditions, v1alpha1.ConditionReady).Message, "namespaceSelector")
}

// Every unresolved entry is named by its index, its resource and groups, and says what to do.
func TestDescribeUnresolved(t *testing.T) {
	rules := []v1alpha1.ResourceRule{
		{APIGroups: []string{""}, Resources: []string{"secrets", "bindings"}},
		{APIGroups: []string{"batch", "example.com"}, APIVersions: []string{"v2"}, Resources: []string{"*"}},
		{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles"}},
		{APIGroups: []string{"example.com"}, Resources: []string{"widgets"}},
	}
	got := describeUnresolved(rules, []watch.Unresolved{
		{Selector: 0, Resource: "secrets", Reason: watch.UnresolvedSecret},
		{Selector: 0, Resource: "bindings", Reason: watch.UnresolvedNotListable},
		{Selector: 1, Resource: "*", Reason: watch.UnresolvedVersionNotServed},
		{Selector: 2, Resource: "clusterroles", Reason: watch.UnresolvedClusterScoped},
		{Selector: 3, Resource: "widgets", Reason: watch.UnresolvedNotServed},
	})
	for _, want := range []string{
		`rules[0] "secrets" in apiGroups [""]: Secrets are mirrored only encrypted: set spec.encryption.age on the GitTarget (SecretsRefused)`,
		`rules[0] "bindings" in apiGroups [""]: served without the list and watch verbs, so it cannot be mirrored (NotListable)`,
		`rules[1] "*" in apiGroups ["batch", "example.com"]: served, but in none of apiVersions [v2] (VersionNotServed)`,
		`rules[2] "clusterroles" in apiGroups ["rbac.authorization.k8s.io"]: cluster-scoped, and a WatchRule mirrors only its own namespace: use a ClusterWatchRule (ClusterScoped)`,
		`rules[3] "widgets" in apiGroups ["example.com"]: not served by the cluster (yet)`,
	} {
		require.Contains(t, got, want)
	}
	require.Equal(t, 4, strings.Count(got, "; "), "entries are separated by semicolons")
}
