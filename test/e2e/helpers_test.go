package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/stack"
)

// configFor is the rest config of a token user of the control plane.
func configFor(user string) *rest.Config {
	if user == "admin" {
		return env.AdminConfig
	}
	return env.UserConfig(user)
}

func clientFor(t *testing.T, user string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(configFor(user))
	require.NoError(t, err)
	return c
}

func dynamicFor(t *testing.T, user string) dynamic.Interface {
	t.Helper()
	c, err := dynamic.NewForConfig(configFor(user))
	require.NoError(t, err)
	return c
}

// mirror is one namespace mirrored into one repository.
type mirror struct {
	ns, repo, path string
	repoDir        string
}

// newMirror creates namespace ns where the given users may write the given resources, a Git
// repository, and the GitProvider, GitTarget and WatchRule that mirror those resources into
// folder path of branch main. It waits until the WatchRule is Ready.
func newMirror(t *testing.T, ns, path string, users []string, rules []rbacv1.PolicyRule, watch []v1alpha1.ResourceRule) *mirror {
	t.Helper()
	return newMirrorOn(t, env, ns, path, users, rules, watch)
}

// newMirrorOn is newMirror on stack s.
func newMirrorOn(t *testing.T, s *stack.Stack, ns, path string, users []string, rules []rbacv1.PolicyRule, watch []v1alpha1.ResourceRule) *mirror {
	t.Helper()
	m := setUpTarget(t, s, ns, path, users, rules)
	createOn(t, s.AdminConfig, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "rule", Namespace: ns},
		Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"}, Rules: watch},
	})
	waitReadyOn(t, s.AdminConfig, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady)
	return m
}

// startStack starts a stack of the test's own with opts (a new folder, testGrace and the test's
// log unless opts says otherwise), waits until it is ready, and stops it when the test ends,
// dumping its logs first if the test failed.
func startStack(t *testing.T, opts stack.Options) *stack.Stack {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Grace == 0 {
		opts.Grace = testGrace
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := stack.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			s.DumpLogs(os.Stderr, 60)
		}
		require.NoError(t, s.Stop())
	})
	return s
}

// setUpTarget creates, on stack s, namespace ns where the given users may write the given
// resources, a Git repository, and the GitProvider "repo" and GitTarget "target" writing into
// folder path of branch main. It does not wait.
func setUpTarget(t *testing.T, s *stack.Stack, ns, path string, users []string, rules []rbacv1.PolicyRule) *mirror {
	t.Helper()
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(s.AdminConfig)
	require.NoError(t, err)
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	if len(rules) > 0 {
		bindRole(t, admin, ns, "writers", rules, users...)
	}
	m := newRepoProvider(t, s, admin, ns, time.Second)
	m.path = path
	createOn(t, s.AdminConfig, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: ns},
		Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main", Path: path},
	})
	return m
}

// bindRole creates Role name in ns with rules, bound to the given users.
func bindRole(t *testing.T, admin kubernetes.Interface, ns, name string, rules []rbacv1.PolicyRule, users ...string) {
	t.Helper()
	ctx := context.Background()
	_, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{})
	require.NoError(t, err)
	var subjects []rbacv1.Subject
	for _, u := range users {
		subjects = append(subjects, rbacv1.Subject{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: u})
	}
	_, err = admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	// The apiserver's RBAC authorizer learns of the binding from its informers, a moment
	// later: wait until it allows what the Role's first rule grants (first verb, resource and
	// resource name), so the users' first request is not refused.
	r := rules[0]
	resource, sub, _ := strings.Cut(r.Resources[0], "/")
	attrs := &authorizationv1.ResourceAttributes{Namespace: ns, Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: resource, Subresource: sub}
	if len(r.ResourceNames) > 0 {
		attrs.Name = r.ResourceNames[0]
	}
	for _, u := range users {
		require.True(t, poll(30*time.Second, func() bool {
			sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: u, ResourceAttributes: attrs}}, metav1.CreateOptions{})
			return err == nil && sar.Status.Allowed
		}), "Role %s is not in effect for %s", name, u)
	}
}

