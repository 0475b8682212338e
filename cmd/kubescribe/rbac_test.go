package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	fakediscovery "k8s.io/client-go/discovery/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// rbacCatalog serves core, apps, rbac and a CRD group, example.com, with a namespaced and a
// cluster-scoped resource.
func rbacCatalog(t *testing.T) *watch.Catalog {
	t.Helper()
	lw := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	res := func(name string, namespaced bool, verbs ...string) metav1.APIResource {
		if len(verbs) == 0 {
			verbs = lw
		}
		return metav1.APIResource{Name: name, Namespaced: namespaced, Verbs: verbs}
	}
	fd := kubefake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
	fd.Resources = []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			res("configmaps", true), res("secrets", true), res("services", true), res("namespaces", false),
			res("bindings", true, "create"), res("pods/log", true, "get"),
		}},
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{res("deployments", true), res("deployments/scale", true)}},
		{GroupVersion: "rbac.authorization.k8s.io/v1", APIResources: []metav1.APIResource{res("clusterroles", false), res("roles", true)}},
		{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{res("widgets", true), res("gadgets", false)}},
	}
	c, err := watch.NewCatalog(context.Background(), fd)
	require.NoError(t, err)
	return c
}

func watchRule(ns, name, target string, rules ...v1alpha1.ResourceRule) v1alpha1.WatchRule {
	return v1alpha1.WatchRule{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: target}, Rules: rules}}
}

func clusterWatchRule(name, targetNS, target string, spec func(*v1alpha1.ClusterWatchRuleSpec), rules ...v1alpha1.ResourceRule) v1alpha1.ClusterWatchRule {
	r := v1alpha1.ClusterWatchRule{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ClusterWatchRuleSpec{TargetRef: v1alpha1.NamespacedObjectReference{Namespace: targetNS, Name: target}, Rules: rules}}
	if spec != nil {
		spec(&r.Spec)
	}
	return r
}

func rule(groups []string, resources ...string) v1alpha1.ResourceRule {
	return v1alpha1.ResourceRule{APIGroups: groups, Resources: resources}
}

func gitTarget(ns, name string, remote *v1alpha1.SourceCluster) v1alpha1.GitTarget {
	return v1alpha1.GitTarget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main", SourceCluster: remote}}
}

func gitProvider(ns, name, secret string) v1alpha1.GitProvider {
	p := v1alpha1.GitProvider{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.GitProviderSpec{URL: "https://git.example.com/r.git"}}
	if secret != "" {
		p.Spec.SecretRef = &v1alpha1.LocalObjectReference{Name: secret}
	}
	return p
}

func listWatch(group string, resources ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, Verbs: []string{"list", "watch"}}
}

func getSecrets(names ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: names, Verbs: []string{"get"}}
}

// decodedRBAC is the output of render, decoded: the rules of the ClusterRole ("") and of each
// namespace's Role, and the subjects and role of each binding.
type decodedRBAC struct {
	rules    map[string][]rbacv1.PolicyRule
	subjects map[string][]rbacv1.Subject
	refs     map[string]rbacv1.RoleRef
}

