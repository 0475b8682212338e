package controller

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// retargetSeed is a provider, target "web" writing to folder path of branch main, a WatchRule
// "cms" mirroring its namespace's ConfigMaps into it, and ConfigMap "settings".
func retargetSeed(path string) []runtime.Object {
	return []runtime.Object{
		newProvider("git", bareRepo),
		newTarget("web", "git", "main", path),
		newRule("cms", "web", rule([]string{""}, []string{"configmaps"})),
		newConfigMap("settings"),
	}
}

// settledAt mirrors the seed into path and waits until the target reports it Ready there.
func (f *fixture) settledAt(branch, path string) {
	f.t.Helper()
	f.makeReady()
	require.NoError(f.t, f.syncRule("cms"))
	file := cleanPath(path + "/" + testNS + "/core/configmaps/settings.yaml")
	waitFor(f.t, 30*time.Second, file+" on "+branch, func() bool { return slices.Contains(branchFiles(f.repoDir, branch), file) })
	require.NoError(f.t, f.syncTarget("web"))
	got := f.target("web")
	require.Equal(f.t, &v1alpha1.Destination{Branch: branch, Path: path}, got.Status.ObservedDestination)
}

// moveTarget changes target web's branch and path, as a user's edit of the spec would.
func (f *fixture) moveTarget(branch, path string) {
	f.t.Helper()
	got := f.target("web")
	got.Spec.Branch, got.Spec.Path = branch, path
	_, err := f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Update(context.Background(), toUnstructured(f.t, &got), metav1.UpdateOptions{})
	require.NoError(f.t, err)
}

// retargetingCondition returns the Retargeting condition, failing the test when there is none.
func retargetingCondition(t *testing.T, tg v1alpha1.GitTarget) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(tg.Status.Conditions, v1alpha1.ConditionRetargeting)
	require.NotNil(t, c, "no Retargeting condition in %v", tg.Status.Conditions)
	return *c
}

// syncUntilRetargeted re-syncs target web until its move is settled.
func (f *fixture) syncUntilRetargeted() v1alpha1.GitTarget {
	f.t.Helper()
	var got v1alpha1.GitTarget
	deadline := time.Now().Add(30 * time.Second)
	for {
		require.NoError(f.t, f.syncTarget("web"))
		got = f.target("web")
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionRetargeting)
		if c != nil && c.Status == metav1.ConditionFalse {
			return got
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the retarget did not settle: %+v", c)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// retargetedEvents lists the Retargeted events recorded about target web.
func (f *fixture) retargetedEvents() []corev1.Event {
	list, err := f.kube.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{})
	require.NoError(f.t, err)
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == v1alpha1.ReasonRetargeted && e.InvolvedObject.Name == "web" && e.InvolvedObject.Kind == "GitTarget" {
			out = append(out, e)
		}
	}
	return out
}

