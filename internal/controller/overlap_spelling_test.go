package controller

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh/knownhosts"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// TestOverlapAcrossNamespacesSeesEverySpelling is the attacker's test of the cross-namespace
// folder-overlap check: namespace team-b creates GitProviders naming team-a's repository in
// another spelling each (a default port, a doubled slash, a trailing "/?", ssh://, scp-like) and
// a GitTarget on each, on a folder inside team-a's. None is routed: each is refused with
// PathOverlap naming team-a's GitTarget. Another repository on the same server is not refused.
func TestOverlapAcrossNamespacesSeesEverySpelling(t *testing.T) {
	const (
		tenantNS   = testNS
		attackerNS = "team-b"
		// The tenant's repository: a loopback address, so that its worker's attempts fail at once.
		tenantURL = "https://127.0.0.1/org/repo"
	)
	spellings := map[string]string{
		"port":     "https://127.0.0.1:443/org/repo",
		"slashes":  "https://127.0.0.1//org/repo",
		"query":    "https://127.0.0.1/org/repo/?",
		"ssh":      "ssh://git@127.0.0.1/org/repo",
		"scp-like": "git@127.0.0.1:org/repo",
		"mixed":    "HTTPS://127.0.0.1:443/Org/Repo.git",
		"ssh-port": "ssh://git@127.0.0.1:22//org/repo.git/",
	}
	older := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	newer := metav1.NewTime(older.Add(time.Hour))
	inNS := func(ns string) func(*metav1.ObjectMeta) {
		return func(m *metav1.ObjectMeta) { m.Namespace, m.CreationTimestamp = ns, newer }
	}

	key, _ := newSSHKeyPEM(t)
	_, hostKey := newSSHKeyPEM(t)
	sshSecret := newSecret("ssh-creds", map[string]string{"identity": key, "known_hosts": knownhosts.Line([]string{"127.0.0.1"}, hostKey) + "\n"})
	sshSecret.Namespace = attackerNS
	tokenSecret := newSecret("creds", map[string]string{"password": testPassword})
	tokenSecret.Namespace = attackerNS

	objects := []runtime.Object{
		newProvider("git", tenantURL),
		newTarget("tenant", "git", "main", "apps", func(t *v1alpha1.GitTarget) { t.CreationTimestamp = older }),
		newProvider("other-repo", "https://127.0.0.1/org/other", func(p *v1alpha1.GitProvider) { inNS(attackerNS)(&p.ObjectMeta) }),
		newTarget("other-repo", "other-repo", "main", "apps/web", func(t *v1alpha1.GitTarget) { inNS(attackerNS)(&t.ObjectMeta) }),
	}
	for name, url := range spellings {
		objects = append(objects,
			newProvider(name, url, func(p *v1alpha1.GitProvider) {
				inNS(attackerNS)(&p.ObjectMeta)
				if url[0] == 'g' || url[0] == 's' {
					p.Spec.SecretRef.Name = "ssh-creds"
				}
			}),
			newTarget(name, name, "main", "apps/web", func(t *v1alpha1.GitTarget) { inNS(attackerNS)(&t.ObjectMeta) }))
	}
	f := newFixture(t, fixtureConfig{objects: objects, secrets: []runtime.Object{credsSecret(), sshSecret, tokenSecret}})

	require.NoError(t, f.syncProvider("git"))
	require.NoError(t, f.syncTarget("tenant"))
	require.True(t, f.router.Routed(nn("tenant")), "the tenant's GitTarget writes its folder")

	attacker := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: attackerNS, Name: name} }
	for name, url := range spellings {
		require.NoError(t, f.syncIn(kindProvider, v1alpha1.GitProvidersResource, attacker(name)))
		var p v1alpha1.GitProvider
		f.getIn(v1alpha1.GitProvidersResource, attacker(name), &p)
		requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)

		require.NoError(t, f.syncIn(kindTarget, v1alpha1.GitTargetsResource, attacker(name)))
		var got v1alpha1.GitTarget
		f.getIn(v1alpha1.GitTargetsResource, attacker(name), &got)
		c := readyCondition(t, got.Status.Conditions)
		require.Equal(t, v1alpha1.ReasonPathOverlap, c.Reason, "%s (%s): %s", name, url, c.Message)
		require.Contains(t, c.Message, "GitTarget "+tenantNS+"/tenant")
		require.False(t, f.router.Routed(attacker(name)), "%s (%s) was routed onto the tenant's folder", name, url)
	}
	require.True(t, f.router.Routed(nn("tenant")), "the tenant's GitTarget still writes its folder")

	// Another repository on the same server is not the tenant's.
	require.NoError(t, f.syncIn(kindProvider, v1alpha1.GitProvidersResource, attacker("other-repo")))
	require.NoError(t, f.syncIn(kindTarget, v1alpha1.GitTargetsResource, attacker("other-repo")))
	var other v1alpha1.GitTarget
	f.getIn(v1alpha1.GitTargetsResource, attacker("other-repo"), &other)
	require.NotEqual(t, v1alpha1.ReasonPathOverlap, readyCondition(t, other.Status.Conditions).Reason)
	require.True(t, f.router.Routed(attacker("other-repo")))
}

// syncIn syncs an object of any namespace once the controller's cache holds it as stored
// (waitCached, for namespaces other than testNS).
func (f *fixture) syncIn(k kind, gvr schema.GroupVersionResource, name types.NamespacedName) error {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		u, err := f.dyn.Resource(gvr).Namespace(name.Namespace).Get(context.Background(), name.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		obj, exists, _ := f.c.informers[k].GetIndexer().GetByKey(name.String())
		return exists && equality.Semantic.DeepEqual(obj.(interface{ UnstructuredContent() map[string]any }).UnstructuredContent(), u.Object)
	}, 5*time.Second, time.Millisecond, "the controller's cache of %s %s did not catch up", k, name)
	switch k {
	case kindProvider:
		return f.c.syncProvider(f.ctx, name)
	case kindTarget:
		return f.c.syncTarget(f.ctx, name)
	}
	f.t.Fatalf("syncIn: kind %s", k)
	return nil
}

// getIn reads an object of any namespace back through the fake dynamic client.
func (f *fixture) getIn(gvr schema.GroupVersionResource, name types.NamespacedName, out runtime.Object) {
	f.t.Helper()
	u, err := f.dyn.Resource(gvr).Namespace(name.Namespace).Get(context.Background(), name.Name, metav1.GetOptions{})
	require.NoError(f.t, err)
	require.NoError(f.t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out))
}
