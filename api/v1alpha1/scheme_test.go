package v1alpha1_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

func TestAddToScheme(t *testing.T) {
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))

	for _, obj := range []runtime.Object{
		&v1alpha1.GitProvider{}, &v1alpha1.GitProviderList{},
		&v1alpha1.GitTarget{}, &v1alpha1.GitTargetList{},
		&v1alpha1.WatchRule{}, &v1alpha1.WatchRuleList{},
		&v1alpha1.ClusterWatchRule{}, &v1alpha1.ClusterWatchRuleList{},
	} {
		gvks, _, err := scheme.ObjectKinds(obj)
		require.NoError(t, err)
		require.Len(t, gvks, 1)
		require.Equal(t, "kubescribe.dev", gvks[0].Group)
		require.Equal(t, "v1alpha1", gvks[0].Version)
	}

	require.Equal(t, "kubescribe.dev", v1alpha1.GitProvidersResource.Group)
	require.Equal(t, "v1alpha1", v1alpha1.GitTargetsResource.Version)
	require.Equal(t, "watchrules", v1alpha1.WatchRulesResource.Resource)
	require.Equal(t, "clusterwatchrules", v1alpha1.ClusterWatchRulesResource.Resource)
	require.Equal(t, v1alpha1.SchemeGroupVersion, v1alpha1.GroupVersion)
	require.Equal(t, "gitproviders.kubescribe.dev", v1alpha1.Resource("gitproviders").String())
	require.Equal(t, "GitTarget.kubescribe.dev", v1alpha1.Kind("GitTarget").String())
}

func TestDeepCopyIsIndependent(t *testing.T) {
	now := metav1.NewTime(time.Unix(1700000000, 0))
	in := &v1alpha1.GitTarget{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns"},
		Spec: v1alpha1.GitTargetSpec{
			ProviderRef:   v1alpha1.LocalObjectReference{Name: "p"},
			Branch:        "main",
			SourceCluster: &v1alpha1.SourceCluster{AuditRoute: "edge"},
		},
		Status: v1alpha1.GitTargetStatus{
			Conditions:          []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady}},
			ObservedDestination: &v1alpha1.Destination{Branch: "main"},
			LastPushTime:        &now,
		},
	}
	out := in.DeepCopy()
	require.Equal(t, in, out)
	out.Spec.SourceCluster.AuditRoute = "other"
	out.Status.Conditions[0].Reason = v1alpha1.ReasonPushFailed
	out.Status.ObservedDestination.Path = "x"
	require.Equal(t, "edge", in.Spec.SourceCluster.AuditRoute)
	require.Equal(t, v1alpha1.ReasonReady, in.Status.Conditions[0].Reason)
	require.Empty(t, in.Status.ObservedDestination.Path)

	rule := &v1alpha1.WatchRule{Spec: v1alpha1.WatchRuleSpec{Rules: []v1alpha1.ResourceRule{{Resources: []string{"configmaps"}}}}}
	ruleCopy := rule.DeepCopyObject().(*v1alpha1.WatchRule)
	ruleCopy.Spec.Rules[0].Resources[0] = "secrets"
	require.Equal(t, "configmaps", rule.Spec.Rules[0].Resources[0])
}

func TestDestinationJSONKeepsEmptyPath(t *testing.T) {
	b, err := json.Marshal(v1alpha1.Destination{Branch: "main"})
	require.NoError(t, err)
	require.JSONEq(t, `{"branch":"main","path":""}`, string(b))
}