// createConfigMaps creates a ConfigMap holding k: v1 for each name, through client.
func createConfigMaps(t *testing.T, client typedcorev1.ConfigMapInterface, names ...string) {
	t.Helper()
	for _, name := range names {
		_, err := client.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

// newRepoProvider creates, on stack s, a Git repository named ns, the Secret "git-credentials"
// for it in namespace ns, and the GitProvider "repo" with the given commit window.
func newRepoProvider(t *testing.T, s *stack.Stack, admin kubernetes.Interface, ns string, window time.Duration) *mirror {
	t.Helper()
	m := &mirror{ns: ns, repo: ns}
	var err error
	m.repoDir, err = s.Git.CreateRepo(m.repo)
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "git-credentials"},
		Data: map[string][]byte{
			v1alpha1.SecretKeyUsername: []byte(s.Git.Username),
			v1alpha1.SecretKeyPassword: []byte(s.Git.Password),
			v1alpha1.SecretKeyCACert:   s.Git.CAData,
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	createOn(t, s.AdminConfig, v1alpha1.GitProvidersResource, ns, &v1alpha1.GitProvider{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
		ObjectMeta: metav1.ObjectMeta{Name: "repo", Namespace: ns},
		Spec: v1alpha1.GitProviderSpec{
			URL:          s.Git.URL(m.repo),
			SecretRef:    &v1alpha1.LocalObjectReference{Name: "git-credentials"},
			CommitWindow: &metav1.Duration{Duration: window},
		},
	})
	return m
}

func create(t *testing.T, gvr schema.GroupVersionResource, ns string, obj any) {
	t.Helper()
	createOn(t, env.AdminConfig, gvr, ns, obj)
}

// createOn creates obj as the user of cfg.
func createOn(t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource, ns string, obj any) {
	t.Helper()
	content, err := runtimeToUnstructured(obj)
	require.NoError(t, err)
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	_, err = client.Resource(gvr).Namespace(ns).Create(context.Background(), content, metav1.CreateOptions{})
	require.NoError(t, err)
}

// waitReady waits until the object's Ready condition has the status and reason, and, when
// given, describes at least generation minGeneration.
func waitReady(t *testing.T, gvr schema.GroupVersionResource, ns, name string, status metav1.ConditionStatus, reason string, minGeneration ...int64) *metav1.Condition {
	t.Helper()
	return waitReadyOn(t, env.AdminConfig, gvr, ns, name, status, reason, minGeneration...)
}

// waitReadyOn is waitReady on the cluster of cfg.
func waitReadyOn(t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource, ns, name string, status metav1.ConditionStatus, reason string, minGeneration ...int64) *metav1.Condition {
	t.Helper()
	client, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	var last *metav1.Condition
	ok := poll(60*time.Second, func() bool {
		u, err := client.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = readyCondition(u)
		if last == nil || (len(minGeneration) > 0 && last.ObservedGeneration < minGeneration[0]) {
			return false
		}
		return last.Status == status && last.Reason == reason
	})
	require.True(t, ok, "%s %s/%s: want Ready=%s reason %s, last condition %+v", gvr.Resource, ns, name, status, reason, last)
	return last
}

func readyCondition(u *unstructured.Unstructured) *metav1.Condition {
	raw, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var conds []metav1.Condition
	for _, r := range raw {
		m, _ := r.(map[string]any)
		var c metav1.Condition
		if err := fromUnstructured(m, &c); err == nil {
			conds = append(conds, c)
		}
	}
	return meta.FindStatusCondition(conds, v1alpha1.ConditionReady)
}

// poll calls f until it is true or the timeout passes. Tests wait for asynchronous outcomes
// with it; no test asserts how long anything took.
func poll(timeout time.Duration, f func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if f() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// git runs git on the mirror's bare repository on the server.
func (m *mirror) git(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"--git-dir", m.repoDir}, args...)...).CombinedOutput()
	require.NoError(t, err, "git %s: %s", strings.Join(args, " "), out)
	return strings.TrimRight(string(out), "\n")
}

// commits lists the commits of main, oldest first, as "<author>|<author email>|<committer>|<subject>".
func (m *mirror) commits(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "--git-dir", m.repoDir, "log", "--reverse", "--format=%an|%ae|%cn|%s", "main").CombinedOutput()
	if err != nil {
		return nil // no branch yet
	}
	s := strings.TrimRight(string(out), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// waitCommits waits until main holds n commits and returns them.
func (m *mirror) waitCommits(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	ok := poll(60*time.Second, func() bool { got = m.commits(t); return len(got) >= n })
	require.True(t, ok, "want %d commits on main, have %d: %q", n, len(got), got)
	return got
}

func objectFile(m *mirror, group, resource, name string) string {
	if group == "" {
		group = "core"
	}
	file := fmt.Sprintf("%s/%s/%s/%s.yaml", m.ns, group, resource, name)
	if m.path != "" {
		file = m.path + "/" + file
	}
	return file
}
