// Package v1alpha1 contains the kubescribe.dev/v1alpha1 API: GitProvider (a repository and its
// credentials), GitTarget (a branch and folder of that repository) and WatchRule (which resources
// of the WatchRule's namespace are mirrored into a GitTarget).
//
// Defaults are applied by getter methods (for example GitProviderSpec.GetCommitWindow), so code
// that reads these types must use the getters rather than the raw fields.
//
// +kubebuilder:object:generate=true
// +groupName=kubescribe.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every kubescribe resource.
const GroupName = "kubescribe.dev"

var (
	// SchemeGroupVersion is the group and version of this package's types.
	SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

	// GroupVersion is an alias of SchemeGroupVersion.
	GroupVersion = SchemeGroupVersion

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme

	// GitProvidersResource is the resource of GitProvider objects.
	GitProvidersResource = SchemeGroupVersion.WithResource("gitproviders")

	// GitTargetsResource is the resource of GitTarget objects.
	GitTargetsResource = SchemeGroupVersion.WithResource("gittargets")

	// WatchRulesResource is the resource of WatchRule objects.
	WatchRulesResource = SchemeGroupVersion.WithResource("watchrules")

	// ClusterWatchRulesResource is the resource of ClusterWatchRule objects.
	ClusterWatchRulesResource = SchemeGroupVersion.WithResource("clusterwatchrules")
)

// Kind returns the group-qualified kind of an unqualified kind of this package.
func Kind(kind string) schema.GroupKind {
	return SchemeGroupVersion.WithKind(kind).GroupKind()
}

// Resource returns the group-qualified resource of an unqualified resource of this package.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&GitProvider{}, &GitProviderList{},
		&GitTarget{}, &GitTargetList{},
		&WatchRule{}, &WatchRuleList{},
		&CommitRequest{}, &CommitRequestList{},
		&ClusterWatchRule{}, &ClusterWatchRuleList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
