package controller

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// squatNS is the namespace of the tenant who tries to take team-a's remote cluster route.
const squatNS = "team-b"

// routeClaimants are GitTarget "a" of team-a, created first, and GitTarget "squat" of team-b,
// created an hour later, both naming the route "edge", each with a provider, its credentials
// and a kubeconfig Secret: team-a's for the real edge cluster, team-b's given by squatKubeconfig.
func routeClaimants(squatKubeconfig string) (objects, secrets []runtime.Object) {
	born := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a := remoteTarget("a", "edge-kc", "edge")
	a.CreationTimestamp = born
	squat := remoteTarget("squat", "squat-kc", "edge")
	squat.Namespace, squat.CreationTimestamp = squatNS, metav1.NewTime(born.Add(time.Hour))
	providerB := newProvider("git", bareRepo)
	providerB.Namespace = squatNS
	credsB := newSecret("creds", map[string]string{"password": testPassword})
	credsB.Namespace = squatNS
	kcB := newSecret("squat-kc", map[string]string{"value": squatKubeconfig})
	kcB.Namespace = squatNS
	return []runtime.Object{newProvider("git", bareRepo), providerB, a, squat},
		[]runtime.Object{credsSecret(), credsB, kcB,
			newSecret("edge-kc", map[string]string{"value": kubeconfigFor("https://edge.example:6443", "real")})}
}

// syncTargetIn syncs GitTarget name of namespace ns and returns it as stored.
func (f *fixture) syncTargetIn(ns, name string) v1alpha1.GitTarget {
	f.t.Helper()
	key := types.NamespacedName{Namespace: ns, Name: name}
	f.waitCachedIn(kindTarget, v1alpha1.GitTargetsResource, key)
	require.NoError(f.t, f.c.syncTarget(f.ctx, key))
	u, err := f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(ns).Get(f.ctx, name, metav1.GetOptions{})
	require.NoError(f.t, err)
	var t v1alpha1.GitTarget
	require.NoError(f.t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t))
	return t
}

// secretReads are the Secrets of namespace ns the controller read.
func (f *fixture) secretReads(ns string) []string {
	var names []string
	for _, a := range f.kube.Actions() {
		if g, ok := a.(clienttesting.GetAction); ok && a.GetVerb() == "get" && a.GetResource().Resource == "secrets" && a.GetNamespace() == ns {
			names = append(names, g.GetName())
		}
	}
	return names
}

// The attacker: team-b names team-a's audit route "edge" in a GitTarget, with a kubeconfig of
// its own cluster. The route is bound to team-a only, so the GitTarget is refused
// (AuditRouteNotBound) without its Secret even being read, and a restarted controller that
// reconciles the squatter first still gives the route to team-a's cluster.
func TestAuditRouteSquatRefused(t *testing.T) {
	for _, first := range []string{"a", "squat"} { // a controller restart may reconcile either first
		t.Run(first+" first", func(t *testing.T) {
			remote := &remoteFake{}
			objects, secrets := routeClaimants(kubeconfigFor("https://squatter.example:6443", "squatter"))
			f := newFixture(t, fixtureConfig{objects: objects, secrets: secrets, sourceClients: remote.clients,
				routeNamespaces: map[string][]string{"edge": {testNS}}})
			require.NoError(t, f.syncProvider("git"))
			order := []types.NamespacedName{{Namespace: testNS, Name: "a"}, {Namespace: squatNS, Name: "squat"}}
			if first == "squat" {
				order[0], order[1] = order[1], order[0]
			}
			for _, n := range order {
				f.syncTargetIn(n.Namespace, n.Name)
			}
			got := f.syncProbed(t, "a", v1alpha1.ReasonReachable)
			requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
			squat := f.syncTargetIn(squatNS, "squat")
			requireReady(t, squat.Status.Conditions, squat.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonAuditRouteNotBound,
				`audit route "edge" is not bound to namespace "team-b"`, "--audit-route-namespaces edge=team-b")
			_, routed := f.router.RouteOf(types.NamespacedName{Namespace: squatNS, Name: "squat"})
			require.False(t, routed)
			require.Empty(t, f.secretReads(squatNS), "the kubeconfig of a route not bound to its namespace is never read")
			require.Len(t, remote.builds, 1)
			require.Equal(t, "real", remote.builds[0].BearerToken, "the route's clients are team-a's")
		})
	}
}

