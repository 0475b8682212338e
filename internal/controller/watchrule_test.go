package controller

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	clienttesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/secretenc"
	"github.com/kubescribe/kubescribe/internal/watch"
)

var allOps = []watch.Op{watch.OpCreate, watch.OpDelete, watch.OpUpdate}

// waitFor polls cond from the test goroutine (so cond may use require) until it holds.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readySeed is a Ready provider and a target "web" on it, writing to the fixture's repository.
func readySeed(path string) []runtime.Object {
	return []runtime.Object{newProvider("git", bareRepo), newTarget("web", "git", "main", path)}
}

// makeReady reconciles the seeded provider and target "web".
func (f *fixture) makeReady() {
	f.t.Helper()
	require.NoError(f.t, f.syncProvider("git"))
	require.NoError(f.t, f.syncTarget("web"))
	_, routed := f.route("web")
	require.True(f.t, routed, "target web is not Ready")
}

func TestSyncRule(t *testing.T) {
	core := []string{""}
	tests := []struct {
		name    string
		rule    *v1alpha1.WatchRule
		objects []runtime.Object
		ready   bool // reconcile provider and target first

		wantReason string
		wantMsg    []string
		notMsg     []string
	}{
		{
			name:       "target not found",
			rule:       newRule("cms", "nope", rule(core, []string{"configmaps"})),
			objects:    readySeed(""),
			ready:      true,
			wantReason: v1alpha1.ReasonTargetNotFound,
			wantMsg:    []string{`GitTarget "nope" not found in namespace "team-a"`},
		},
		{
			name:       "target not ready",
			rule:       newRule("cms", "web", rule(core, []string{"configmaps"})),
			objects:    []runtime.Object{newTarget("web", "missing-provider", "main", "")},
			wantReason: v1alpha1.ReasonTargetNotReady,
			wantMsg:    []string{`GitTarget "web" is not Ready`},
		},
		{
			name:       "nothing the cluster serves matches",
			rule:       newRule("cms", "web", rule([]string{"apps"}, []string{"deployments"})),
			objects:    readySeed(""),
			ready:      true,
			wantReason: v1alpha1.ReasonNoResourcesMatched,
			wantMsg:    []string{"no namespaced resource"},
			notMsg:     []string{"cluster-scoped"},
		},
		{
			name:       "only a cluster-scoped resource matches",
			rule:       newRule("cms", "web", rule(core, []string{"namespaces"})),
			objects:    readySeed(""),
			ready:      true,
			wantReason: v1alpha1.ReasonNoResourcesMatched,
			wantMsg:    []string{"no namespaced resource", "cluster-scoped", "v1/namespaces"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, fixtureConfig{
				objects: append(slices.Clone(tt.objects), tt.rule),
				secrets: []runtime.Object{credsSecret()},
			})
			if tt.ready {
				f.makeReady()
			} else {
				require.NoError(t, f.syncTarget("web"))
			}

			require.NoError(t, f.syncRule("cms"))

			got := f.watchRule("cms")
			c := requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, tt.wantReason, tt.wantMsg...)
			for _, s := range tt.notMsg {
				require.NotContains(t, c.Message, s)
			}
			require.Empty(t, got.Status.Resources)
			require.Empty(t, f.joined.recorded())
		})
	}
}