func decodeRBAC(t *testing.T, out []byte) decodedRBAC {
	t.Helper()
	d := decodedRBAC{rules: map[string][]rbacv1.PolicyRule{}, subjects: map[string][]rbacv1.Subject{}, refs: map[string]rbacv1.RoleRef{}}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var obj struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta   `json:"metadata"`
			Rules           []rbacv1.PolicyRule `json:"rules"`
			RoleRef         rbacv1.RoleRef      `json:"roleRef"`
			Subjects        []rbacv1.Subject    `json:"subjects"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return d
		}
		require.NoError(t, err, "output:\n%s", out)
		if obj.Kind == "" {
			continue
		}
		require.Equal(t, "rbac.authorization.k8s.io/v1", obj.APIVersion)
		require.Equal(t, "kubescribe-rules", obj.Metadata.Name)
		require.Equal(t, rbacManagedBy, obj.Metadata.Labels["app.kubernetes.io/managed-by"])
		ns := obj.Metadata.Namespace
		switch obj.Kind {
		case "ClusterRole", "ClusterRoleBinding":
			require.Empty(t, ns)
		case "Role", "RoleBinding":
			require.NotEmpty(t, ns)
		default:
			t.Fatalf("unexpected kind %q", obj.Kind)
		}
		switch obj.Kind {
		case "ClusterRole", "Role":
			_, dup := d.rules[ns]
			require.False(t, dup, "two roles for %q", ns)
			d.rules[ns] = obj.Rules
		default:
			d.subjects[ns], d.refs[ns] = obj.Subjects, obj.RoleRef
		}
	}
}

func TestPlanRBAC(t *testing.T) {
	core := []string{""}
	local := []v1alpha1.GitTarget{gitTarget("team-a", "target", nil), gitTarget("platform", "target", nil)}
	tests := []struct {
		name          string
		in            rbacInput
		sourceCluster string
		want          map[string][]rbacv1.PolicyRule
		warnings      []string // substrings, one per warning, in order
	}{
		{
			name: "a WatchRule on ConfigMaps and its GitProvider's Secret: one Role in its namespace",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("team-a", "configmaps", "target", rule(core, "configmaps"))},
				providers:  []v1alpha1.GitProvider{gitProvider("team-a", "repo", "git-credentials")},
				targets:    local,
			},
			want: map[string][]rbacv1.PolicyRule{"team-a": {listWatch("", "configmaps"), getSecrets("git-credentials")}},
		},
		{
			name: "a GitProvider that signs: its signing Secret is read too",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("team-a", "configmaps", "target", rule(core, "configmaps"))},
				providers: []v1alpha1.GitProvider{func() v1alpha1.GitProvider {
					p := gitProvider("team-a", "repo", "git-credentials")
					p.Spec.Signing = &v1alpha1.CommitSigning{SecretRef: v1alpha1.LocalObjectReference{Name: "signing-key"}}
					return p
				}()},
				targets: local,
			},
			want: map[string][]rbacv1.PolicyRule{"team-a": {listWatch("", "configmaps"), getSecrets("git-credentials", "signing-key")}},
		},
		{
			name: "a rule selecting Secrets grants no Secret",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{
					watchRule("team-a", "mixed", "target", rule(core, "secrets", "configmaps")),
					watchRule("team-a", "only-secrets", "target", rule(core, "secrets")),
				},
				targets: local,
			},
			want: map[string][]rbacv1.PolicyRule{"team-a": {listWatch("", "configmaps")}},
			warnings: []string{
				`WatchRule team-a/mixed rules[0] "secrets" in apiGroups [""]: Secrets are mirrored only for a GitTarget with spec.encryption.age`,
				`WatchRule team-a/only-secrets rules[0] "secrets" in apiGroups [""]: Secrets are mirrored only for a GitTarget with spec.encryption.age`,
			},
		},
		{
			name: "a rule of a GitTarget that encrypts Secrets grants list and watch on them",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("team-a", "mixed", "sealed", rule(core, "secrets", "configmaps"))},
				targets: []v1alpha1.GitTarget{func() v1alpha1.GitTarget {
					t := gitTarget("team-a", "sealed", nil)
					t.Spec.Encryption = &v1alpha1.Encryption{Age: []string{"age1example"}}
					return t
				}()},
			},
			want: map[string][]rbacv1.PolicyRule{"team-a": {listWatch("", "configmaps", "secrets")}},
		},
		{
			name: "a wildcard WatchRule: every listable namespaced resource of the group but Secrets",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("team-a", "core", "target", rule(core, "*"))},
				targets:    local,
			},
			want: map[string][]rbacv1.PolicyRule{"team-a": {listWatch("", "configmaps", "services")}},
		},
		{
			name: "a WatchRule naming a cluster-scoped resource grants nothing for it",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("team-a", "ns", "target", rule([]string{"rbac.authorization.k8s.io"}, "clusterroles", "roles"))},
				targets:    local,
			},
			want:     map[string][]rbacv1.PolicyRule{"team-a": {listWatch("rbac.authorization.k8s.io", "roles")}},
			warnings: []string{`"clusterroles" in apiGroups ["rbac.authorization.k8s.io"]: cluster-scoped`},
		},
		{
			name: "a ClusterWatchRule with a namespaceSelector: a ClusterRole, namespaced resources everywhere",
			in: rbacInput{
				clusterWatchRules: []v1alpha1.ClusterWatchRule{clusterWatchRule("web", "platform", "target", func(s *v1alpha1.ClusterWatchRuleSpec) {
					s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}}
				}, rule([]string{"rbac.authorization.k8s.io"}, "clusterroles"), rule([]string{"apps"}, "deployments"))},
				targets: local,
			},
			want: map[string][]rbacv1.PolicyRule{"": {listWatch("apps", "deployments"), listWatch("rbac.authorization.k8s.io", "clusterroles")}},
		},
		{
			name: "a ClusterWatchRule with namespaces: Roles there, cluster-scoped resources in the ClusterRole",
			in: rbacInput{
				clusterWatchRules: []v1alpha1.ClusterWatchRule{clusterWatchRule("listed", "platform", "target", func(s *v1alpha1.ClusterWatchRuleSpec) {
					s.Namespaces = []string{"b", "a"}
				}, rule([]string{"apps", "example.com"}, "*"))},
				targets: local,
			},
			want: map[string][]rbacv1.PolicyRule{
				"":  {listWatch("example.com", "gadgets")},
				"a": {listWatch("apps", "deployments"), listWatch("example.com", "widgets")},
				"b": {listWatch("apps", "deployments"), listWatch("example.com", "widgets")},
			},
		},
		{
			name: "CRD resources: served ones are granted, one not (yet) served is reported",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("team-a", "crds", "target",
					rule([]string{"example.com"}, "widgets"), rule([]string{"other.example.com"}, "things"))},
				targets: local,
			},
			want:     map[string][]rbacv1.PolicyRule{"team-a": {listWatch("example.com", "widgets")}},
			warnings: []string{`rules[1] "things" in apiGroups ["other.example.com"]: not served by the cluster (yet)`},
		},
		{
			name: "a Role repeats nothing the ClusterRole grants; rules of several namespaces merge per scope",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{
					watchRule("team-a", "cm", "target", rule(core, "configmaps", "services")),
					watchRule("team-a", "more", "target", rule([]string{"apps"}, "deployments")),
				},
				clusterWatchRules: []v1alpha1.ClusterWatchRule{clusterWatchRule("all-services", "platform", "target", nil, rule(core, "services"))},
				providers:         []v1alpha1.GitProvider{gitProvider("team-a", "repo", "creds"), gitProvider("team-a", "other", "creds"), gitProvider("team-b", "anonymous", "")},
				targets:           local,
			},
			want: map[string][]rbacv1.PolicyRule{
				"":       {listWatch("", "services")},
				"team-a": {listWatch("", "configmaps"), listWatch("apps", "deployments"), getSecrets("creds")},
			},
		},
		{
			name: "rules of a remote GitTarget are left out here; its kubeconfig Secret is granted",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("edge", "cm", "edge", rule(core, "configmaps"))},
				targets: []v1alpha1.GitTarget{gitTarget("edge", "edge", &v1alpha1.SourceCluster{
					KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: "edge-kubeconfig"}, AuditRoute: "edge"})},
			},
			want:     map[string][]rbacv1.PolicyRule{"edge": {getSecrets("edge-kubeconfig")}},
			warnings: []string{`WatchRule edge/cm: GitTarget edge/edge mirrors source cluster "edge"`},
		},
		{
			name: "--source-cluster: only that cluster's rules, no Secret",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{
					watchRule("edge", "cm", "edge", rule(core, "configmaps")),
					watchRule("team-a", "local", "target", rule(core, "services")),
				},
				providers: []v1alpha1.GitProvider{gitProvider("edge", "repo", "creds")},
				targets: append([]v1alpha1.GitTarget{gitTarget("edge", "edge", &v1alpha1.SourceCluster{
					KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: "edge-kubeconfig"}, AuditRoute: "edge"})}, local...),
			},
			sourceCluster: "edge",
			want:          map[string][]rbacv1.PolicyRule{"edge": {listWatch("", "configmaps")}},
		},
		{
			name: "a rule whose GitTarget is unknown is granted as local, with a warning",
			in: rbacInput{
				watchRules: []v1alpha1.WatchRule{watchRule("team-c", "cm", "missing", rule(core, "configmaps"))},
			},
			want:     map[string][]rbacv1.PolicyRule{"team-c": {listWatch("", "configmaps")}},
			warnings: []string{`WatchRule team-c/cm: GitTarget team-c/missing not found`},
		},
		{
			name: "an invalid ClusterWatchRule grants nothing",
			in: rbacInput{
				clusterWatchRules: []v1alpha1.ClusterWatchRule{clusterWatchRule("both", "platform", "target", func(s *v1alpha1.ClusterWatchRuleSpec) {
					s.Namespaces = []string{"a"}
					s.NamespaceSelector = &metav1.LabelSelector{}
				}, rule(core, "configmaps"))},
				targets: local,
			},
			want:     map[string][]rbacv1.PolicyRule{},
			warnings: []string{"ClusterWatchRule both: sets both namespaces and namespaceSelector"},
		},
	}
	catalog := rbacCatalog(t)
	sealed := map[string]bool{"a rule of a GitTarget that encrypts Secrets grants list and watch on them": true}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, warnings := planRBAC(catalog, &tt.in, tt.sourceCluster)
			require.Len(t, warnings, len(tt.warnings), "warnings: %q", warnings)
			for i, w := range tt.warnings {
				require.Contains(t, warnings[i], w)
			}
			subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kubescribe", Name: "kubescribe"}}
			out, err := plan.render("kubescribe-rules", subjects, "test")
			require.NoError(t, err)
			got := decodeRBAC(t, out)
			require.Equal(t, tt.want, got.rules, "output:\n%s", out)
			require.Equal(t, len(tt.want) == 0, plan.empty())
			for ns := range tt.want {
				require.Equal(t, subjects, got.subjects[ns], "binding of %q", ns)
				kind := "Role"
				if ns == "" {
					kind = "ClusterRole"
				}
				require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: "kubescribe-rules"}, got.refs[ns])
			}
			for _, rules := range got.rules {
				for _, r := range rules {
					for _, res := range r.Resources {
						if res == "secrets" && !sealed[tt.name] {
							require.Equal(t, []string{"get"}, r.Verbs, "Secrets are only granted get, but for a GitTarget that encrypts them")
							require.NotEmpty(t, r.ResourceNames, "Secrets are only granted by name, but for a GitTarget that encrypts them")
						}
					}
					require.NotContains(t, r.APIGroups, "*")
					require.NotContains(t, r.Resources, "*")
				}
			}
		})
	}
}

func TestRBACReadsManifests(t *testing.T) {
	var in rbacInput
	require.NoError(t, in.readPath("../../deploy/examples"))
	require.Len(t, in.watchRules, 1)
	require.Equal(t, "default", in.watchRules[0].Namespace)
	require.Len(t, in.clusterWatchRules, 1)
	require.Len(t, in.providers, 1)
	require.Len(t, in.targets, 2)

	plan, warnings := planRBAC(rbacCatalog(t), &in, "")
	require.Len(t, warnings, 0, "%q", warnings) // the remote target has no rule
	out, err := plan.render("kubescribe-rules", []rbacv1.Subject{{Kind: "User", APIGroup: rbacv1.GroupName, Name: "kubescribe"}}, "test")
	require.NoError(t, err)
	got := decodeRBAC(t, out)
	require.Equal(t, map[string][]rbacv1.PolicyRule{
		"":        {listWatch("apps", "deployments"), listWatch("rbac.authorization.k8s.io", "clusterroles")},
		"default": {listWatch("", "configmaps"), getSecrets("edge-kubeconfig", "example-git-credentials")},
	}, got.rules, "output:\n%s", out)

	// A List, a document without a kind and objects of other kinds are read or skipped.
	in = rbacInput{}
	require.NoError(t, in.readManifests("list", []byte(`apiVersion: v1
kind: List
items:
- apiVersion: kubescribe.dev/v1alpha1
  kind: WatchRule
  metadata: {name: a, namespace: x}
  spec: {targetRef: {name: t}, rules: [{apiGroups: [""], resources: [configmaps]}]}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: b}
