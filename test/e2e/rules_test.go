package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

var widgetsResource = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

// conditionOf reads one condition of an object of kubescribe.
func conditionOf(t *testing.T, gvr schema.GroupVersionResource, ns, name, typ string) *metav1.Condition {
	t.Helper()
	u, err := dynamicFor(t, "admin").Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	raw, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var conds []metav1.Condition
	for _, r := range raw {
		m, _ := r.(map[string]any)
		var c metav1.Condition
		if err := fromUnstructured(m, &c); err == nil {
			conds = append(conds, c)
		}
	}
	return meta.FindStatusCondition(conds, typ)
}

// statusList reads a string list of an object's status.
func statusList(t *testing.T, gvr schema.GroupVersionResource, ns, name, field string) []string {
	t.Helper()
	u, err := dynamicFor(t, "admin").Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	out, _, _ := unstructured.NestedStringSlice(u.Object, "status", field)
	return out
}

// A CRD created after start is mirrored once it is served, without a restart: the WatchRule
// selecting it, created before the CRD, says which entry is not served yet, then turns Ready,
// and a widget created later reaches Git with its author.
func TestCRDCreatedAfterStartIsMirrored(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-crd"
	m := newMirrorWithoutRule(t, ns, "", []string{"alice"}, []rbacv1.PolicyRule{
		{APIGroups: []string{"example.com"}, Resources: []string{"widgets"}, Verbs: []string{"create", "update", "patch", "delete", "get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
	})
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "rule", Namespace: ns},
		Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"}, Rules: []v1alpha1.ResourceRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}},
			{APIGroups: []string{"example.com"}, Resources: []string{"widgets"}},
		}},
	})
	ready := waitReady(t, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionFalse, v1alpha1.ReasonPartiallyResolved)
	require.Contains(t, ready.Message, `rules[1] "widgets" in apiGroups ["example.com"]: not served by the cluster (yet)`)
	resolved := conditionOf(t, v1alpha1.WatchRulesResource, ns, "rule", v1alpha1.ConditionResourcesResolved)
	require.NotNil(t, resolved)
	require.Equal(t, v1alpha1.ReasonPartiallyResolved, resolved.Reason)
	require.Equal(t, []string{"v1/configmaps"}, statusList(t, v1alpha1.WatchRulesResource, ns, "rule", "resources"))

	crds, err := apiextensionsclient.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	_, err = crds.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD(), metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = crds.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), "widgets.example.com", metav1.DeleteOptions{})
	})
	dc, err := discovery.NewDiscoveryClientForConfig(env.AdminConfig)
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool {
		list, err := dc.ServerResourcesForGroupVersion("example.com/v1")
		return err == nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == "widgets" })
	}), "widgets.example.com is not served")

	// No restart: the CRD's events refresh discovery and the rule resolves again.
	waitReady(t, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Equal(t, []string{"example.com/v1/widgets", "v1/configmaps"}, statusList(t, v1alpha1.WatchRulesResource, ns, "rule", "resources"))
	require.Equal(t, v1alpha1.ReasonResolved, conditionOf(t, v1alpha1.WatchRulesResource, ns, "rule", v1alpha1.ConditionResourcesResolved).Reason)

	widget := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "sprocket", "namespace": ns},
		"spec":     map[string]any{"size": "large"},
	}}
	_, err = dynamicFor(t, "alice").Resource(widgetsResource).Namespace(ns).Create(ctx, widget, metav1.CreateOptions{})
	require.NoError(t, err)
	file := objectFile(m, "example.com", "widgets", "sprocket")
	require.Equal(t, "alice|create widgets e2e-crd/sprocket", waitAuthor(t, m, file))
	require.Contains(t, m.git(t, "show", "main:"+file), "size: large")
}

func widgetCRD() *apiextensionsv1.CustomResourceDefinition {
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", XPreserveUnknownFields: &preserve},
					},
				}},
			}},
		},
	}
}

// A ClusterWatchRule mirrors ClusterRoles into <path>/_cluster/rbac.authorization.k8s.io/
// clusterroles/, with the author of a ClusterRole created later.
func TestClusterWatchRuleMirrorsClusterRoles(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-clusterroles"
	m := newMirrorWithoutRule(t, ns, "cluster", nil, nil)
	admin := clientFor(t, "admin")
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-clusterrole-writer"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"clusterroles"}, Verbs: []string{"create", "delete"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-clusterrole-writer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "e2e-clusterrole-writer"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "bob"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), "e2e-clusterrole-writer", metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), "e2e-clusterrole-writer", metav1.DeleteOptions{})
		_ = dynamicFor(t, "admin").Resource(v1alpha1.ClusterWatchRulesResource).Delete(context.Background(), "clusterroles", metav1.DeleteOptions{})
	})

	create(t, v1alpha1.ClusterWatchRulesResource, "", &v1alpha1.ClusterWatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "ClusterWatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "clusterroles"},
		Spec: v1alpha1.ClusterWatchRuleSpec{
			TargetRef: v1alpha1.NamespacedObjectReference{Namespace: ns, Name: "target"},
			Rules:     []v1alpha1.ResourceRule{{APIGroups: []string{"rbac.authorization.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"clusterroles"}}},
		},
	})
	waitReady(t, v1alpha1.ClusterWatchRulesResource, "", "clusterroles", metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Equal(t, []string{"rbac.authorization.k8s.io/v1/clusterroles"}, statusList(t, v1alpha1.ClusterWatchRulesResource, "", "clusterroles", "resources"))
	// The snapshot holds the ClusterRoles that exist, kubescribe's own among them.
	m.waitCommits(t, 1)
	require.True(t, poll(60*time.Second, func() bool {
		return strings.Contains(m.git(t, "ls-tree", "-r", "--name-only", "main"), "cluster/_cluster/rbac.authorization.k8s.io/clusterroles/kubescribe.yaml")
	}), "the snapshot has no file for ClusterRole kubescribe")

	_, err = clientFor(t, "bob").RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-made-by-bob", Labels: map[string]string{"made-by": "bob"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), "e2e-made-by-bob", metav1.DeleteOptions{})
	})
	const file = "cluster/_cluster/rbac.authorization.k8s.io/clusterroles/e2e-made-by-bob.yaml"
	require.Equal(t, "bob|create clusterroles e2e-made-by-bob", waitAuthor(t, m, file))
	require.Contains(t, m.git(t, "show", "main:"+file), "made-by: bob")
}