// TestSyncRuleWatchesConfigMaps follows a WatchRule from its first sync to a mirrored object in
// the repository: Progressing while the stream lists, then Ready; the listed object is a
// snapshot change and a later one is attributed; both reach the target's git worker.
func TestSyncRuleWatchesConfigMaps(t *testing.T) {
	gate := make(chan struct{})
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed("clusters/dev"),
			newRule("cms", "web", rule([]string{""}, []string{"configmaps"})),
			newConfigMap("settings")),
		secrets:    []runtime.Object{credsSecret()},
		sourceGate: gate,
	})
	f.makeReady()

	require.NoError(t, f.syncRule("cms"))
	got := f.watchRule("cms")
	c := readyCondition(t, got.Status.Conditions)
	require.Equal(t, v1alpha1.ReasonProgressing, c.Reason, c.Message)
	require.NotEqual(t, metav1.ConditionTrue, c.Status)
	require.Contains(t, c.Message, "listing v1/configmaps")
	require.Equal(t, []string{"v1/configmaps"}, got.Status.Resources)
	require.EqualValues(t, testGeneration, got.Status.ObservedGeneration)

	close(gate)
	waitFor(t, 15*time.Second, "the WatchRule to be Ready", func() bool {
		require.NoError(t, f.syncRule("cms"))
		got = f.watchRule("cms")
		return readyCondition(t, got.Status.Conditions).Status == metav1.ConditionTrue
	})
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady,
		`watching v1/configmaps in namespace "team-a"`)
	require.Equal(t, []string{"v1/configmaps"}, got.Status.Resources)

	// The initial list is a snapshot change for the target.
	waitFor(t, 10*time.Second, "the snapshot change", func() bool { return len(f.joined.recorded()) > 0 })
	snap := f.joined.recorded()[0]
	require.Equal(t, testCluster, snap.Cluster)
	require.Equal(t, nn("web"), snap.Target)
	require.Equal(t, configMapsGVR, snap.GVR)
	require.Equal(t, testNS, snap.Namespace)
	require.Equal(t, "settings", snap.Name)
	require.Equal(t, watch.OpCreate, snap.Op)
	require.True(t, snap.Snapshot)
	require.Equal(t, "name: settings\n", string(snap.Manifest))
	const settingsFile = "clusters/dev/team-a/core/configmaps/settings.yaml"
	waitFor(t, 15*time.Second, "the snapshot commit", func() bool {
		return slices.Contains(branchFiles(f.repoDir, "main"), settingsFile)
	})
	require.Equal(t, "name: settings", runGit(t, "", "--git-dir="+f.repoDir, "show", "main:"+settingsFile))

	// A change made now is mirrored with its author.
	_, err := f.dyn.Resource(configMapsGVR).Namespace(testNS).Create(context.Background(), newConfigMap("flags"), metav1.CreateOptions{})
	require.NoError(t, err)
	const flagsFile = "clusters/dev/team-a/core/configmaps/flags.yaml"
	waitFor(t, 15*time.Second, "the commit of the new ConfigMap", func() bool {
		return slices.Contains(branchFiles(f.repoDir, "main"), flagsFile)
	})
	require.Equal(t, "alice", runGit(t, "", "--git-dir="+f.repoDir, "log", "-1", "--format=%an", "main", "--", flagsFile))
}

// TestSyncRuleWatchFailed: a stream that cannot list (no RBAC) makes the rule WatchFailed
// until it can.
func TestSyncRuleWatchFailed(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed(""), newRule("cms", "web", rule([]string{""}, []string{"configmaps"}))),
		secrets: []runtime.Object{credsSecret()},
	})
	var forbidden atomic.Bool
	forbidden.Store(true)
	f.dyn.PrependReactor("list", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
		if forbidden.Load() {
			return true, nil, apierrors.NewForbidden(configMapsGVR.GroupResource(), "", errors.New("RBAC: access denied"))
		}
		return false, nil, nil
	})
	f.makeReady()

	var got v1alpha1.WatchRule
	waitFor(t, 15*time.Second, "WatchFailed", func() bool {
		require.NoError(t, f.syncRule("cms"))
		got = f.watchRule("cms")
		return readyCondition(t, got.Status.Conditions).Reason == v1alpha1.ReasonWatchFailed
	})
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonWatchFailed,
		"watching v1/configmaps", "forbidden")
	require.Equal(t, []string{"v1/configmaps"}, got.Status.Resources)

	forbidden.Store(false)
	waitFor(t, 30*time.Second, "Ready after the permission was granted", func() bool {
		require.NoError(t, f.syncRule("cms"))
		got = f.watchRule("cms")
		return readyCondition(t, got.Status.Conditions).Status == metav1.ConditionTrue
	})
}

// TestSyncRuleDiscoveryFails: when discovery itself fails the rule is WatchFailed and
// retried.
func TestSyncRuleDiscoveryFails(t *testing.T) {
	fd, _ := newDiscovery(nil)
	f := newFixture(t, fixtureConfig{
		objects:         append(readySeed(""), newRule("cms", "web", rule([]string{""}, []string{"configmaps"}))),
		secrets:         []runtime.Object{credsSecret()},
		sourceDiscovery: rawDiscovery{FakeDiscovery: fd, err: errors.New("the server is currently unable to handle the request")},
	})
	f.makeReady()
	require.NoError(t, f.syncRule("cms"))
	got := f.watchRule("cms")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonWatchFailed,
		"discovering", "unable to handle the request")
}

