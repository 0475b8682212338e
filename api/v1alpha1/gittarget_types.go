package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultKubeConfigKeys are the Secret keys read, in this order, for a source cluster's
// kubeconfig when spec.sourceCluster.kubeConfigSecretRef.key is empty: the first one present is
// used. "value" is the key Cluster API writes its <cluster>-kubeconfig Secrets with.
var DefaultKubeConfigKeys = []string{"value", "value.yaml"}

// GitTargetSpec describes where in a GitProvider's repository objects are written.
type GitTargetSpec struct {
	// ProviderRef names the GitProvider, in the same namespace, whose repository this target
	// writes to. Immutable: to move a target to another repository, create a new GitTarget (its
	// branch, path and sourceCluster can be changed in place, which retargets it).
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="providerRef is immutable: to write to another GitProvider's repository, create a new GitTarget (branch, path and sourceCluster can be changed in place)"
	ProviderRef LocalObjectReference `json:"providerRef"`

	// Branch of the repository that commits are pushed to, without the "refs/heads/" prefix. It
	// must be a valid Git branch name: no whitespace, control characters or any of ~^:?*[\, no
	// "..", "//" or "@{", not starting with '-' or '/', not ending with '/', '.' or ".lock".
	// Changing it retargets the GitTarget.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[^\x00-\x20\x7f~^:?*\[\\/-][^\x00-\x20\x7f~^:?*\[\\]*$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('..')",message="branch must not contain '..'"
	// +kubebuilder:validation:XValidation:rule="!self.contains('//') && !self.contains('@{') && self != '@'",message="branch must not contain '//' or '@{' and must not be '@'"
	// +kubebuilder:validation:XValidation:rule="!self.endsWith('/') && !self.endsWith('.') && !self.endsWith('.lock')",message="branch must not end with '/', '.' or '.lock'"
	Branch string `json:"branch"`

	// Path is the folder inside the repository that objects are written under, with '/' as
	// separator, for example "clusters/prod". Empty means the repository root. It must be
	// relative (no leading '/') and contain no empty, "." or ".." segments (so no trailing '/').
	// Changing it retargets the GitTarget; the old folder is left in place.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^[^\x00-\x1f\x7f\\]*$`
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/')",message="path must be relative: no leading '/'"
	// +kubebuilder:validation:XValidation:rule="self == '' || self.startsWith('/') || self.split('/').all(s, s != '' && s != '.' && s != '..')",message="path must not contain empty, '.' or '..' segments"
	Path string `json:"path,omitempty"`

	// SourceCluster makes the target mirror a remote cluster, reached with a kubeconfig from a
	// Secret, instead of the cluster kubescribe runs in. The WatchRules and ClusterWatchRules of
	// the target resolve against that cluster's API discovery and watch it; their authors come
	// from the audit events its apiserver posts to /audit/<auditRoute>. A kubeconfig with an
	// exec or auth-provider plugin, insecure-skip-tls-verify (or a plain http:// server) or a
	// reference to a file is refused; the condition SourceClusterReachable says whether the
	// cluster answers.
	// +optional
	SourceCluster *SourceCluster `json:"sourceCluster,omitempty"`

	// Encryption, when set, has the target's Secrets mirrored as SOPS documents encrypted for
	// its age recipients: the rules that select Secrets then mirror them. Without it Secrets
	// are never mirrored.
	// +optional
	Encryption *Encryption `json:"encryption,omitempty"`
}

// SourceCluster identifies a remote cluster whose objects a GitTarget mirrors.
type SourceCluster struct {
	// KubeConfigSecretRef names the Secret, in the GitTarget's namespace, and the key in it that
	// holds the kubeconfig for the remote cluster. Without a key, "value" is read, else
	// "value.yaml". The kubeconfig must hold everything inline (certificate-authority-data,
	// client-certificate-data, client-key-data, token): it is never written to disk.
	// +required
	KubeConfigSecretRef SecretKeyReference `json:"kubeConfigSecretRef"`

	// AuditRoute is the {route} of POST /audit/{route} that the remote cluster's kube-apiserver
	// sends its audit events to; it tells kubescribe which cluster an audit event came from.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	AuditRoute string `json:"auditRoute"`
}

