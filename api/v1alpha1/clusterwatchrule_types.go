package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NamespacedObjectReference names an object by namespace and name.
type NamespacedObjectReference struct {
	// Namespace of the referenced object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// Name of the referenced object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// ClusterWatchRuleSpec describes which objects of the whole cluster are mirrored into a
// GitTarget.
//
// +kubebuilder:validation:XValidation:rule="!has(self.namespaces) || !has(self.namespaceSelector)",message="set at most one of namespaces and namespaceSelector"
type ClusterWatchRuleSpec struct {
	// TargetRef names the GitTarget, by namespace and name, that matching objects are written
	// to. Creating a ClusterWatchRule is a cluster-wide privilege: it may write into any
	// GitTarget's folder.
	// +required
	TargetRef NamespacedObjectReference `json:"targetRef"`

	// Namespaces limits namespaced resources to these namespaces. At most one of namespaces and
	// namespaceSelector is set; with neither, namespaced resources are mirrored in every
	// namespace. Cluster-scoped resources are mirrored either way.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelector limits namespaced resources to the namespaces whose labels it matches,
	// followed as namespaces are created, relabelled and deleted. An empty selector ({})
	// matches every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// Rules select resources, cluster-scoped and namespaced alike. An object is mirrored when
	// any rule matches it.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Rules []ResourceRule `json:"rules"`
}

// ClusterWatchRuleStatus is the observed state of a ClusterWatchRule.
type ClusterWatchRuleStatus struct {
	// ObservedGeneration is the metadata.generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions describe the ClusterWatchRule's state: Ready and ResourcesResolved, as on a
	// WatchRule.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Resources are the resources the rules resolved to, written by FormatResource, sorted.
	// +optional
	Resources []string `json:"resources,omitempty"`

	// Namespaces are the namespaces namespaced resources are watched in when namespaces or
	// namespaceSelector is set, sorted; empty when every namespace is watched.
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
}

// ClusterWatchRule selects cluster-scoped resources, and namespaced ones across all or selected
// namespaces, whose changes are mirrored into a GitTarget.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=kubescribe
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].reason"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Resolved",type="string",JSONPath=".status.conditions[?(@.type==\"ResourcesResolved\")].reason",priority=1
// +kubebuilder:printcolumn:name="Target Namespace",type="string",JSONPath=".spec.targetRef.namespace",priority=1
// +kubebuilder:printcolumn:name="Target",type="string",JSONPath=".spec.targetRef.name",priority=1
type ClusterWatchRule struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the ClusterWatchRule.
	// +required
	Spec ClusterWatchRuleSpec `json:"spec"`

	// Status is the observed state of the ClusterWatchRule.
	// +optional
	Status ClusterWatchRuleStatus `json:"status,omitempty"`
}

// ClusterWatchRuleList is a list of ClusterWatchRules.
//
// +kubebuilder:object:root=true
type ClusterWatchRuleList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the ClusterWatchRules.
	Items []ClusterWatchRule `json:"items"`
}