// TestSyncRuleRediscovers: a rule that matched nothing resolves once the cluster's discovery
// catalog is refreshed, so a CRD installed in the meantime is found although discovery is
// cached.
func TestSyncRuleRediscovers(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed(""), newRule("widgets", "web", rule([]string{"example.com"}, []string{"widgets"}))),
		secrets: []runtime.Object{credsSecret()},
	})
	f.makeReady()
	require.NoError(t, f.syncRule("widgets"))
	got := f.watchRule("widgets")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonNoResourcesMatched)

	// The CRD is installed.
	f.disc.Resources = append(coreV1(), &metav1.APIResourceList{
		GroupVersion: "example.com/v1",
		APIResources: []metav1.APIResource{apiResource("widgets", true, listWatch...)},
	})
	f.sources.Cluster(testCluster).RequestRefresh()
	waitFor(t, 15*time.Second, "the widgets stream to be Ready", func() bool {
		require.NoError(t, f.syncRule("widgets"))
		got = f.watchRule("widgets")
		return readyCondition(t, got.Status.Conditions).Status == metav1.ConditionTrue
	})
	require.Equal(t, []string{"example.com/v1/widgets"}, got.Status.Resources)
}

// TestSyncRuleFollowsTarget: the rule keeps watching while its target keeps writing (its
// provider failed a re-check but its last settings are still used); once the target stops
// being routed (its provider is deleted) the streams stop and the resources are cleared. A
// deleted rule syncs without error.
func TestSyncRuleFollowsTarget(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: append(readySeed(""), newRule("cms", "web", rule([]string{""}, []string{"configmaps"}))),
		secrets: []runtime.Object{credsSecret()},
	})
	f.makeReady()
	ruleReady := func() bool {
		require.NoError(t, f.syncRule("cms"))
		return readyCondition(t, f.watchRule("cms").Status.Conditions).Status == metav1.ConditionTrue
	}
	waitFor(t, 15*time.Second, "the WatchRule to be Ready", ruleReady)

	f.probe.setErr(errors.New("listing the repository: connection reset"))
	require.Error(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	require.True(t, ruleReady(), "the streams feeding a target that still writes keep running")

	require.NoError(t, f.dyn.Resource(v1alpha1.GitProvidersResource).Namespace(testNS).Delete(context.Background(), "git", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, exists, _ := f.c.informers[kindProvider].GetIndexer().GetByKey(nn("git").String())
		return !exists
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncRule("cms"))
	got := f.watchRule("cms")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonTargetNotReady)
	require.Empty(t, got.Status.Resources)
	synced, err := f.sources.Cluster(testCluster).Status(nn("cms").String())
	require.True(t, synced, "no stream is left for the rule")
	require.NoError(t, err)

	require.NoError(t, f.syncRule("gone"))
}

// TestSyncRuleProgressingIsUnknown: condition_types.go documents Progressing as "the reason
// of Ready=Unknown on every kind".
func TestSyncRuleProgressingIsUnknown(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	f := newFixture(t, fixtureConfig{
		objects:    append(readySeed(""), newRule("cms", "web", rule([]string{""}, []string{"configmaps"}))),
		secrets:    []runtime.Object{credsSecret()},
		sourceGate: gate,
	})
	f.makeReady()
	require.NoError(t, f.syncRule("cms"))
	got := f.watchRule("cms")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionUnknown, v1alpha1.ReasonProgressing)
}

// ---------------------------------------------------------------------------------------------
// resolveRules: the controller's selectors resolved by watch.Resolve, as a WatchRule sees them.

type resolvedResource struct {
	gvr schema.GroupVersionResource
	ops []watch.Op
}

type ignoredResources struct{ res watch.Resolution }

func (i ignoredResources) describe() string { return describeIgnored(i.res) }

func (i ignoredResources) list(gvrs []schema.GroupVersionResource) []string {
	out := []string{}
	for _, gvr := range gvrs {
		out = append(out, v1alpha1.FormatResource(gvr))
	}
	return out
}

