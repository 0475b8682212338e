package v1alpha1_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// crdDir holds the CRDs generated from this package by `make generate`.
const crdDir = "../../deploy/crds"

func loadCRD(t *testing.T, plural string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(crdDir, "kubescribe.dev_"+plural+".yaml"))
	require.NoError(t, err, "run `make generate`")
	var crd apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.UnmarshalStrict(b, &crd))
	return &crd
}

// schemaAt walks properties (and array items for "[]") from the version's root schema.
func schemaAt(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition, path ...string) apiextensionsv1.JSONSchemaProps {
	t.Helper()
	s := *crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, p := range path {
		if p == "[]" {
			require.NotNil(t, s.Items, "no items at %v", path)
			s = *s.Items.Schema
			continue
		}
		next, ok := s.Properties[p]
		require.True(t, ok, "no property %q in %v", p, path)
		s = next
	}
	return s
}

func TestCRDsShape(t *testing.T) {
	for _, tc := range []struct {
		plural, kind string
		scope        apiextensionsv1.ResourceScope
	}{
		{"gitproviders", "GitProvider", apiextensionsv1.NamespaceScoped},
		{"gittargets", "GitTarget", apiextensionsv1.NamespaceScoped},
		{"watchrules", "WatchRule", apiextensionsv1.NamespaceScoped},
		{"clusterwatchrules", "ClusterWatchRule", apiextensionsv1.ClusterScoped},
		{"commitrequests", "CommitRequest", apiextensionsv1.NamespaceScoped},
	} {
		t.Run(tc.plural, func(t *testing.T) {
			crd := loadCRD(t, tc.plural)
			require.Equal(t, tc.plural+".kubescribe.dev", crd.Name)
			require.Equal(t, "kubescribe.dev", crd.Spec.Group)
			require.Equal(t, tc.kind, crd.Spec.Names.Kind)
			require.Equal(t, tc.scope, crd.Spec.Scope)
			require.Len(t, crd.Spec.Versions, 1)
			v := crd.Spec.Versions[0]
			require.Equal(t, "v1alpha1", v.Name)
			require.True(t, v.Served)
			require.True(t, v.Storage)
			require.NotNil(t, v.Subresources)
			require.NotNil(t, v.Subresources.Status)

			require.GreaterOrEqual(t, len(v.AdditionalPrinterColumns), 3)
			cols := v.AdditionalPrinterColumns[:3]
			require.Equal(t, "Ready", cols[0].Name)
			require.Equal(t, `.status.conditions[?(@.type=="Ready")].status`, cols[0].JSONPath)
			require.Equal(t, "Reason", cols[1].Name)
			require.Equal(t, `.status.conditions[?(@.type=="Ready")].reason`, cols[1].JSONPath)
			require.Equal(t, "Age", cols[2].Name)
			require.Equal(t, "date", cols[2].Type)
			for _, c := range v.AdditionalPrinterColumns[3:] {
				require.NotZero(t, c.Priority, "extra column %q must be wide-only", c.Name)
			}

			conds := schemaAt(t, crd, "status", "conditions")
			require.Equal(t, "map", *conds.XListType)
			require.Equal(t, []string{"type"}, conds.XListMapKeys)
			require.Equal(t, "integer", schemaAt(t, crd, "status", "observedGeneration").Type)
		})
	}
}