// gitOrEmpty runs git on the mirror's repository; "" when it fails (no branch yet).
func gitOrEmpty(m *mirror, args ...string) string {
	out, err := exec.Command("git", append([]string{"--git-dir", m.repoDir}, args...)...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// waitAuthor waits until a commit of main touches file and returns the newest one as
// "<author>|<subject>".
func waitAuthor(t *testing.T, m *mirror, file string) string {
	t.Helper()
	var got string
	require.True(t, poll(60*time.Second, func() bool {
		got = gitOrEmpty(m, "log", "-1", "--format=%an|%s", "main", "--", file)
		return got != ""
	}), "no commit of %s", file)
	return got
}

// newMirrorWithoutRule is newMirror without the WatchRule: the namespace, its writers, the
// repository, GitProvider and GitTarget "target", waited for until Ready.
func newMirrorWithoutRule(t *testing.T, ns, path string, users []string, rules []rbacv1.PolicyRule) *mirror {
	t.Helper()
	m := setUpTarget(t, env, ns, path, users, rules)
	waitReady(t, v1alpha1.GitTargetsResource, ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)
	return m
}

// selectingClusterRule creates ClusterWatchRule name, removed at cleanup, mirroring ConfigMaps
// for GitTarget ns/target in the namespaces labelled label=yes; it returns a function that reads
// the rule's status.namespaces.
func selectingClusterRule(t *testing.T, name, ns, target, label string) func() []string {
	t.Helper()
	t.Cleanup(func() {
		_ = dynamicFor(t, "admin").Resource(v1alpha1.ClusterWatchRulesResource).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	create(t, v1alpha1.ClusterWatchRulesResource, "", &v1alpha1.ClusterWatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "ClusterWatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ClusterWatchRuleSpec{
			TargetRef:         v1alpha1.NamespacedObjectReference{Namespace: ns, Name: target},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{label: "yes"}},
			Rules:             watchConfigMaps,
		},
	})
	return func() []string { return statusList(t, v1alpha1.ClusterWatchRulesResource, "", name, "namespaces") }
}

// relabelNamespace sets label of namespace ns to value, through client.
func relabelNamespace(t *testing.T, client kubernetes.Interface, ns, label, value string) {
	t.Helper()
	_, err := client.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+label+`":"`+value+`"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
}

// countLogLines counts the lines of kubescribe's JSON log whose msg is msg and whose resource
// attribute contains resource.
func countLogLines(t *testing.T, path, msg, resource string) int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg      string `json:"msg"`
			Resource string `json:"resource"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && strings.HasPrefix(line.Msg, msg) && strings.Contains(line.Resource, resource) {
			n++
		}
	}
	require.NoError(t, sc.Err())
	return n
}

// A namespace that leaves a ClusterWatchRule's namespaceSelector keeps its files; while it is
// out, bob patches one of its ConfigMaps and carol removes the other's file from the branch.
// Once the namespace matches again, its stream resumes from its cursor: bob's patch is
// committed as his, the removed file is written again by the committer, and nothing else is
// listed.
func TestNamespaceBackInTheSelectionResumes(t *testing.T) {
	ctx := context.Background()
	const ns, watched, label = "e2e-reselect", "e2e-reselect-apps", "e2e-reselect"
	m := newMirrorWithoutRule(t, ns, "", nil, nil)
	admin := clientFor(t, "admin")
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: watched, Labels: map[string]string{label: "yes"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bindRole(t, admin, watched, "writers", configMapWriters, "alice", "bob")
	selected := selectingClusterRule(t, "reselect", ns, "target", label)
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(selected(), []string{watched}) }), "namespaces: %v", selected())
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(watched), clientFor(t, "bob").CoreV1().ConfigMaps(watched)
	createConfigMaps(t, alice, "one", "two")
	one, two := watched+"/core/configmaps/one.yaml", watched+"/core/configmaps/two.yaml"
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(m.files(t), []string{one, two}) }), "files: %v", m.files(t))
	committer := strings.Split(m.commits(t)[0], "|")[2]

	relabel := func(value string) { relabelNamespace(t, admin, watched, label, value) }
	relabel("no")
	require.True(t, poll(60*time.Second, func() bool { return len(selected()) == 0 }), "namespaces: %v", selected())
	require.Equal(t, []string{one, two}, m.files(t), "a namespace that is no longer selected keeps its files")

	_, err = bob.Patch(ctx, "one", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	foreign := m.carolCommits(t, "carol removes two", map[string]string{two: ""})
	before := m.commits(t)

	relabel("yes")
	require.True(t, poll(90*time.Second, func() bool {
		return slices.Equal(m.files(t), []string{one, two}) && strings.Contains(m.git(t, "show", "main:"+one), "k: v2")
	}), "files: %v", m.files(t))
	m.git(t, "merge-base", "--is-ancestor", foreign, "main") // fails the test unless carol's commit is kept
	require.Equal(t, map[string]string{"one": "bob update", "two": committer + " create"}, m.lastChanges(t, len(before)))
}