func resolveRules(dc discovery.DiscoveryInterface, rules []v1alpha1.ResourceRule) ([]resolvedResource, ignoredResources, error) {
	res, err := watch.Resolve(dc, selectors(rules, false), true)
	var out []resolvedResource
	for _, r := range res.Resources {
		out = append(out, resolvedResource{gvr: r.GVR, ops: r.Operations})
	}
	slices.SortFunc(out, func(a, b resolvedResource) int {
		return strings.Compare(v1alpha1.FormatResource(a.gvr), v1alpha1.FormatResource(b.gvr))
	})
	return out, ignoredResources{res}, err
}

// rawLists is discovery as rawDiscovery hands it over: with subresources and resources that
// cannot be listed or watched, which resolveRules must skip itself.
func rawLists() []*metav1.APIResourceList {
	return []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			apiResource("configmaps", true, listWatch...),
			apiResource("secrets", true, listWatch...),
			apiResource("pods", true, listWatch...),
			apiResource("pods/status", true, "get", "patch", "update"),
			apiResource("bindings", true, "create"),
			apiResource("namespaces", false, listWatch...),
			apiResource("nodes", false, listWatch...),
			apiResource("componentstatuses", false, "get", "list"),
		}},
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{
			apiResource("deployments", true, listWatch...),
			apiResource("deployments/scale", true, "get", "patch", "update"),
		}},
		{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{
			apiResource("widgets", true, listWatch...),
			// A subresource that claims list and watch: only its name rules it out.
			apiResource("widgets/status", true, "get", "list", "watch", "update"),
			apiResource("widgetreports", true, "get", "list"),
		}},
	}
}

// resolvedMap indexes resolveRules' answer by FormatResource.
func resolvedMap(rs []resolvedResource) map[string][]watch.Op {
	m := map[string][]watch.Op{}
	for _, r := range rs {
		m[v1alpha1.FormatResource(r.gvr)] = r.ops
	}
	return m
}

func TestResolveRules(t *testing.T) {
	core, all := []string{""}, []string{"*"}
	tests := []struct {
		name        string
		rules       []v1alpha1.ResourceRule
		want        map[string][]watch.Op
		wantSkipped []string
	}{
		{
			name:  "every group and resource",
			rules: []v1alpha1.ResourceRule{rule(all, all)},
			want: map[string][]watch.Op{
				"v1/configmaps": allOps, "v1/pods": allOps, "apps/v1/deployments": allOps, "example.com/v1/widgets": allOps,
			},
			wantSkipped: []string{"v1/namespaces", "v1/nodes"},
		},
		{
			name:        "every resource of the core group",
			rules:       []v1alpha1.ResourceRule{rule(core, all)},
			want:        map[string][]watch.Op{"v1/configmaps": allOps, "v1/pods": allOps},
			wantSkipped: []string{"v1/namespaces", "v1/nodes"},
		},
		{
			name:  "one resource in every group",
			rules: []v1alpha1.ResourceRule{rule(all, []string{"widgets"})},
			want:  map[string][]watch.Op{"example.com/v1/widgets": allOps},
		},
		{
			name:  "group must match",
			rules: []v1alpha1.ResourceRule{rule([]string{"apps"}, []string{"configmaps", "deployments"})},
			want:  map[string][]watch.Op{"apps/v1/deployments": allOps},
		},
		{
			name:  "subresources are skipped",
			rules: []v1alpha1.ResourceRule{rule(all, []string{"pods/status", "deployments/scale", "widgets/status"})},
			want:  map[string][]watch.Op{},
		},
		{
			name: "resources without list and watch are skipped",
			rules: []v1alpha1.ResourceRule{
				rule(core, []string{"bindings", "componentstatuses"}),
				rule([]string{"example.com"}, []string{"widgetreports"}),
			},
			want: map[string][]watch.Op{},
		},
		{
			name: "operations are the union of the rules selecting a resource",
			rules: []v1alpha1.ResourceRule{
				rule(core, []string{"configmaps"}, v1alpha1.OperationCreate),
				rule(core, []string{"configmaps", "pods"}, v1alpha1.OperationDelete),
				rule(all, []string{"pods"}, v1alpha1.OperationUpdate, v1alpha1.OperationDelete),
			},
			want: map[string][]watch.Op{
				"v1/configmaps": {watch.OpCreate, watch.OpDelete},
				"v1/pods":       {watch.OpDelete, watch.OpUpdate},
			},
		},
		{
			name: "all operations absorb the others",
			rules: []v1alpha1.ResourceRule{
				rule(core, []string{"configmaps"}, v1alpha1.OperationCreate),
				rule(core, []string{"configmaps"}, v1alpha1.OperationAll),
				rule(core, []string{"pods"}),
			},
			want: map[string][]watch.Op{"v1/configmaps": allOps, "v1/pods": allOps},
		},
		{
			name: "a cluster-scoped match is skipped once",
			rules: []v1alpha1.ResourceRule{
				rule(core, []string{"namespaces"}),
				rule(all, []string{"namespaces", "configmaps"}),
			},
			want:        map[string][]watch.Op{"v1/configmaps": allOps},
			wantSkipped: []string{"v1/namespaces"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd, _ := newDiscovery(nil)
			resolved, ignored, err := resolveRules(rawDiscovery{FakeDiscovery: fd, lists: rawLists()}, tt.rules)
			skipped := ignored.list(ignored.res.ClusterScoped)
			require.NoError(t, err)
			require.Equal(t, tt.want, resolvedMap(resolved))
			require.Len(t, resolved, len(tt.want), "each resource once")
			require.ElementsMatch(t, tt.wantSkipped, skipped)
		})
	}
}

