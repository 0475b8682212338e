package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CommitRequestsResource is the resource of CommitRequest objects.
var CommitRequestsResource = SchemeGroupVersion.WithResource("commitrequests")

// Limits of a CommitRequest's spec, enforced by the CRD schema.
const (
	// MaxCommitMessageLength bounds spec.message, in bytes.
	MaxCommitMessageLength = 4096
	// MaxCloseDelaySeconds bounds spec.closeDelaySeconds. The admission record of a request
	// must outlive it (see --verdict-ttl).
	MaxCloseDelaySeconds = 600
)

// AssertAuthorVerb is the RBAC verb, on resource gittargets of group kubescribe.dev, that lets
// its holder name a commit's author in a CommitRequest's spec.author. Grant it like
// impersonate: to the few identities (a portal, a CI bot) that know who is behind a change, and
// scoped by resourceNames to the GitTargets they serve.
const AssertAuthorVerb = "assert-author"

// ConditionAuthorAttributed says how the author of a CommitRequest's commit was found.
const ConditionAuthorAttributed string = "AuthorAttributed"

// Reasons of a CommitRequest's Ready condition.
const (
	// ReasonCommitted (Ready=True): the submitter's window was closed with the request's message
	// and the commit was pushed; status.sha and status.branch name it.
	ReasonCommitted string = "Committed"
	// ReasonNoOpenWindow (Ready=False, final): the submitter had no open commit window on the
	// GitTarget when the close delay ended (nothing of theirs was waiting, their changes were
	// already committed, or another author's change closed their window). Nothing is committed.
	ReasonNoOpenWindow string = "NoOpenWindow"
	// ReasonNothingToCommit (Ready=False, final): the window was closed but its changes leave the
	// folder as it is on the branch, so there is no commit.
	ReasonNothingToCommit string = "NothingToCommit"
	// ReasonSubmitterUnknown (Ready=False, final): there is no admission record for this request
	// (the webhook is not registered or was bypassed, Redis was unavailable, or the record
	// expired), so kubescribe cannot tell whose window to close. Nothing is committed.
	ReasonSubmitterUnknown string = "SubmitterUnknown"
	// ReasonFailed (Ready=False, final): the request was accepted by a git worker that stopped
	// before reporting a result (kubescribe restarted or the GitTarget was retargeted).
	ReasonFailed string = "Failed"
)

// Reasons of a CommitRequest's AuthorAttributed condition.
const (
	// ReasonAttributedFromAdmission (True): the commit's author is the submitter, as the
	// apiserver authenticated them and the admission webhook recorded them.
	ReasonAttributedFromAdmission string = "AttributedFromAdmission"
	// ReasonAuthorAsserted (True): spec.author is the commit's author; the submitter held
	// assert-author on the GitTarget and is named in the Kubescribe-Submitter trailer.
	ReasonAuthorAsserted string = "AuthorAsserted"
	// ReasonAuthorAssertionUnverified (False): spec.author is ignored because no admission
	// record says the submitter may assert it. The commit, if any, is authored as it would be
	// without spec.author.
	ReasonAuthorAssertionUnverified string = "AuthorAssertionUnverified"
	// ReasonCommitterFallback (False): no admission record names the submitter; no window is
	// closed on an unknown person's behalf, and nothing is authored by this request.
	ReasonCommitterFallback string = "CommitterFallback"
)

// CommitRequestSpec asks kubescribe to close its submitter's open commit window on a GitTarget
// with a message. The spec is immutable.
type CommitRequestSpec struct {
	// TargetRef names the GitTarget, in the same namespace, whose window is closed.
	// +required
	TargetRef LocalObjectReference `json:"targetRef"`

	// Message is the commit message: the first line is the subject. It may hold newlines but
	// no other control characters; kubescribe appends its trailers.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^[^\x00-\x09\x0b-\x1f\x7f]*$`
	// +kubebuilder:validation:XValidation:rule="self.trim() != ''",message="message must not be blank"
	Message string `json:"message"`

	// CloseDelaySeconds is how long after the request was created the window is closed, so
	// that changes made just before still reach it (their audit facts take a moment). 0 by
	// default, at most 600.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=600
	CloseDelaySeconds *int32 `json:"closeDelaySeconds,omitempty"`

	// Author, when set, is the commit's author instead of the submitter. Only a submitter
	// granted the verb assert-author on the GitTarget may set it; otherwise it is ignored
	// (condition AuthorAttributed=False, reason AuthorAssertionUnverified).
	// +optional
	Author *Identity `json:"author,omitempty"`
}

// GetCloseDelay returns spec.closeDelaySeconds as a duration (0 when unset).
func (s *CommitRequestSpec) GetCloseDelay() time.Duration {
	if s == nil || s.CloseDelaySeconds == nil || *s.CloseDelaySeconds < 0 {
		return 0
	}
	return time.Duration(*s.CloseDelaySeconds) * time.Second
}

// CommitRequestStatus is the observed state of a CommitRequest.
type CommitRequestStatus struct {
	// Conditions: Ready (reasons Committed, NoOpenWindow, NothingToCommit, SubmitterUnknown,
	// Failed; Unknown with Progressing while waiting) and AuthorAttributed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Submitter is the user who created the request, as recorded at admission.
	// +optional
	Submitter string `json:"submitter,omitempty"`

	// Branch the commit was pushed to.
	// +optional
	Branch string `json:"branch,omitempty"`

	// SHA of the pushed commit.
	// +optional
	SHA string `json:"sha,omitempty"`

	// CompletionTime is when the request reached its final state; the request is deleted
	// --commit-request-ttl later.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// CommitRequest closes its submitter's open commit window on a GitTarget with a message.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=kubescribe
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].reason"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Target",type="string",JSONPath=".spec.targetRef.name",priority=1
// +kubebuilder:printcolumn:name="SHA",type="string",JSONPath=".status.sha",priority=1
// +kubebuilder:printcolumn:name="Submitter",type="string",JSONPath=".status.submitter",priority=1
// +kubebuilder:printcolumn:name="Author",type="string",JSONPath=".status.conditions[?(@.type==\"AuthorAttributed\")].reason",priority=1
// +kubebuilder:printcolumn:name="Branch",type="string",JSONPath=".status.branch",priority=1
type CommitRequest struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the request; immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
	Spec CommitRequestSpec `json:"spec"`

	// Status is the observed state of the request.
	// +optional
	Status CommitRequestStatus `json:"status,omitempty"`
}

// CommitRequestList is a list of CommitRequests.
//
// +kubebuilder:object:root=true
type CommitRequestList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// Items are the CommitRequests.
	Items []CommitRequest `json:"items"`
}
