package v1alpha1

// LocalObjectReference names an object in the namespace of the object that holds the reference.
type LocalObjectReference struct {
	// Name of the referenced object, in the same namespace as the referring object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// SecretKeyReference names one key of a Secret in the namespace of the object that holds the
// reference.
type SecretKeyReference struct {
	// Name of the Secret, in the same namespace as the referring object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`

	// Key inside the Secret's data. When empty, the field that holds this reference documents the
	// key used.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key,omitempty"`
}

// Identity is a Git identity: the name and email of a commit's author or committer.
type Identity struct {
	// Name as written into commits. It must not contain '<', '>' or control characters.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[^<>\x00-\x1f\x7f]+$`
	Name string `json:"name"`

	// Email as written into commits, of the form local@domain.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[^<>@\x00-\x20\x7f]+@[^<>@\x00-\x20\x7f]+$`
	Email string `json:"email"`
}
