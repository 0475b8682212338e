package v1alpha1_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// durationGetter is a getter of a GitProviderSpec duration and its set field.
type durationGetter struct {
	spec     func(*v1alpha1.GitProviderSpec) time.Duration
	provider func(*v1alpha1.GitProvider) time.Duration
	set      func(*v1alpha1.GitProviderSpec, *metav1.Duration)
}

// check runs the cases every duration getter shares: unset and negative give def, a set value
// and zero are kept, on the spec and on the provider, nil included.
func (g durationGetter) check(t *testing.T, def time.Duration) {
	with := func(d time.Duration) *v1alpha1.GitProviderSpec {
		s := &v1alpha1.GitProviderSpec{}
		g.set(s, &metav1.Duration{Duration: d})
		return s
	}
	for _, tt := range []struct {
		name string
		spec *v1alpha1.GitProviderSpec
		want time.Duration
	}{
		{name: "nil spec", spec: nil, want: def},
		{name: "unset", spec: &v1alpha1.GitProviderSpec{}, want: def},
		{name: "set", spec: with(42 * time.Second), want: 42 * time.Second},
		{name: "zero is kept", spec: with(0), want: 0},
		{name: "negative falls back", spec: with(-time.Second), want: def},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, g.spec(tt.spec))
			var p *v1alpha1.GitProvider
			if tt.spec != nil {
				p = &v1alpha1.GitProvider{Spec: *tt.spec}
			}
			require.Equal(t, tt.want, g.provider(p))
		})
	}
}

func TestGitProviderSpecGetCommitWindow(t *testing.T) {
	durationGetter{
		spec:     (*v1alpha1.GitProviderSpec).GetCommitWindow,
		provider: (*v1alpha1.GitProvider).GetCommitWindow,
		set:      func(s *v1alpha1.GitProviderSpec, d *metav1.Duration) { s.CommitWindow = d },
	}.check(t, 5*time.Second)
}

// A fetchInterval of 0 turns the branch checks off.
func TestGitProviderSpecGetFetchInterval(t *testing.T) {
	durationGetter{
		spec:     (*v1alpha1.GitProviderSpec).GetFetchInterval,
		provider: (*v1alpha1.GitProvider).GetFetchInterval,
		set:      func(s *v1alpha1.GitProviderSpec, d *metav1.Duration) { s.FetchInterval = d },
	}.check(t, time.Minute)
}

func TestGitProviderSpecGetCommitter(t *testing.T) {
	def := v1alpha1.Identity{Name: "kubescribe", Email: "kubescribe@kubescribe.invalid"}
	tests := []struct {
		name string
		spec *v1alpha1.GitProviderSpec
		want v1alpha1.Identity
	}{
		{name: "nil spec", spec: nil, want: def},
		{name: "unset", spec: &v1alpha1.GitProviderSpec{}, want: def},
		{
			name: "set",
			spec: &v1alpha1.GitProviderSpec{Committer: &v1alpha1.Identity{Name: "Bot", Email: "bot@example.com"}},
			want: v1alpha1.Identity{Name: "Bot", Email: "bot@example.com"},
		},
		{
			name: "empty email defaulted",
			spec: &v1alpha1.GitProviderSpec{Committer: &v1alpha1.Identity{Name: "Bot"}},
			want: v1alpha1.Identity{Name: "Bot", Email: "kubescribe@kubescribe.invalid"},
		},
		{
			name: "empty name defaulted",
			spec: &v1alpha1.GitProviderSpec{Committer: &v1alpha1.Identity{Email: "bot@example.com"}},
			want: v1alpha1.Identity{Name: "kubescribe", Email: "bot@example.com"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.spec.GetCommitter())
			var p *v1alpha1.GitProvider
			if tt.spec != nil {
				p = &v1alpha1.GitProvider{Spec: *tt.spec}
			}
			require.Equal(t, tt.want, p.GetCommitter())
		})
	}
}

func TestGitProviderSpecGetCommitterDoesNotAlias(t *testing.T) {
	spec := &v1alpha1.GitProviderSpec{Committer: &v1alpha1.Identity{Name: "Bot", Email: "bot@example.com"}}
	id := spec.GetCommitter()
	id.Name = "changed"
	require.Equal(t, "Bot", spec.Committer.Name)
}