// Two namespaces the platform bound to one route, whose GitTargets read different kubeconfigs:
// the older GitTarget owns the route, whichever is reconciled first, and the younger one is
// refused (SourceClusterConflict, naming the owner). A copy of the owner's kubeconfig in the
// other namespace shares the route.
func TestAuditRouteOwnerDeterministic(t *testing.T) {
	for _, first := range []string{"a", "squat"} {
		t.Run(first+" first", func(t *testing.T) {
			remote := &remoteFake{}
			objects, secrets := routeClaimants(kubeconfigFor("https://other.example:6443", "other"))
			f := newFixture(t, fixtureConfig{objects: objects, secrets: secrets, sourceClients: remote.clients,
				routeNamespaces: map[string][]string{"edge": {squatNS, testNS}}})
			require.NoError(t, f.syncProvider("git"))
			if first == "squat" {
				squat := f.syncTargetIn(squatNS, "squat")
				requireReady(t, squat.Status.Conditions, squat.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterConflict, "GitTarget team-a/a", `"team-a/edge-kc"`)
				require.Empty(t, remote.builds, "a younger claimant builds nothing, even first")
			}
			got := f.syncProbed(t, "a", v1alpha1.ReasonReachable)
			requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
			squat := f.syncTargetIn(squatNS, "squat")
			requireReady(t, squat.Status.Conditions, squat.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterConflict, "GitTarget team-a/a")
			require.Len(t, remote.builds, 1)
			require.Equal(t, "real", remote.builds[0].BearerToken)

			// team-b's Secret now holds a copy of team-a's kubeconfig: it shares the route.
			kc, err := f.kube.CoreV1().Secrets(squatNS).Get(context.Background(), "squat-kc", metav1.GetOptions{})
			require.NoError(t, err)
			kc.Data["value"] = []byte(kubeconfigFor("https://edge.example:6443", "real"))
			kc.ResourceVersion = "2"
			_, err = f.kube.CoreV1().Secrets(squatNS).Update(context.Background(), kc, metav1.UpdateOptions{})
			require.NoError(t, err)
			require.NoError(t, f.c.syncProvider(f.ctx, types.NamespacedName{Namespace: squatNS, Name: "git"}))
			squat = f.syncTargetIn(squatNS, "squat")
			requireReady(t, squat.Status.Conditions, squat.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
			require.Len(t, remote.builds, 1, "the same content shares the clients")
		})
	}
}

// An older GitTarget of a bound namespace takes the route over from a younger one that built
// its clients first (it named the route before the older one did): the younger one stops
// using it at once, its changes no longer routed.
func TestAuditRouteOwnerTakesOver(t *testing.T) {
	remote := &remoteFake{}
	objects, secrets := routeClaimants(kubeconfigFor("https://other.example:6443", "other"))
	a := objects[2].(*v1alpha1.GitTarget)
	a.Spec.SourceCluster = nil // a mirrors the local cluster for now
	f := newFixture(t, fixtureConfig{objects: objects, secrets: secrets, sourceClients: remote.clients,
		routeNamespaces: map[string][]string{"edge": {squatNS, testNS}}})
	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.c.syncProvider(f.ctx, types.NamespacedName{Namespace: squatNS, Name: "git"}))
	squat := f.syncTargetIn(squatNS, "squat")
	requireReady(t, squat.Status.Conditions, squat.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Len(t, remote.builds, 1)

	u, err := f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Get(f.ctx, "a", metav1.GetOptions{})
	require.NoError(t, err)
	u.Object["spec"].(map[string]any)["sourceCluster"] = map[string]any{"kubeConfigSecretRef": map[string]any{"name": "edge-kc"}, "auditRoute": "edge"}
	_, err = f.dyn.Resource(v1alpha1.GitTargetsResource).Namespace(testNS).Update(f.ctx, u, metav1.UpdateOptions{})
	require.NoError(t, err)
	f.syncTargetIn(testNS, "a")
	require.Len(t, remote.builds, 2)
	require.Equal(t, "real", remote.builds[1].BearerToken, "the owner's kubeconfig replaced the younger claimant's")
	_, routed := f.router.RouteOf(types.NamespacedName{Namespace: squatNS, Name: "squat"})
	require.False(t, routed, "the younger claimant stopped writing at once")
	squat = f.syncTargetIn(squatNS, "squat")
	requireReady(t, squat.Status.Conditions, squat.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterConflict, "GitTarget team-a/a")
}