---
---
apiVersion: other.example.com/v1
kind: WatchRule
metadata: {name: not-ours}
`)))
	require.Len(t, in.watchRules, 1)
	require.Equal(t, "x", in.watchRules[0].Namespace)

	err = in.readManifests("bad.yaml", []byte("apiVersion: kubescribe.dev/v1alpha1\nkind: WatchRule\nspec: {rules: 3}\n"))
	require.ErrorContains(t, err, `bad.yaml: document 1: WatchRule ""`)
	err = in.readManifests("broken.yaml", []byte("a: [\n"))
	require.ErrorContains(t, err, "broken.yaml: document 1")
}

func TestRBACFlags(t *testing.T) {
	o, err := parseRBACFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kubescribe", Name: "kubescribe"}}, o.subjects)
	require.Equal(t, "kubescribe-rules", o.name)

	o, err = parseRBACFlags([]string{"--source-cluster", "edge", "-f", "rules/"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kubescribe-source", Name: "kubescribe-source"}}, o.subjects)

	o, err = parseRBACFlags([]string{"--user", "kubescribe", "--group", "ops", "--service-account", "a/b", "--name", "mine"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []rbacv1.Subject{
		{Kind: "ServiceAccount", Namespace: "a", Name: "b"},
		{APIGroup: rbacv1.GroupName, Kind: "User", Name: "kubescribe"},
		{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "ops"},
	}, o.subjects)
	require.Equal(t, "mine", o.name)

	for _, tt := range []struct {
		args []string
		err  string
	}{
		{[]string{"--service-account", "kubescribe"}, `--service-account "kubescribe": want NAMESPACE/NAME`},
		{[]string{"--service-account", "a/b/c"}, `--service-account "a/b/c": want NAMESPACE/NAME`},
		{[]string{"--source-cluster", "edge"}, "--source-cluster needs -f"},
		{[]string{"--name", ""}, `--name "": want a Kubernetes object name`},
		{[]string{"--user", ""}, "--user: empty name"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := parseRBACFlags(tt.args, io.Discard)
		require.ErrorContains(t, err, tt.err, "%q", tt.args)
	}

	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, run([]string{"rbac", "--service-account", "x"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "kubescribe rbac: --service-account")
	stderr.Reset()
	require.Equal(t, 1, run([]string{"rbac", "-f", "does-not-exist.yaml"}, &stdout, &stderr))
	require.True(t, strings.HasPrefix(stderr.String(), "kubescribe rbac: -f: "), stderr.String())
	require.Empty(t, stdout.String())
}