// TestResolveRulesPreferredVersions: a resource served in several versions is watched in the
// group's preferred version only, through the cached discovery the application uses.
func TestResolveRulesPreferredVersions(t *testing.T) {
	_, dc := newDiscovery([]*metav1.APIResourceList{
		{GroupVersion: "batch/v1", APIResources: []metav1.APIResource{ // listed first: preferred
			apiResource("cronjobs", true, listWatch...),
			apiResource("jobs", true, listWatch...),
		}},
		{GroupVersion: "batch/v1beta1", APIResources: []metav1.APIResource{
			apiResource("cronjobs", true, listWatch...),
			apiResource("legacyjobs", true, listWatch...), // served in this version only
		}},
		{GroupVersion: "v1", APIResources: []metav1.APIResource{apiResource("configmaps", true, listWatch...)}},
	})
	resolved, ignored, err := resolveRules(dc, []v1alpha1.ResourceRule{rule([]string{"batch"}, []string{"*"})})
	skipped := ignored.list(ignored.res.ClusterScoped)
	require.NoError(t, err)
	require.Empty(t, skipped)
	require.Equal(t, map[string][]watch.Op{
		"batch/v1/cronjobs":        allOps,
		"batch/v1/jobs":            allOps,
		"batch/v1beta1/legacyjobs": allOps,
	}, resolvedMap(resolved))
}

func TestResolveRulesDiscoveryErrors(t *testing.T) {
	fd, _ := newDiscovery(nil)
	rules := []v1alpha1.ResourceRule{rule([]string{"*"}, []string{"configmaps", "podmetrics"})}

	_, _, err := resolveRules(rawDiscovery{FakeDiscovery: fd, err: errors.New("connection refused")}, rules)
	require.ErrorContains(t, err, "discovering the cluster's resources")
	require.ErrorContains(t, err, "connection refused")

	// A group whose discovery failed (an aggregated API that is down) leaves the others.
	partial := &discovery.ErrGroupDiscoveryFailed{Groups: map[schema.GroupVersion]error{
		{Group: "metrics.k8s.io", Version: "v1beta1"}: errors.New("the server is currently unable to handle the request"),
	}}
	resolved, _, err := resolveRules(rawDiscovery{FakeDiscovery: fd, lists: rawLists(), err: partial}, rules)
	require.NoError(t, err)
	require.Equal(t, map[string][]watch.Op{"v1/configmaps": allOps}, resolvedMap(resolved))
}

