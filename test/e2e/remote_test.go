package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/test/controlplane"
	"github.com/kubescribe/kubescribe/test/stack"
)

// remoteRoute is the audit route the second apiserver posts its audit events to.
const remoteRoute = "remote"

// remoteRouteNamespaces binds the remote routes the tests' GitTargets name to the namespaces
// of those tests (--audit-route-namespaces), as a platform does: a route not bound is refused.
var remoteRouteNamespaces = map[string][]string{
	remoteRoute:         {"e2e-remote", "e2e-retarget-cluster"},
	"refused-exec":      {"e2e-remote-refused"},
	"refused-insecure":  {"e2e-remote-refused"},
	"refused-file":      {"e2e-remote-refused"},
	"refused-closed":    {"e2e-remote-refused"},
	"refused-bad-token": {"e2e-remote-refused"},
	"refused-anonymous": {"e2e-remote-refused"},
	"remote-rotate":     {"e2e-remote-rotate"},
	"remote-sel":        {"e2e-remote-sel"},
	"hostile":           {"e2e-pathescape"},
	"hostile-failing":   {"e2e-hostile-words"},
	"hostile-refusing":  {"e2e-hostile-words"},
	"hostile-proxied":   {"e2e-hostile-words"},
	"prod":              {"e2e-misconfig"},
}

// The second cluster, started by the first test that needs it and shared by the others;
// stopRemote (from TestMain) stops it.
var remote struct {
	once    sync.Once
	cluster *controlplane.Remote
	err     error
}

// remoteCluster starts (once) a second etcd and kube-apiserver auditing to /audit/remote,
// applies deploy/source-cluster-rbac.yaml there and binds its ClusterRole to the token users
// kubescribe and bob, the identities of the kubeconfigs the tests hand kubescribe.
func remoteCluster(t *testing.T) *controlplane.Remote {
	t.Helper()
	remote.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		r, err := env.StartRemote(ctx, remoteRoute)
		if err != nil {
			remote.err = err
			return
		}
		remote.cluster = r
		root, err := stack.RepoRoot()
		if err == nil {
			var b []byte
			if b, err = os.ReadFile(filepath.Join(root, "deploy", "source-cluster-rbac.yaml")); err == nil {
				err = stack.Apply(ctx, r.AdminConfig, b)
			}
		}
		if err != nil {
			remote.err = fmt.Errorf("installing deploy/source-cluster-rbac.yaml on the remote: %w", err)
			return
		}
		admin, err := kubernetes.NewForConfig(r.AdminConfig)
		if err != nil {
			remote.err = err
			return
		}
		_, remote.err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubescribe-source-test-users"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kubescribe-source"},
			Subjects: []rbacv1.Subject{
				{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "kubescribe"},
				{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "bob"},
			},
		}, metav1.CreateOptions{})
	})
	require.NoError(t, remote.err, "starting the remote cluster")
	return remote.cluster
}

// stopRemote stops the remote cluster if a test started it; on failure its logs are dumped.
func stopRemote(failed bool) error {
	if remote.cluster == nil {
		return nil
	}
	if failed {
		for _, p := range remote.cluster.LogPaths() {
			b, _ := os.ReadFile(p)
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			fmt.Fprintf(os.Stderr, "===== %s (last 40 lines) =====\n%s\n", p, strings.Join(lines, "\n"))
		}
	}
	return remote.cluster.Stop()
}

// remoteNamespace creates namespace ns on the remote where the given users may write
// ConfigMaps.
func remoteNamespace(t *testing.T, r *controlplane.Remote, ns string, users ...string) kubernetes.Interface {
	t.Helper()
	admin, err := kubernetes.NewForConfig(r.AdminConfig)
	require.NoError(t, err)
	_, err = admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bindRole(t, admin, ns, "writers", configMapWriters, users...)
	return admin
}