// Destination is where a GitTarget writes: the part of its spec that can be retargeted.
type Destination struct {
	// Branch is the branch commits are pushed to.
	// +required
	Branch string `json:"branch"`

	// Path is the folder inside the repository; empty is the repository root.
	// +optional
	Path string `json:"path"`

	// SourceCluster is the auditRoute of the remote source cluster; empty for the cluster
	// kubescribe runs in.
	// +optional
	SourceCluster string `json:"sourceCluster,omitempty"`
}

// GitTargetStatus is the observed state of a GitTarget.
type GitTargetStatus struct {
	// ObservedGeneration is the metadata.generation of the GitTarget the status was computed
	// from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions describe the GitTarget's state. The Ready condition is True once its
	// GitProvider is Ready and the destination is valid and being written to.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// ObservedDestination is the destination the controller has materialized: where the
	// target's content really is. While it differs from the spec's branch, path and
	// sourceCluster, the target is being retargeted (condition Retargeting=True); it is set to
	// the new destination only once the snapshot into it is pushed.
	// +optional
	ObservedDestination *Destination `json:"observedDestination,omitempty"`

	// RetargetingTo is the destination a retarget in progress is moving to; absent when no
	// retarget is in progress. A spec change during a move restarts the move, and this follows.
	// +optional
	RetargetingTo *Destination `json:"retargetingTo,omitempty"`

	// LastCommit is the SHA of the last commit pushed for this target.
	// +optional
	LastCommit string `json:"lastCommit,omitempty"`

	// LastPushTime is when the last commit for this target was pushed.
	// +optional
	LastPushTime *metav1.Time `json:"lastPushTime,omitempty"`

	// FolderTree is the Git tree hash of the target's folder in LastCommit. While the branch's
	// folder is still that tree, kubescribe knows it wrote it, and does not read the folder's
	// files to check it again before writing (after a restart, for example).
	// +optional
	FolderTree string `json:"folderTree,omitempty"`
}

// GitTarget is a branch and folder of a GitProvider's repository that WatchRules in the same
// namespace mirror objects into.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=kubescribe
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].reason"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Provider",type="string",JSONPath=".spec.providerRef.name",priority=1
// +kubebuilder:printcolumn:name="Branch",type="string",JSONPath=".spec.branch",priority=1
// +kubebuilder:printcolumn:name="Path",type="string",JSONPath=".spec.path",priority=1
// +kubebuilder:printcolumn:name="Last Commit",type="string",JSONPath=".status.lastCommit",priority=1
type GitTarget struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the GitTarget.
	// +required
	Spec GitTargetSpec `json:"spec"`

	// Status is the observed state of the GitTarget.
	// +optional
	Status GitTargetStatus `json:"status,omitempty"`
}

// GitTargetList is a list of GitTargets.
//
// +kubebuilder:object:root=true
type GitTargetList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the GitTargets.
	Items []GitTarget `json:"items"`
}

// KubeConfigKeys returns the Secret keys that may hold the kubeconfig, in the order they are
// tried: kubeConfigSecretRef.key alone when set, else DefaultKubeConfigKeys.
func (s *SourceCluster) KubeConfigKeys() []string {
	if s == nil || s.KubeConfigSecretRef.Key == "" {
		return append([]string(nil), DefaultKubeConfigKeys...)
	}
	return []string{s.KubeConfigSecretRef.Key}
}

// Destination returns the destination the spec asks for, to compare with
// status.observedDestination.
func (s *GitTargetSpec) Destination() Destination {
	d := Destination{Branch: s.Branch, Path: s.Path}
	if s.SourceCluster != nil {
		d.SourceCluster = s.SourceCluster.AuditRoute
	}
	return d
}

// Encryption says how a GitTarget's Secrets are written to Git.
type Encryption struct {
	// Age lists the age recipients ("age1…" X25519 public keys) every Secret is encrypted for:
	// whoever holds one of their identities (a person, Flux's kustomize-controller) can decrypt
	// it. kubescribe holds no identity, so it never reads back what it wrote.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=128
	// +listType=set
	Age []string `json:"age"`
}
