package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/attribution"
)

var configMapWriters = []rbacv1.PolicyRule{{
	APIGroups: []string{""}, Resources: []string{"configmaps"},
	Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"},
}}

var watchConfigMaps = []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}

// alice creates a ConfigMap, bob patches it, alice deletes it: the repository holds exactly
// those three changes, authored by them and committed by kubescribe, in declared form.
func TestChangesAreAuthoredByTheirWriters(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-authors", "clusters/dev", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	alice, bob := clientFor(t, "alice"), clientFor(t, "bob")
	file := objectFile(m, "", "configmaps", "app-config")

	_, err := alice.CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "app-config", Labels: map[string]string{"app": "shop"}},
		Data:       map[string]string{"greeting": "hello"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 1)
	require.Equal(t, `apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  namespace: e2e-authors
  labels:
    app: shop
data:
  greeting: hello
`, m.git(t, "show", "main:"+file)+"\n")

	_, err = bob.CoreV1().ConfigMaps(m.ns).Patch(ctx, "app-config", types.MergePatchType,
		[]byte(`{"data":{"greeting":"hi","farewell":"bye"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 2)
	patched := m.git(t, "show", "main:"+file)
	require.Contains(t, patched, "  farewell: bye\n  greeting: hi")
	for _, serverSide := range []string{"uid", "resourceVersion", "managedFields", "creationTimestamp", "status"} {
		require.NotContains(t, patched, serverSide)
	}

	require.NoError(t, alice.CoreV1().ConfigMaps(m.ns).Delete(ctx, "app-config", metav1.DeleteOptions{}))
	got := m.waitCommits(t, 3)
	require.Equal(t, []string{
		"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-authors/app-config",
		"bob|bob@users.kubescribe.invalid|kubescribe|update configmaps e2e-authors/app-config",
		"alice|alice@users.kubescribe.invalid|kubescribe|delete configmaps e2e-authors/app-config",
	}, got)
	require.Empty(t, m.git(t, "ls-tree", "-r", "--name-only", "main"), "the last commit removes the file")

	// Each commit names the audit event that proves its author.
	body := m.git(t, "log", "--format=%B", "main")
	require.Equal(t, 3, strings.Count(body, "Kubescribe-Audit-ID: "), body)
	require.Equal(t, 3, strings.Count(body, "Kubescribe-Attribution: resolved"), body)

	// The GitTarget reports what it pushed last.
	tgt, err := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(m.ns).Get(ctx, "target", metav1.GetOptions{})
	require.NoError(t, err)
	require.True(t, poll(10*time.Second, func() bool {
		tgt, err = dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(m.ns).Get(ctx, "target", metav1.GetOptions{})
		sha, _, _ := unstructuredString(tgt.Object, "status", "lastCommit")
		return err == nil && sha == m.git(t, "rev-parse", "main")
	}), "status.lastCommit should be the head of main")
}

// A change no audit event explains (leases are excluded by kubescribe's audit policy) is
// committed under the explicit unresolved identity, never under the committer's.
func TestUnexplainedChangeIsAuthoredUnresolved(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-unresolved", "", []string{"alice"},
		[]rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "get", "list", "watch"}}},
		[]v1alpha1.ResourceRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}}})
	holder := "alice"
	_, err := clientFor(t, "alice").CoordinationV1().Leases(m.ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "leader"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// Usually a grace window (8s here). Should the lease be written within two seconds of
	// kubescribe's first audit batch after a restart, it waits the resume grace (130s) instead:
	// its own batch might have been one the apiserver could not deliver yet.
	var got []string
	require.True(t, poll(3*time.Minute, func() bool { got = m.commits(t); return len(got) == 1 }), "commits: %q", got)
	require.Equal(t, []string{
		attribution.UnresolvedUsername + "|unknown@users.kubescribe.invalid|kubescribe|create leases e2e-unresolved/leader",
	}, got)
	require.Contains(t, m.git(t, "log", "-1", "--format=%B", "main"), "Kubescribe-Attribution: unresolved")
	require.Contains(t, m.git(t, "show", "main:"+objectFile(m, "coordination.k8s.io", "leases", "leader")), "holderIdentity: alice")
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	cur := any(obj)
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}