// remoteMirror creates, on the local cluster, namespace ns, a repository with its GitProvider
// "repo", and for each name in kubeconfigs the Secret "<name>" (key "value") and the GitTarget
// "<name>" mirroring the cluster of that kubeconfig under audit route routes[name] into
// folder <name>.
func remoteMirror(t *testing.T, ns string, kubeconfigs map[string][]byte, routes map[string]string) *mirror {
	t.Helper()
	ctx := context.Background()
	admin := clientFor(t, "admin")
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m := newRepoProvider(t, env, admin, ns, time.Second)
	for name, kc := range kubeconfigs {
		_, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string][]byte{"value": kc}}, metav1.CreateOptions{})
		require.NoError(t, err)
		create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main", Path: name,
				SourceCluster: &v1alpha1.SourceCluster{KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: name}, AuditRoute: routes[name]}},
		})
	}
	return m
}

// watchRuleFor creates WatchRule name in ns for target.
func watchRuleFor(t *testing.T, ns, name, target string, rules []v1alpha1.ResourceRule) {
	t.Helper()
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: target}, Rules: rules},
	})
}

// waitCondition waits until the object's condition of type typ has the status and reason.
func waitCondition(t *testing.T, ns, name, typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	client := dynamicFor(t, "admin")
	var last *metav1.Condition
	ok := poll(60*time.Second, func() bool {
		u, err := client.Resource(v1alpha1.GitTargetsResource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = findCondition(u, typ)
		return last != nil && last.Status == status && last.Reason == reason
	})
	require.True(t, ok, "GitTarget %s/%s: want %s=%s reason %s, last %+v", ns, name, typ, status, reason, last)
	return *last
}

func findCondition(u *unstructured.Unstructured, typ string) *metav1.Condition {
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

// editKubeconfig loads kc, applies edit to it and writes it back.
func editKubeconfig(t *testing.T, kc []byte, edit func(cluster map[string]any, user map[string]any)) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(kc)
	require.NoError(t, err)
	ctx := cfg.Contexts[cfg.CurrentContext]
	c, u := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	cm, um := map[string]any{}, map[string]any{}
	edit(cm, um)
	if v, ok := cm["server"].(string); ok {
		c.Server = v
	}
	if v, ok := cm["insecure"].(bool); ok {
		c.InsecureSkipTLSVerify, c.CertificateAuthorityData = v, nil
	}
	if v, ok := um["token"].(string); ok {
		u.Token = v
	}
	if v, ok := um["tokenFile"].(string); ok {
		u.Token, u.TokenFile = "", v
	}
	if _, ok := um["exec"]; ok {
		u.Token = ""
		u.Exec = &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/true", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
	}
	out, err := clientcmd.Write(*cfg)
	require.NoError(t, err)
	return out
}

// A GitTarget with spec.sourceCluster mirrors the remote cluster: its objects land, authored by
// the remote's real user through the remote's audit route, and an object of the same
// namespace and name on the cluster kubescribe runs in does not. Its rules resolve in the
// remote's catalog: kubescribe's own CRDs are served only locally.
func TestRemoteSourceClusterMirrors(t *testing.T) {
	ctx := context.Background()
	r := remoteCluster(t)
	const ns = "e2e-remote"
	remoteNamespace(t, r, ns, "alice")
	kc, err := r.Kubeconfig("kubescribe")
	require.NoError(t, err)
	m := remoteMirror(t, ns, map[string][]byte{"edge": kc}, map[string]string{"edge": remoteRoute})
	m.path = "edge"
	waitReady(t, v1alpha1.GitTargetsResource, ns, "edge", metav1.ConditionTrue, v1alpha1.ReasonReady)
	reach := waitCondition(t, ns, "edge", v1alpha1.ConditionSourceClusterReachable, metav1.ConditionTrue, v1alpha1.ReasonReachable)
	require.Contains(t, reach.Message, `cluster "remote"`)

	// The same namespace on the local cluster holds a ConfigMap of the same name, and another.
	localAdmin := clientFor(t, "admin")
	for name, origin := range map[string]string{"shared": "local", "local-only": "local"} {
		_, err := localAdmin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"origin": origin}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}

	watchRuleFor(t, ns, "configmaps", "edge", watchConfigMaps)
	cond := waitReady(t, v1alpha1.WatchRulesResource, ns, "configmaps", metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Contains(t, cond.Message, `in cluster "remote"`)
	watchRuleFor(t, ns, "local-types", "edge", []v1alpha1.ResourceRule{{APIGroups: []string{"kubescribe.dev"}, Resources: []string{"gitproviders"}}})
	cond = waitReady(t, v1alpha1.WatchRulesResource, ns, "local-types", metav1.ConditionFalse, v1alpha1.ReasonNoResourcesMatched)
	require.Contains(t, cond.Message, `cluster "remote" serves`)

	alice, err := kubernetes.NewForConfig(r.UserConfig("alice"))
	require.NoError(t, err)
	_, err = alice.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Data: map[string]string{"origin": "remote"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	got := m.waitCommits(t, 1)
	require.Equal(t, "alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-remote/shared", got[0],
		"the remote's change is authored by its real user, through its own audit route")
	require.Contains(t, m.git(t, "show", "main:"+objectFile(m, "", "configmaps", "shared")), "origin: remote")
	require.Equal(t, []string{objectFile(m, "", "configmaps", "shared")}, m.files(t), "nothing of the local cluster lands")
}

// Kubeconfigs that would run code, skip TLS verification or read files are refused with their
// own reasons; a remote that does not answer (Unreachable), rejects the credentials
// (Unauthorized) or refuses the identity discovery (Forbidden) fails only its own GitTarget,
// and a GitTarget of the local cluster keeps working.
func TestRemoteKubeconfigsRefused(t *testing.T) {
	r := remoteCluster(t)
	kc, err := r.Kubeconfig("kubescribe")
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "https://" + ln.Addr().String()
	require.NoError(t, ln.Close())

	kubeconfigs := map[string][]byte{
		"exec":      editKubeconfig(t, kc, func(_, u map[string]any) { u["exec"] = true }),
		"insecure":  editKubeconfig(t, kc, func(c, _ map[string]any) { c["insecure"] = true }),
		"file":      editKubeconfig(t, kc, func(_, u map[string]any) { u["tokenFile"] = "/var/run/secrets/token" }),
		"closed":    editKubeconfig(t, kc, func(c, _ map[string]any) { c["server"] = closed }),
		"bad-token": editKubeconfig(t, kc, func(_, u map[string]any) { u["token"] = "not-a-known-token" }),
		// No credentials: the apiserver takes the request as system:anonymous, who may not read
		// discovery.
		"anonymous": editKubeconfig(t, kc, func(_, u map[string]any) { u["token"] = "" }),
	}
	routes := map[string]string{}
	for name := range kubeconfigs {
		routes[name] = "refused-" + name
	}
	const ns = "e2e-remote-refused"
	remoteMirror(t, ns, kubeconfigs, routes)

	for name, reason := range map[string]string{
		"exec":     v1alpha1.ReasonKubeConfigExecPlugin,
		"insecure": v1alpha1.ReasonKubeConfigInsecure,
		"file":     v1alpha1.ReasonKubeConfigFileReference,
	} {
		cond := waitReady(t, v1alpha1.GitTargetsResource, ns, name, metav1.ConditionFalse, reason)
		require.Contains(t, cond.Message, fmt.Sprintf(`Secret %q key "value"`, name))
		require.NotContains(t, cond.Message, "token:")
	}
	waitReady(t, v1alpha1.GitTargetsResource, ns, "closed", metav1.ConditionFalse, v1alpha1.ReasonSourceClusterUnreachable)
	waitCondition(t, ns, "closed", v1alpha1.ConditionSourceClusterReachable, metav1.ConditionFalse, v1alpha1.ReasonUnreachable)
	waitReady(t, v1alpha1.GitTargetsResource, ns, "bad-token", metav1.ConditionFalse, v1alpha1.ReasonSourceClusterUnreachable)
	cond := waitCondition(t, ns, "bad-token", v1alpha1.ConditionSourceClusterReachable, metav1.ConditionFalse, v1alpha1.ReasonUnauthorized)
	require.NotContains(t, cond.Message, "not-a-known-token")
	waitReady(t, v1alpha1.GitTargetsResource, ns, "anonymous", metav1.ConditionFalse, v1alpha1.ReasonSourceClusterUnreachable)
	waitCondition(t, ns, "anonymous", v1alpha1.ConditionSourceClusterReachable, metav1.ConditionFalse, v1alpha1.ReasonForbidden)

	// The cluster kubescribe runs in is mirrored as before.
	m := newMirror(t, "e2e-remote-local", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	_, err = clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "still-mirrored"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	got := m.waitCommits(t, 1)
	require.Equal(t, "alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-remote-local/still-mirrored", got[0])
}

// Rotating the kubeconfig Secret's content rebuilds the remote's clients once and mirroring
// continues; deleting the Secret stops the mirror of that cluster and says why. The target
// names a route the remote does not post to, so its changes stay unresolved.
func TestRemoteSecretRotationAndDeletion(t *testing.T) {
	ctx := context.Background()
	r := remoteCluster(t)
	const ns, route = "e2e-remote-rotate", "remote-rotate"
	remoteNamespace(t, r, ns, "alice")
	kc, err := r.Kubeconfig("kubescribe")
	require.NoError(t, err)
	m := remoteMirror(t, ns, map[string][]byte{"edge": kc}, map[string]string{"edge": route})
	m.path = "edge"
	waitReady(t, v1alpha1.GitTargetsResource, ns, "edge", metav1.ConditionTrue, v1alpha1.ReasonReady)
	watchRuleFor(t, ns, "configmaps", "edge", watchConfigMaps)
	waitReady(t, v1alpha1.WatchRulesResource, ns, "configmaps", metav1.ConditionTrue, v1alpha1.ReasonReady)
	builds := fmt.Sprintf(`kubescribe_source_cluster_client_builds_total{cluster=%q}`, route)
	informers := fmt.Sprintf(`kubescribe_watch_informers{cluster=%q}`, route)
	require.Equal(t, 1.0, metricValue(t, builds))
	require.Equal(t, 1.0, metricValue(t, informers))

	alice, err := kubernetes.NewForConfig(r.UserConfig("alice"))
	require.NoError(t, err)
	createRemote := func(name string) {
		_, err := alice.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": name}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	createRemote("before")
	got := m.waitCommits(t, 1)
	// The remote posts its audit events to /audit/remote, not /audit/remote-rotate: a fact of
	// one route never explains a change of another, even of the very same object.
	require.Equal(t, attribution.UnresolvedUsername+"|unknown@users.kubescribe.invalid|kubescribe|create configmaps e2e-remote-rotate/before", got[0])

	// Rotate to bob's kubeconfig: the clients are rebuilt once, mirroring continues.
	bobKC, err := r.Kubeconfig("bob")
	require.NoError(t, err)
	secrets := clientFor(t, "admin").CoreV1().Secrets(ns)
	s, err := secrets.Get(ctx, "edge", metav1.GetOptions{})
	require.NoError(t, err)
	s.Data["value"] = bobKC
	s, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool { return metricValue(t, builds) == 2 }), "the rotated kubeconfig did not rebuild the clients")
	// A change of the Secret that leaves the kubeconfig as it is rebuilds nothing.
	s.Labels = map[string]string{"rotated": "yes"}
	_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	require.NoError(t, err)
	createRemote("after")
	m.waitCommits(t, 2)
	require.Contains(t, m.files(t), objectFile(m, "", "configmaps", "after"))
	waitReady(t, v1alpha1.GitTargetsResource, ns, "edge", metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Equal(t, 2.0, metricValue(t, builds), "the clients were rebuilt once")

	// Deleting the Secret stops the mirror of the cluster.
	require.NoError(t, secrets.Delete(ctx, "edge", metav1.DeleteOptions{}))
	cond := waitReady(t, v1alpha1.GitTargetsResource, ns, "edge", metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound)
	require.Contains(t, cond.Message, `Secret "edge"`)
	require.Contains(t, cond.Message, fmt.Sprintf("cluster %q", route))
	waitReady(t, v1alpha1.WatchRulesResource, ns, "configmaps", metav1.ConditionFalse, v1alpha1.ReasonTargetNotReady)
	require.True(t, poll(30*time.Second, func() bool { return metricValue(t, informers) == 0 }), "the cluster's informers did not stop")
}

// remoteNamespaceEventLogged reports whether kubescribe's log has the line of its watch of a
// remote's Namespaces seeing namespace ns change.
func remoteNamespaceEventLogged(t *testing.T, ns string) bool {
	t.Helper()
	b, err := os.ReadFile(env.LogPath)
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"msg":"a namespace of a remote source cluster changed`) && strings.Contains(line, `"namespace":"`+ns+`"`) {
			return true
		}
	}
	return false
}

// A ClusterWatchRule's namespaceSelector on a remote GitTarget follows the remote's namespaces
// as they are relabelled there: the rule's status drops a namespace whose label went and takes
// it back when the label returns, each within half the rule's one-minute recheck (kubescribe
// watches the remote's Namespaces), and a ConfigMap of the selected namespace is mirrored.
func TestRemoteNamespaceSelectorFollowsTheRemote(t *testing.T) {
	r := remoteCluster(t)
	const ns, watched, route, label = "e2e-remote-sel", "e2e-remote-sel-apps", "remote-sel", "e2e-remote-sel"
	admin := remoteNamespace(t, r, watched, "alice")
	relabel := func(value string) { relabelNamespace(t, admin, watched, label, value) }
	relabel("yes")
	kc, err := r.Kubeconfig("kubescribe")
	require.NoError(t, err)
	m := remoteMirror(t, ns, map[string][]byte{"edge": kc}, map[string]string{"edge": route})
	m.path = "edge"
	waitReady(t, v1alpha1.GitTargetsResource, ns, "edge", metav1.ConditionTrue, v1alpha1.ReasonReady)
	selected := selectingClusterRule(t, "remote-sel", ns, "edge", label)
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(selected(), []string{watched}) }), "namespaces: %v", selected())

	relabel("no")
	require.True(t, poll(30*time.Second, func() bool { return len(selected()) == 0 }), "namespaces: %v", selected())
	require.True(t, remoteNamespaceEventLogged(t, watched), "the remote's Namespace watch saw the relabel")
	relabel("yes")
	require.True(t, poll(30*time.Second, func() bool { return slices.Equal(selected(), []string{watched}) }), "namespaces: %v", selected())

	alice, err := kubernetes.NewForConfig(r.UserConfig("alice"))
	require.NoError(t, err)
	createConfigMaps(t, alice.CoreV1().ConfigMaps(watched), "app")
	want := "edge/" + watched + "/core/configmaps/app.yaml"
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(m.files(t), []string{want}) }), "files: %v", m.files(t))
}

// A namespace the platform did not bind to the route "remote" names it in a GitTarget, with a
// kubeconfig of a cluster of its own: refused (AuditRouteNotBound), the Secret never read,
// so the real cluster's audit facts can never join objects the squatter's server serves.
func TestRemoteRouteSquatRefused(t *testing.T) {
	const ns = "e2e-route-squat"
	squatter := []byte("apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n" +
		"clusters: [{name: c, cluster: {server: 'https://squatter.example:6443'}}]\nusers: [{name: u, user: {token: squatter-token}}]\n")
	remoteMirror(t, ns, map[string][]byte{"squat": squatter}, map[string]string{"squat": remoteRoute})
	cond := waitReady(t, v1alpha1.GitTargetsResource, ns, "squat", metav1.ConditionFalse, v1alpha1.ReasonAuditRouteNotBound)
	require.Contains(t, cond.Message, `audit route "remote" is not bound to namespace "e2e-route-squat"`)
	require.NotContains(t, cond.Message, "squatter-token")
}