// TestRetargetPath: a changed path tears the old destination down first (route, streams,
// cursors), then snapshots into the new folder; observedDestination moves only once that is
// pushed. The old folder stays; the settled condition and an event name it, and the message
// survives later reconciles.
func TestRetargetPath(t *testing.T) {
	f := newFixture(t, fixtureConfig{objects: retargetSeed("old"), secrets: []runtime.Object{credsSecret()}})
	f.settledAt("main", "old")
	require.Nil(t, meta.FindStatusCondition(f.target("web").Status.Conditions, v1alpha1.ConditionRetargeting), "never retargeted")

	f.moveTarget("main", "new")
	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "old"}, got.Status.ObservedDestination, "nothing is pushed to the new folder yet")
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "new"}, got.Status.RetargetingTo)
	rc := retargetingCondition(t, got)
	require.Equal(t, metav1.ConditionTrue, rc.Status)
	require.Equal(t, v1alpha1.ReasonSnapshotPending, rc.Reason)
	require.Contains(t, rc.Message, `folder "old"`)
	require.Contains(t, rc.Message, `folder "new"`)
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionUnknown, v1alpha1.ReasonProgressing, "retargeting")
	require.Equal(t, []string{testCluster + " team-a/web main:old"}, f.drops.recorded(), "the old destination's cursors are dropped")
	route, routed := f.route("web")
	require.True(t, routed, "the new destination is valid")
	require.Equal(t, "new", route.Path)
	require.Equal(t, "main:new", route.Stream)

	// The rule has not subscribed to the new destination yet: the move waits for it.
	require.NoError(t, f.syncTarget("web"))
	require.Contains(t, retargetingCondition(t, f.target("web")).Message, "rule team-a/cms")
	require.NoError(t, f.syncRule("cms"))
	got = f.syncUntilRetargeted()
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "new"}, got.Status.ObservedDestination)
	require.Nil(t, got.Status.RetargetingTo)
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	rc = retargetingCondition(t, got)
	require.Equal(t, v1alpha1.ReasonRetargeted, rc.Reason)
	require.Contains(t, rc.Message, `moved from folder "old" of branch "main" to folder "new" of branch "main"`)
	require.Contains(t, rc.Message, "left in place")
	files := branchFiles(f.repoDir, "main")
	require.Contains(t, files, "new/"+testNS+"/core/configmaps/settings.yaml", "the snapshot is pushed before observedDestination moves")
	require.Contains(t, files, "old/"+testNS+"/core/configmaps/settings.yaml", "the old folder is never deleted")
	waitFor(t, 10*time.Second, "the Retargeted event", func() bool { return len(f.retargetedEvents()) == 1 })
	require.Contains(t, f.retargetedEvents()[0].Message, `folder "old"`)
	require.Equal(t, corev1.EventTypeNormal, f.retargetedEvents()[0].Type)

	// Later reconciles keep the message naming the old folder, and record no second event.
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncTarget("web"))
	require.Equal(t, rc.Message, retargetingCondition(t, f.target("web")).Message)
	require.Len(t, f.retargetedEvents(), 1)

	// Deleting the target removes all its cursors.
	require.NoError(t, f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Delete(context.Background(), "web", metav1.DeleteOptions{}))
	f.waitCached(kindTarget, v1alpha1.GitTargetsResource, "web")
	require.NoError(t, f.c.syncTarget(f.ctx, nn("web")))
	require.Equal(t, "team-a/web", f.drops.recorded()[len(f.drops.recorded())-1])
}

// TestRetargetBranch: a changed branch moves the target to another branch worker; the
// snapshot lands on the new branch, the old branch keeps its files.
func TestRetargetBranch(t *testing.T) {
	f := newFixture(t, fixtureConfig{objects: retargetSeed("apps"), secrets: []runtime.Object{credsSecret()}})
	f.settledAt("main", "apps")
	f.moveTarget("staging", "apps")
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncRule("cms"))
	got := f.syncUntilRetargeted()
	require.Equal(t, &v1alpha1.Destination{Branch: "staging", Path: "apps"}, got.Status.ObservedDestination)
	require.Contains(t, retargetingCondition(t, got).Message, `moved from folder "apps" of branch "main" to folder "apps" of branch "staging"`)
	require.Contains(t, branchFiles(f.repoDir, "staging"), "apps/"+testNS+"/core/configmaps/settings.yaml")
	require.Contains(t, branchFiles(f.repoDir, "main"), "apps/"+testNS+"/core/configmaps/settings.yaml")
	require.Equal(t, 1, f.router.WorkerCount(), "the old branch's worker stopped")
}

// TestRetargetRestartsMidMove: a second change while a move is in progress starts it over:
// the in-flight destination is torn down too (its cursors dropped), retargetingTo follows, and
// the settled message names where the content was, not the abandoned goal.
func TestRetargetRestartsMidMove(t *testing.T) {
	gate := make(chan struct{})
	f := newFixture(t, fixtureConfig{objects: retargetSeed("old"), secrets: []runtime.Object{credsSecret()}, sourceGate: gate})
	close(gate)
	f.settledAt("main", "old")

	f.moveTarget("main", "mid")
	require.NoError(t, f.syncTarget("web"))
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "mid"}, f.target("web").Status.RetargetingTo)

	f.moveTarget("main", "final")
	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "final"}, got.Status.RetargetingTo)
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "old"}, got.Status.ObservedDestination)
	require.Equal(t, []string{
		testCluster + " team-a/web main:old",
		testCluster + " team-a/web main:old", testCluster + " team-a/web main:mid",
	}, f.drops.recorded())
	route, _ := f.route("web")
	require.Equal(t, "final", route.Path)

	require.NoError(t, f.syncRule("cms"))
	got = f.syncUntilRetargeted()
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "final"}, got.Status.ObservedDestination)
	require.Contains(t, retargetingCondition(t, got).Message, `moved from folder "old" of branch "main" to folder "final"`)
	files := branchFiles(f.repoDir, "main")
	require.Contains(t, files, "final/"+testNS+"/core/configmaps/settings.yaml")
	require.False(t, slices.ContainsFunc(files, func(s string) bool { return len(s) > 4 && s[:4] == "mid/" }), "the abandoned destination was never written: %v", files)
}