func TestGitProviderSpecGetAuthorEmailDomain(t *testing.T) {
	tests := []struct {
		name string
		spec *v1alpha1.GitProviderSpec
		want string
	}{
		{name: "nil spec", spec: nil, want: "users.kubescribe.invalid"},
		{name: "unset", spec: &v1alpha1.GitProviderSpec{}, want: "users.kubescribe.invalid"},
		{name: "set", spec: &v1alpha1.GitProviderSpec{AuthorEmailDomain: "corp.example"}, want: "corp.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.spec.GetAuthorEmailDomain())
			var p *v1alpha1.GitProvider
			if tt.spec != nil {
				p = &v1alpha1.GitProvider{Spec: *tt.spec}
			}
			require.Equal(t, tt.want, p.GetAuthorEmailDomain())
		})
	}
}

func TestSourceClusterKubeConfigKeys(t *testing.T) {
	tests := []struct {
		name string
		sc   *v1alpha1.SourceCluster
		want []string
	}{
		{name: "nil", sc: nil, want: []string{"value", "value.yaml"}},
		{name: "key unset", sc: &v1alpha1.SourceCluster{KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: "remote"}}, want: []string{"value", "value.yaml"}},
		{name: "key set", sc: &v1alpha1.SourceCluster{KubeConfigSecretRef: v1alpha1.SecretKeyReference{Name: "remote", Key: "config"}}, want: []string{"config"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.sc.KubeConfigKeys())
		})
	}
}

func TestGitTargetSpecDestination(t *testing.T) {
	tests := []struct {
		name string
		spec v1alpha1.GitTargetSpec
		want v1alpha1.Destination
	}{
		{name: "root", spec: v1alpha1.GitTargetSpec{Branch: "main"}, want: v1alpha1.Destination{Branch: "main"}},
		{name: "path", spec: v1alpha1.GitTargetSpec{Branch: "main", Path: "clusters/prod"}, want: v1alpha1.Destination{Branch: "main", Path: "clusters/prod"}},
		{
			name: "source cluster",
			spec: v1alpha1.GitTargetSpec{Branch: "b", SourceCluster: &v1alpha1.SourceCluster{AuditRoute: "edge-1"}},
			want: v1alpha1.Destination{Branch: "b", SourceCluster: "edge-1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.spec.Destination())
		})
	}
}

func TestResourceRuleGetOperations(t *testing.T) {
	all := []v1alpha1.Operation{v1alpha1.OperationCreate, v1alpha1.OperationUpdate, v1alpha1.OperationDelete}
	tests := []struct {
		name string
		ops  []v1alpha1.Operation
		want []v1alpha1.Operation
	}{
		{name: "empty means all", ops: nil, want: all},
		{name: "star means all", ops: []v1alpha1.Operation{v1alpha1.OperationAll}, want: all},
		{name: "star among others", ops: []v1alpha1.Operation{v1alpha1.OperationDelete, v1alpha1.OperationAll}, want: all},
		{name: "subset in canonical order", ops: []v1alpha1.Operation{v1alpha1.OperationDelete, v1alpha1.OperationCreate}, want: []v1alpha1.Operation{v1alpha1.OperationCreate, v1alpha1.OperationDelete}},
		{name: "duplicates collapse", ops: []v1alpha1.Operation{v1alpha1.OperationUpdate, v1alpha1.OperationUpdate}, want: []v1alpha1.Operation{v1alpha1.OperationUpdate}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &v1alpha1.ResourceRule{Operations: tt.ops}
			got := r.GetOperations()
			require.Equal(t, tt.want, got)
			for _, op := range all {
				require.Equal(t, slices.Contains(tt.want, op), r.MatchesOperation(op), "operation %s", op)
			}
		})
	}
}

func TestGetOperationsReturnsFreshSlice(t *testing.T) {
	r := &v1alpha1.ResourceRule{}
	ops := r.GetOperations()
	ops[0] = "mutated"
	require.Equal(t, v1alpha1.OperationCreate, r.GetOperations()[0])
	require.Equal(t, v1alpha1.OperationCreate, v1alpha1.AllOperations[0])
}

func TestResourceRuleHasExclusions(t *testing.T) {
	require.False(t, (*v1alpha1.ResourceRule)(nil).HasExclusions())
	require.False(t, (&v1alpha1.ResourceRule{}).HasExclusions())
	require.True(t, (&v1alpha1.ResourceRule{ExcludeUsers: []string{"alice"}}).HasExclusions())
	require.True(t, (&v1alpha1.ResourceRule{ExcludeFieldManagers: []string{"argocd"}}).HasExclusions())
}

func TestFormatResource(t *testing.T) {
	tests := []struct {
		gvr  schema.GroupVersionResource
		want string
	}{
		{gvr: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, want: "v1/configmaps"},
		{gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, want: "apps/v1/deployments"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			require.Equal(t, tt.want, v1alpha1.FormatResource(tt.gvr))
		})
	}
}
