package attribution

import (
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// UnresolvedUsername is the author recorded when no audit fact explains a change within the
// grace window. It is deliberately not a valid Kubernetes username.
const UnresolvedUsername = "unknown (attribution unresolved)"

// Author is who made a change.
type Author struct {
	audit.Identity
	// Resolved is false when no fact was found; Identity.Username is then UnresolvedUsername.
	Resolved bool
	// AuditID of the request that made the change, when resolved.
	AuditID string
	// Verb of that request, when resolved.
	Verb string
	// Source is the tier that named the author when resolved: SourceAudit (an audit fact) or
	// SourceAdmission (an admission candidate the watch confirmed).
	Source string
}

// AttributedChange is a watch change joined with its author. It is the output of
// internal/attribution and the input of internal/git.
type AttributedChange struct {
	watch.Change
	Author Author
}
