package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// A rule's operations select what is committed: with CREATE and DELETE only, bob's update
// makes no commit, and the delete after it still does.
func TestRuleOperationsSelectWhatIsCommitted(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-operations", "", []string{"alice", "bob"}, configMapWriters,
		[]v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
			Operations: []v1alpha1.Operation{v1alpha1.OperationCreate, v1alpha1.OperationDelete}}})
	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 1)
	_, err = clientFor(t, "bob").CoreV1().ConfigMaps(m.ns).Patch(ctx, "cfg", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.NoError(t, clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Delete(ctx, "cfg", metav1.DeleteOptions{}))
	got := m.waitCommits(t, 2)
	require.Equal(t, []string{
		"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-operations/cfg",
		"alice|alice@users.kubescribe.invalid|kubescribe|delete configmaps e2e-operations/cfg",
	}, got)
}

// Other kinds of writes name their real author: a generateName create, a create by an
// impersonating admin (the impersonated user is the author), and a deletecollection through
// the API (its author removes every file).
func TestOtherWritesNameTheirAuthor(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-writes", "", []string{"alice", "bob", "carol"}, configMapWriters, watchConfigMaps)
	alice, carol := clientFor(t, "alice"), clientFor(t, "carol")

	generated, err := alice.CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "gen-", Labels: map[string]string{"batch": "one"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 1)

	// admin (system:masters) sends the request as bob: the apiserver authorizes it as bob and
	// audits both; the author is bob, the impersonated user.
	impersonating := rest.CopyConfig(env.AdminConfig)
	impersonating.Impersonate = rest.ImpersonationConfig{UserName: "bob"}
	asBob, err := kubernetes.NewForConfig(impersonating)
	require.NoError(t, err)
	_, err = asBob.CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "by-impersonation", Labels: map[string]string{"batch": "one"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 2)

	require.NoError(t, carol.CoreV1().ConfigMaps(m.ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "batch=one"}))
	got := m.waitCommits(t, 3)
	require.Equal(t, "alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-writes/"+generated.Name, got[0])
	require.Equal(t, "bob|bob@users.kubescribe.invalid|kubescribe|create configmaps e2e-writes/by-impersonation", got[1])
	// Both deletions are carol's, one commit (one author, one window) or two.
	for _, c := range got[2:] {
		require.True(t, strings.HasPrefix(c, "carol|"), c)
	}
	require.Eventually(t, func() bool { return m.git(t, "ls-tree", "-r", "--name-only", "main") == "" }, 30*time.Second, 100*time.Millisecond,
		"the deletecollection removes both files")
	for _, c := range m.commits(t)[2:] {
		require.True(t, strings.HasPrefix(c, "carol|"), c)
	}
}
