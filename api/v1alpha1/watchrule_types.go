package v1alpha1

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Operation is a kind of write a ResourceRule mirrors.
// +kubebuilder:validation:Enum=CREATE;UPDATE;DELETE;"*"
type Operation string

const (
	// OperationCreate mirrors the creation of an object.
	OperationCreate Operation = "CREATE"
	// OperationUpdate mirrors changes to an existing object (update, patch, apply).
	OperationUpdate Operation = "UPDATE"
	// OperationDelete mirrors the deletion of an object: its file is removed.
	OperationDelete Operation = "DELETE"
	// OperationAll mirrors every operation.
	OperationAll Operation = "*"
)

// AllOperations lists the operations OperationAll (or an empty operations list) stands for.
var AllOperations = []Operation{OperationCreate, OperationUpdate, OperationDelete}

// WatchRuleSpec describes which objects of the WatchRule's namespace are mirrored into a
// GitTarget.
type WatchRuleSpec struct {
	// TargetRef names the GitTarget, in the same namespace, that matching objects are written
	// to.
	// +required
	TargetRef LocalObjectReference `json:"targetRef"`

	// Rules select resources. An object is mirrored when any rule matches it. Only objects in the
	// WatchRule's own namespace are watched, so cluster-scoped resources never match.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Rules []ResourceRule `json:"rules"`
}

// ResourceRule selects resources by API group and resource name, and the operations on them that
// are mirrored.
type ResourceRule struct {
	// APIGroups the resources belong to: "" is the core group, "*" is every group.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$`
	APIGroups []string `json:"apiGroups"`

	// APIVersions restricts the versions a resource is watched in, for example ["v1"]: each
	// matching resource is watched in the most preferred of these versions that the cluster
	// serves it in. Empty means the group's preferred version (for a resource the preferred
	// version does not serve, the most preferred version that does). A resource served only in
	// other versions is reported in the ResourcesResolved condition with reason
	// VersionNotServed.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^v[0-9]+((alpha|beta)[0-9]+)?$`
	APIVersions []string `json:"apiVersions,omitempty"`

	// Resources are plural resource names, for example "configmaps" or "deployments"; "*" is every
	// resource of the groups. Subresources ("deployments/scale") are not allowed.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	Resources []string `json:"resources"`

	// Operations that are mirrored: any of CREATE, UPDATE, DELETE, or "*" for all three. Empty
	// means all three.
	// +optional
	// +kubebuilder:validation:MaxItems=4
	Operations []Operation `json:"operations,omitempty"`

	// ExcludeFieldManagers lists field managers whose writes are not mirrored: a create or
	// update whose newest managedFields entry (status writes aside) names one of them is not
	// committed. With several entries at the newest time (managedFields times have a
	// one-second resolution) the write is excluded only when every one of them is listed. A
	// delete is never excluded this way, nor the state found when a stream starts. Typical
	// use: a GitOps tool's own writes ("argocd-controller", "kustomize-controller").
	// +optional
	// +kubebuilder:validation:MaxItems=64
	ExcludeFieldManagers []string `json:"excludeFieldManagers,omitempty"`

	// ExcludeUsers lists users whose writes are not mirrored: a change attributed to one of
	// them (deletes included) is not committed. An unresolved change is never excluded. When
	// several rules select one resource, only what all of them exclude is excluded.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	ExcludeUsers []string `json:"excludeUsers,omitempty"`
}

// WatchRuleStatus is the observed state of a WatchRule.
type WatchRuleStatus struct {
	// ObservedGeneration is the metadata.generation of the WatchRule the status was computed
	// from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions describe the WatchRule's state. The Ready condition is True once its GitTarget
	// is Ready, every entry of its rules resolved to a resource and every resolved resource is
	// being watched. ResourcesResolved says what the rules resolved to, and which entries
	// resolved to nothing and why.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Resources are the resources the rules resolved to, as "group/version/resource" written by
	// FormatResource ("apps/v1/deployments"; the core group has no group part: "v1/configmaps"),
	// sorted.
	// +optional
	Resources []string `json:"resources,omitempty"`
}

// WatchRule selects resources in its namespace whose changes are mirrored into a GitTarget.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=kubescribe
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].reason"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Resolved",type="string",JSONPath=".status.conditions[?(@.type==\"ResourcesResolved\")].reason",priority=1
// +kubebuilder:printcolumn:name="Target",type="string",JSONPath=".spec.targetRef.name",priority=1
type WatchRule struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the WatchRule.
	// +required
	Spec WatchRuleSpec `json:"spec"`

	// Status is the observed state of the WatchRule.
	// +optional
	Status WatchRuleStatus `json:"status,omitempty"`
}

// WatchRuleList is a list of WatchRules.
//
// +kubebuilder:object:root=true
type WatchRuleList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the WatchRules.
	Items []WatchRule `json:"items"`
}

// GetOperations returns the operations the rule mirrors, in the order CREATE, UPDATE, DELETE:
// all three when operations is empty or contains "*".
func (r *ResourceRule) GetOperations() []Operation {
	if r == nil || len(r.Operations) == 0 || slices.Contains(r.Operations, OperationAll) {
		return slices.Clone(AllOperations)
	}
	ops := make([]Operation, 0, len(AllOperations))
	for _, op := range AllOperations {
		if slices.Contains(r.Operations, op) {
			ops = append(ops, op)
		}
	}
	return ops
}

// MatchesOperation reports whether the rule mirrors op.
func (r *ResourceRule) MatchesOperation(op Operation) bool {
	return slices.Contains(r.GetOperations(), op)
}

// HasExclusions reports whether the rule sets an exclude* field.
func (r *ResourceRule) HasExclusions() bool {
	return r != nil && (len(r.ExcludeFieldManagers) > 0 || len(r.ExcludeUsers) > 0)
}

// FormatResource writes gvr the way WatchRuleStatus.Resources lists it: "group/version/resource",
// or "version/resource" for the core group.
func FormatResource(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return gvr.Version + "/" + gvr.Resource
	}
	return gvr.Group + "/" + gvr.Version + "/" + gvr.Resource
}