func TestCRDPatterns(t *testing.T) {
	providers := loadCRD(t, "gitproviders")
	targets := loadCRD(t, "gittargets")
	rules := loadCRD(t, "watchrules")

	tests := []struct {
		name   string
		schema apiextensionsv1.JSONSchemaProps
		valid  []string
		bad    []string
	}{
		{
			name:   "GitProvider url",
			schema: schemaAt(t, providers, "spec", "url"),
			valid: []string{
				"https://git.example.com/org/repo.git", "http://127.0.0.1:8080/repo.git",
				"ssh://git@git.example.com:2222/org/repo.git", "git@github.com:org/repo.git",
				"git@[::1]:repo.git",
			},
			bad: []string{"", "ftp://host/repo", "file:///tmp/repo", "/tmp/repo", "https://host/with space", "github.com:org/repo", "git@host"},
		},
		{
			name:   "GitProvider commitWindow",
			schema: schemaAt(t, providers, "spec", "commitWindow"),
			valid:  []string{"5s", "0s", "1m30s", "1.5h", "250ms"},
			bad:    []string{"", "5", "-5s", "5 s", "1d"},
		},
		{
			name:   "GitProvider fetchInterval",
			schema: schemaAt(t, providers, "spec", "fetchInterval"),
			valid:  []string{"1m", "0s", "30s", "1h30m"},
			bad:    []string{"", "60", "-1m", "1 m", "1d"},
		},
		{
			name:   "GitProvider authorEmailDomain",
			schema: schemaAt(t, providers, "spec", "authorEmailDomain"),
			valid:  []string{"example.com", "users.kubescribe.invalid", "localhost"},
			bad:    []string{"", ".example.com", "example.com.", "exa mple.com", "user@example.com", "-a.com"},
		},
		{
			name:   "GitProvider committer email",
			schema: schemaAt(t, providers, "spec", "committer", "email"),
			valid:  []string{"kubescribe@kubescribe.invalid", "a.b+c@example.com"},
			bad:    []string{"no-at", "a@b@c", "<a@b>", "a @b"},
		},
		{
			name:   "GitProvider committer name",
			schema: schemaAt(t, providers, "spec", "committer", "name"),
			valid:  []string{"kubescribe", "Jane Q. Doe"},
			bad:    []string{"", "a <b>", "line\nbreak"},
		},
		{
			name:   "GitTarget branch",
			schema: schemaAt(t, targets, "spec", "branch"),
			valid:  []string{"main", "release/1.0", "feature/x-y_z", "v1.2"},
			bad:    []string{"", "-main", "/main", "has space", "a:b", "a~1", "a^", "a?", "a*", "a[b", `a\b`, "tab\tbranch"},
		},
		{
			name:   "GitTarget path",
			schema: schemaAt(t, targets, "spec", "path"),
			valid:  []string{"", "clusters/prod", "a", "with space/ok"},
			bad:    []string{`a\b`, "nul\x00", "new\nline"},
		},
		{
			name:   "GitTarget auditRoute",
			schema: schemaAt(t, targets, "spec", "sourceCluster", "auditRoute"),
			valid:  []string{"edge", "edge-1", "a"},
			bad:    []string{"", "Edge", "-edge", "edge-", "edge_1", "edge.1"},
		},
		{
			name:   "LocalObjectReference name",
			schema: schemaAt(t, targets, "spec", "providerRef", "name"),
			valid:  []string{"p", "my-provider", "a.b"},
			bad:    []string{"", "My", "-a", "a-"},
		},
		{
			name:   "WatchRule apiGroups item",
			schema: schemaAt(t, rules, "spec", "rules", "[]", "apiGroups", "[]"),
			valid:  []string{"", "*", "apps", "networking.k8s.io"},
			bad:    []string{"Apps", "apps/v1", "*.k8s.io"},
		},
		{
			name:   "WatchRule resources item",
			schema: schemaAt(t, rules, "spec", "rules", "[]", "resources", "[]"),
			valid:  []string{"*", "configmaps", "horizontalpodautoscalers"},
			bad:    []string{"", "deployments/scale", "ConfigMaps", "*/scale"},
		},
		{
			name:   "WatchRule apiVersions item",
			schema: schemaAt(t, rules, "spec", "rules", "[]", "apiVersions", "[]"),
			valid:  []string{"v1", "v1beta1", "v2alpha3"},
			bad:    []string{"", "*", "apps/v1", "V1", "v1gamma1", "1"},
		},
		{
			name:   "ClusterWatchRule apiVersions item",
			schema: schemaAt(t, loadCRD(t, "clusterwatchrules"), "spec", "rules", "[]", "apiVersions", "[]"),
			valid:  []string{"v1"},
			bad:    []string{"v1/"},
		},
		{
			name:   "ClusterWatchRule targetRef namespace",
			schema: schemaAt(t, loadCRD(t, "clusterwatchrules"), "spec", "targetRef", "namespace"),
			valid:  []string{"team-a", "a"},
			bad:    []string{"", "a.b", "Team", "-a"},
		},
		{
			name:   "ClusterWatchRule namespaces item",
			schema: schemaAt(t, loadCRD(t, "clusterwatchrules"), "spec", "namespaces", "[]"),
			valid:  []string{"default", "kube-system"},
			bad:    []string{"", "a.b", "*"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NotEmpty(t, tt.schema.Pattern)
			re, err := regexp.Compile(tt.schema.Pattern)
			require.NoError(t, err)
			for _, v := range tt.valid {
				require.True(t, matches(re, tt.schema, v), "want %q accepted by %s", v, tt.schema.Pattern)
			}
			for _, v := range tt.bad {
				require.False(t, matches(re, tt.schema, v), "want %q rejected by %s", v, tt.schema.Pattern)
			}
		})
	}
}

// matches applies the length limits and pattern of s the way the API server does.
func matches(re *regexp.Regexp, s apiextensionsv1.JSONSchemaProps, v string) bool {
	if s.MinLength != nil && int64(len(v)) < *s.MinLength {
		return false
	}
	if s.MaxLength != nil && int64(len(v)) > *s.MaxLength {
		return false
	}
	return re.MatchString(v)
}

// A ClusterWatchRule sets at most one of namespaces and namespaceSelector.
func TestCRDClusterWatchRuleNamespaceScope(t *testing.T) {
	spec := schemaAt(t, loadCRD(t, "clusterwatchrules"), "spec")
	require.Len(t, spec.XValidations, 1)
	require.Equal(t, "!has(self.namespaces) || !has(self.namespaceSelector)", spec.XValidations[0].Rule)
	require.Contains(t, spec.Required, "targetRef")
	require.ElementsMatch(t, []string{"namespace", "name"}, schemaAt(t, loadCRD(t, "clusterwatchrules"), "spec", "targetRef").Required)
}

func TestCRDImmutableProviderRef(t *testing.T) {
	ref := schemaAt(t, loadCRD(t, "gittargets"), "spec", "providerRef")
	require.Len(t, ref.XValidations, 1)
	require.Equal(t, "self == oldSelf", ref.XValidations[0].Rule)
	require.Contains(t, ref.XValidations[0].Message, "providerRef is immutable")
	require.Contains(t, ref.XValidations[0].Message, "create a new GitTarget", "the message points at the supported move")
	for _, field := range []string{"branch", "path", "sourceCluster"} {
		for _, v := range schemaAt(t, loadCRD(t, "gittargets"), "spec", field).XValidations {
			require.NotContains(t, v.Rule, "oldSelf", "spec.%s is mutable: changing it retargets the GitTarget", field)
		}
	}
	status := schemaAt(t, loadCRD(t, "gittargets"), "status")
	require.Contains(t, status.Properties, "retargetingTo")
}

func TestCRDOperationEnum(t *testing.T) {
	op := schemaAt(t, loadCRD(t, "watchrules"), "spec", "rules", "[]", "operations", "[]")
	var got []string
	for _, e := range op.Enum {
		var s string
		require.NoError(t, yaml.Unmarshal(e.Raw, &s))
		got = append(got, s)
	}
	require.Equal(t, []string{"CREATE", "UPDATE", "DELETE", "*"}, got)
}