// TestRetargetOverlapPrecedence: an established claim beats a pending one, even an older
// target's move into it; creation time only breaks ties between equal claims.
func TestRetargetOverlapPrecedence(t *testing.T) {
	older := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	newer := metav1.NewTime(older.Add(time.Hour))
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo),
			newTarget("web", "git", "main", "web", func(t *v1alpha1.GitTarget) { t.CreationTimestamp = older }),
			newTarget("apps", "git", "main", "apps", func(t *v1alpha1.GitTarget) { t.CreationTimestamp = newer }),
		},
		secrets: []runtime.Object{credsSecret()},
	})
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncTarget("apps"))
	f.waitCached(kindTarget, v1alpha1.GitTargetsResource, "apps")
	require.True(t, established(ptrTo(f.target("apps"))))

	// The older target moves into the newer one's folder: the newer one's established claim
	// wins, the move waits.
	f.moveTarget("main", "apps/web")
	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonPathOverlap, "GitTarget team-a/apps")
	rc := retargetingCondition(t, got)
	require.Equal(t, metav1.ConditionTrue, rc.Status)
	require.Contains(t, rc.Message, v1alpha1.ReasonPathOverlap)
	_, routed := f.route("web")
	require.False(t, routed)
	require.NoError(t, f.syncTarget("apps"))
	requireReady(t, f.target("apps").Status.Conditions, testGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)

	// Equal claims: the older wins.
	a := ptrTo(f.target("apps"))
	w := ptrTo(f.target("web"))
	require.True(t, strongerClaim(a, w), "established beats pending")
	require.False(t, strongerClaim(w, a))
	a.Status.RetargetingTo = &v1alpha1.Destination{Branch: "main", Path: "apps"}
	require.True(t, strongerClaim(w, a), "two pending claims: the older target wins")
}

func ptrTo[T any](v T) *T { return &v }

// TestRetargetWaitsForRedis: when the old destination's cursors cannot be dropped (Redis does
// not answer), the move does not go on: the sync fails (and is retried with backoff), nothing
// is written to the new destination, and status still says where the content is. Once Redis
// answers, the move proceeds.
func TestRetargetWaitsForRedis(t *testing.T) {
	f := newFixture(t, fixtureConfig{objects: retargetSeed("old"), secrets: []runtime.Object{credsSecret()}})
	f.settledAt("main", "old")
	f.drops.setErr(errors.New("dial tcp 127.0.0.1:6379: connect: connection refused"))
	f.moveTarget("main", "new")
	err := f.syncTarget("web")
	require.ErrorContains(t, err, "removing the resume cursors of folder \"old\" of branch \"main\"")
	require.ErrorContains(t, err, "connection refused")
	_, routed := f.route("web")
	require.False(t, routed, "the old destination stays torn down")
	got := f.target("web")
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "old"}, got.Status.ObservedDestination)
	require.Nil(t, got.Status.RetargetingTo)
	rc := retargetingCondition(t, got)
	require.Equal(t, metav1.ConditionTrue, rc.Status)
	require.Contains(t, rc.Message, "connection refused")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionUnknown, v1alpha1.ReasonProgressing, "retrying")

	f.drops.setErr(nil)
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncRule("cms"))
	got = f.syncUntilRetargeted()
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "new"}, got.Status.ObservedDestination)
	require.Equal(t, []string{testCluster + " team-a/web main:old", testCluster + " team-a/web main:old"}, f.drops.recorded(),
		"dropped when the move started, and once more when it settled")
}
