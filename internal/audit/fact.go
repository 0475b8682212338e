package audit

import "time"

// Fact is what one audit event proves about one write: who changed which object, and which
// resourceVersion the write produced. The audit handler extracts facts from the apiserver's
// EventList; internal/attribution stores them and joins them to watch events.
type Fact struct {
	// Route names the source cluster: the {route} of POST /audit/{route}.
	Route string `json:"route"`
	// Group and Resource identify the kind of object ("" is the core group).
	Group    string `json:"group,omitempty"`
	Resource string `json:"resource"`
	// Subresource is empty or "scale".
	Subresource string `json:"subresource,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	// Name is back-filled from the response for generateName creates.
	Name string `json:"name,omitempty"`
	// UID of the object written; a create's objectRef carries none, it comes from the response.
	UID string `json:"uid,omitempty"`
	// ResourceVersion is the post-write resourceVersion, read from responseObject.metadata,
	// never from the request. Empty for an immediate delete (its response is a Status).
	ResourceVersion string `json:"resourceVersion,omitempty"`
	// Terminating is true when the response object carries metadata.deletionTimestamp. For a
	// delete it means the deletion is held by finalizers (ResourceVersion is the write that set
	// deletionTimestamp). For any other verb the object was already being deleted: a write that
	// removes the last finalizer answers with the held delete's resourceVersion and completes
	// the deletion, but it must not take the deletion's credit.
	Terminating bool `json:"terminating,omitempty"`
	// Verb is create, update, patch, delete or deletecollection.
	Verb string `json:"verb"`
	// User is the effective user: impersonatedUser when present, else user.
	User Identity `json:"user"`
	// AuditID is the apiserver's audit ID of the request.
	AuditID string `json:"auditID"`
	// StageTimestamp is when the ResponseComplete stage was reached.
	StageTimestamp time.Time `json:"stageTimestamp"`
	// LabelSelector is set for deletecollection.
	LabelSelector string `json:"labelSelector,omitempty"`
	// DeletedUIDs lists the objects a deletecollection removed, when the response says.
	DeletedUIDs []string `json:"deletedUIDs,omitempty"`
}

// Identity is an authenticated Kubernetes user as the apiserver reported it.
type Identity struct {
	Username string              `json:"username"`
	UID      string              `json:"uid,omitempty"`
	Groups   []string            `json:"groups,omitempty"`
	Extra    map[string][]string `json:"extra,omitempty"`
}