// TestResolveRulesSortedAndStable: WatchRuleStatus.Resources is documented as sorted, and the
// controller writes the status whenever it differs from the last one.
func TestResolveRulesSortedAndStable(t *testing.T) {
	var res []metav1.APIResource
	for _, name := range []string{"configmaps", "endpoints", "events", "limitranges", "persistentvolumeclaims", "pods", "secrets", "serviceaccounts", "services"} {
		res = append(res, apiResource(name, true, listWatch...))
	}
	_, dc := newDiscovery([]*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: res},
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{apiResource("deployments", true, listWatch...)}},
	})
	var first []string
	for i := range 5 {
		resolved, _, err := resolveRules(dc, []v1alpha1.ResourceRule{rule([]string{"*"}, []string{"*"})})
		require.NoError(t, err)
		names := make([]string, 0, len(resolved))
		for _, r := range resolved {
			names = append(names, v1alpha1.FormatResource(r.gvr))
		}
		require.True(t, slices.IsSorted(names), "not sorted: %s", strings.Join(names, ", "))
		if i == 0 {
			first = names
		}
		require.Equal(t, first, names)
	}
}

// Secrets are never mirrored for a GitTarget that does not encrypt them, whether named or
// matched by "*": their data would reach Git unencrypted. The rule's message says so.
func TestResolveRulesNeverSelectsSecrets(t *testing.T) {
	fd, _ := newDiscovery(nil)
	for _, rules := range [][]v1alpha1.ResourceRule{
		{rule([]string{""}, []string{"secrets"})},
		{rule([]string{"*"}, []string{"*"})},
	} {
		resolved, ignored, err := resolveRules(rawDiscovery{FakeDiscovery: fd, lists: rawLists()}, rules)
		require.NoError(t, err)
		for _, r := range resolved {
			require.NotEqual(t, "secrets", r.gvr.Resource)
		}
		require.Equal(t, []string{"v1/secrets"}, ignored.list(ignored.res.Secrets))
		require.Contains(t, ignored.describe(), "Secrets are mirrored only encrypted, and the GitTarget sets no spec.encryption.age")
	}
}

// For a GitTarget that encrypts them, Secrets resolve like any resource, and only their
// streams seal; the attribution webhook's streams leave them out.
func TestSecretsResolveForAnEncryptingTarget(t *testing.T) {
	fd, _ := newDiscovery(nil)
	rules := []v1alpha1.ResourceRule{rule([]string{""}, []string{"secrets", "configmaps"})}
	res, err := watch.Resolve(rawDiscovery{FakeDiscovery: fd, lists: rawLists()}, selectors(rules, true), true)
	require.NoError(t, err)
	require.Empty(t, res.Secrets)
	require.Empty(t, res.Unresolved)
	seal, err := secretenc.NewEncrypter([]string{newRecipient(t)})
	require.NoError(t, err)
	specs, resources := streamSpecs(ruleRequest{target: nn("t")}, res, seal)
	require.Equal(t, []string{"v1/configmaps", "v1/secrets"}, resources)
	for _, s := range specs {
		if watch.IsSecret(s.GVR) {
			require.Equal(t, seal, s.Seal)
		} else {
			require.Nil(t, s.Seal, "%s is not sealed", s.GVR)
		}
	}
	c := &Controller{wanted: map[string][]watch.StreamSpec{}}
	c.want("team/rule", specs)
	for _, s := range c.wantedStreams() {
		require.False(t, watch.IsSecret(s.GVR), "the attribution webhook never covers Secrets")
	}
	require.Len(t, c.wantedStreams(), 1)
}

// TestSelectorsCarryExclusions: a rule's excludeFieldManagers and excludeUsers reach the
// resolved resource; two rules selecting one resource exclude only what both exclude.
func TestSelectorsCarryExclusions(t *testing.T) {
	fd, _ := newDiscovery(nil)
	rules := []v1alpha1.ResourceRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "pods"}, ExcludeFieldManagers: []string{"argocd-controller", "kubectl"}, ExcludeUsers: []string{"ci-bot"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, ExcludeFieldManagers: []string{"argocd-controller"}},
	}
	res, err := watch.Resolve(rawDiscovery{FakeDiscovery: fd, lists: rawLists()}, selectors(rules, false), true)
	require.NoError(t, err)
	got := map[string][2][]string{}
	for _, r := range res.Resources {
		got[r.GVR.Resource] = [2][]string{r.ExcludeFieldManagers, r.ExcludeUsers}
	}
	require.Equal(t, [2][]string{{"argocd-controller", "kubectl"}, {"ci-bot"}}, got["configmaps"])
	require.Equal(t, [2][]string{{"argocd-controller"}, nil}, got["pods"])
}
