package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults applied by the GitProviderSpec getters.
const (
	// DefaultCommitWindow is the commit window used when spec.commitWindow is not set.
	DefaultCommitWindow = 5 * time.Second
	// DefaultFetchInterval is the fetch interval used when spec.fetchInterval is not set.
	DefaultFetchInterval = time.Minute
	// DefaultCommitterName is the committer name used when spec.committer is not set.
	DefaultCommitterName = "kubescribe"
	// DefaultCommitterEmail is the committer email used when spec.committer is not set.
	DefaultCommitterEmail = "kubescribe@kubescribe.invalid"
	// DefaultAuthorEmailDomain is the author email domain used when spec.authorEmailDomain is
	// not set.
	DefaultAuthorEmailDomain = "users.kubescribe.invalid"
)

// Keys read from the Secret named by GitProviderSpec.SecretRef.
const (
	// SecretKeyUsername is the HTTP(S) basic-auth username. Optional: when only a password is
	// given, the username is DefaultGitUsername.
	SecretKeyUsername = "username"
	// SecretKeyPassword is the HTTP(S) basic-auth password or access token.
	SecretKeyPassword = "password"
	// SecretKeyCACert is a PEM bundle of certificate authorities trusted for an https:// remote,
	// in addition to the system roots.
	SecretKeyCACert = "ca.crt"
	// SecretKeyIdentity is the PEM-encoded private key for an SSH remote.
	SecretKeyIdentity = "identity"
	// SecretKeyKnownHosts is the known_hosts content an SSH remote's host key is checked against.
	SecretKeyKnownHosts = "known_hosts"
	// DefaultGitUsername is the HTTP(S) username used when the Secret has a password but no
	// username.
	DefaultGitUsername = "git"
)

// Keys read from the Secret named by CommitSigning.SecretRef.
const (
	// SecretKeySigningKey is the private key commits are signed with: an OpenSSH (or PEM) private
	// key for SSH signatures, or an armored OpenPGP secret key.
	SecretKeySigningKey = "signing.key"
	// SecretKeySigningPassphrase decrypts a signing key protected by a passphrase. Optional.
	SecretKeySigningPassphrase = "signing.passphrase"
)

// CommitSigning says how kubescribe signs the commits it makes.
type CommitSigning struct {
	// SecretRef names a Secret in the same namespace holding the private key under
	// "signing.key": an OpenSSH private key (commits carry SSH signatures, which git verifies
	// with gpg.format=ssh and an allowed-signers file listing the committer's email) or an
	// armored OpenPGP secret key (verified by gpg with the public key imported). A key protected
	// by a passphrase needs it under "signing.passphrase". It may be the Secret of spec.secretRef.
	// The key is read into memory only; a changed Secret is used for the next commit, without
	// a restart.
	// +required
	SecretRef LocalObjectReference `json:"secretRef"`
}

// GitProviderSpec describes a Git repository and how kubescribe writes to it.
type GitProviderSpec struct {
	// URL of the repository: an https://, http:// or ssh:// URL, or the scp-like form
	// user@host:path (for example git@github.com:example/config.git).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^((https?|ssh)://[^\x00-\x20\x7f]+|[A-Za-z0-9._~-]+@([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[^\x00-\x20\x7f]+)$`
	URL string `json:"url"`

	// SecretRef names a Secret in the same namespace holding the credentials for the repository.
	// For https:// and http:// URLs it is read for the keys "username" and "password" (a password
	// or access token alone is enough: the username then defaults to "git") and, optionally,
	// "ca.crt" (PEM certificate authorities to trust in addition to the system roots). For ssh://
	// and scp-like URLs it is read for the keys "identity" (the private key, without passphrase)
	// and "known_hosts" (the repository host's keys; a host key not listed there is refused),
	// both required, and optionally "username" when the URL names no user (default "git"). When
	// unset, an https:// or http:// repository is accessed anonymously; an SSH repository needs it.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`

	// Committer is the identity recorded as the committer of every commit kubescribe makes; the
	// author is the user who made the change. Defaults to name "kubescribe", email
	// "kubescribe@kubescribe.invalid".
	// +optional
	Committer *Identity `json:"committer,omitempty"`

	// Signing, when set, signs every commit kubescribe makes on this repository, commits made
	// again on top of someone else's included. A key that cannot sign makes the provider
	// Ready=False (SigningKeyInvalid) and holds the commits rather than push them unsigned.
	// +optional
	Signing *CommitSigning `json:"signing,omitempty"`

	// CommitWindow is how long a commit stays open: the changes of one author on one GitTarget
	// made within this window become one commit; a change by a different author closes the
	// window. A Go duration such as "5s" or "1m30s", above zero and at most one hour.
	// Defaults to 5s.
	// +optional
	// +kubebuilder:default="5s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('1h')",message="commitWindow must be above 0s and at most 1h"
	CommitWindow *metav1.Duration `json:"commitWindow,omitempty"`

	// FetchInterval is how often kubescribe fetches a branch it has nothing to push to, to find
	// commits someone else pushed there. A file of a GitTarget's folder that such a commit edited
	// or removed is written again as the cluster has it, by the committer; a commit outside the
	// folders changes nothing. Each check reads the branch's advertisement, and fetches only
	// when the branch moved. Without checks (0s), such edits are found when the next push is
	// refused. A Go duration of at least 1s and at most 24h, or "0s". Defaults to 1m.
	// +optional
	// +kubebuilder:default="1m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) == duration('0s') || (duration(self) >= duration('1s') && duration(self) <= duration('24h'))",message="fetchInterval must be 0s, or at least 1s and at most 24h"
	FetchInterval *metav1.Duration `json:"fetchInterval,omitempty"`

	// AuthorEmailDomain is the domain of the author email for Kubernetes usernames that contain
	// no '@': such a user's commits are authored as <username>@<authorEmailDomain>. Defaults to
	// "users.kubescribe.invalid".
	// +optional
	// +kubebuilder:default="users.kubescribe.invalid"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$`
	AuthorEmailDomain string `json:"authorEmailDomain,omitempty"`
}

// GitProviderStatus is the observed state of a GitProvider.
type GitProviderStatus struct {
	// ObservedGeneration is the metadata.generation of the GitProvider the status was computed
	// from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions describe the GitProvider's state. The Ready condition is True once the Secret
	// (if any) is valid and the remote answered with the credentials.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// GitProvider is a Git repository and the credentials kubescribe pushes to it with. GitTargets
// in the same namespace name it to choose a branch and folder of the repository.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=kubescribe
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].reason"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="URL",type="string",JSONPath=".spec.url",priority=1
type GitProvider struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the GitProvider.
	// +required
	Spec GitProviderSpec `json:"spec"`

	// Status is the observed state of the GitProvider.
	// +optional
	Status GitProviderStatus `json:"status,omitempty"`
}

// GitProviderList is a list of GitProviders.
//
// +kubebuilder:object:root=true
type GitProviderList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the GitProviders.
	Items []GitProvider `json:"items"`
}

// GetCommitWindow returns spec.commitWindow, or DefaultCommitWindow when it is unset or negative.
func (s *GitProviderSpec) GetCommitWindow() time.Duration {
	if s == nil || s.CommitWindow == nil || s.CommitWindow.Duration < 0 {
		return DefaultCommitWindow
	}
	return s.CommitWindow.Duration
}

// GetFetchInterval returns spec.fetchInterval, or DefaultFetchInterval when it is unset or
// negative; 0 turns the checks off.
func (s *GitProviderSpec) GetFetchInterval() time.Duration {
	if s == nil || s.FetchInterval == nil || s.FetchInterval.Duration < 0 {
		return DefaultFetchInterval
	}
	return s.FetchInterval.Duration
}

// GetCommitter returns spec.committer with DefaultCommitterName and DefaultCommitterEmail in
// place of an unset committer or an empty field.
func (s *GitProviderSpec) GetCommitter() Identity {
	id := Identity{Name: DefaultCommitterName, Email: DefaultCommitterEmail}
	if s == nil || s.Committer == nil {
		return id
	}
	if s.Committer.Name != "" {
		id.Name = s.Committer.Name
	}
	if s.Committer.Email != "" {
		id.Email = s.Committer.Email
	}
	return id
}

// GetAuthorEmailDomain returns spec.authorEmailDomain, or DefaultAuthorEmailDomain when it is
// empty.
func (s *GitProviderSpec) GetAuthorEmailDomain() string {
	if s == nil || s.AuthorEmailDomain == "" {
		return DefaultAuthorEmailDomain
	}
	return s.AuthorEmailDomain
}

// GetCommitWindow returns the provider's commit window; see GitProviderSpec.GetCommitWindow.
func (p *GitProvider) GetCommitWindow() time.Duration {
	if p == nil {
		return DefaultCommitWindow
	}
	return p.Spec.GetCommitWindow()
}

// GetFetchInterval returns the provider's fetch interval; see GitProviderSpec.GetFetchInterval.
func (p *GitProvider) GetFetchInterval() time.Duration {
	if p == nil {
		return DefaultFetchInterval
	}
	return p.Spec.GetFetchInterval()
}

// GetCommitter returns the provider's committer; see GitProviderSpec.GetCommitter.
func (p *GitProvider) GetCommitter() Identity {
	if p == nil {
		return (*GitProviderSpec)(nil).GetCommitter()
	}
	return p.Spec.GetCommitter()
}

// GetAuthorEmailDomain returns the provider's author email domain; see
// GitProviderSpec.GetAuthorEmailDomain.
func (p *GitProvider) GetAuthorEmailDomain() string {
	if p == nil {
		return DefaultAuthorEmailDomain
	}
	return p.Spec.GetAuthorEmailDomain()
}
