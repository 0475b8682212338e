// Package admission turns the apiserver's validating-webhook requests for watched resources into
// candidate attribution facts, for clusters whose audit flags are out of reach (managed
// clusters). An admission request is seen before the write happens and a later step may still
// refuse it, so a candidate proves nothing by itself: internal/attribution credits a watched
// change to a candidate only when the watch event shows that exactly that write happened (same
// object uid, same base resourceVersion, same declared-form digest). docs/managed-clusters.md
// describes what this tier can and cannot prove.
package admission

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/kubescribe/kubescribe/internal/audit"
)

// The operations a candidate records (the AdmissionRequest's operation).
const (
	OpCreate = "CREATE"
	OpUpdate = "UPDATE"
	OpDelete = "DELETE"
)

// Candidate is what one admission request claims about a write that may or may not happen.
type Candidate struct {
	// Route names the source cluster: the {route} of POST /validate/attribution/{route}.
	Route string
	// Group and Resource identify the kind of object; Subresource is "" or "scale".
	Group, Resource, Subresource string
	Namespace, Name              string
	// UID of the object written. The apiserver assigns a new object's uid (and its generated
	// name) before validating admission, so a CREATE carries it too.
	UID string
	// Operation is OpCreate, OpUpdate or OpDelete.
	Operation string
	// BaseResourceVersion is the resourceVersion of the object the write starts from
	// (oldObject.metadata.resourceVersion); empty for a create.
	BaseResourceVersion string
	// Digest is the hex SHA-256 of the declared form (internal/declared) of the object the
	// write would store; empty for a delete and for a scale (whose object is a Scale).
	Digest string
	// Replicas is spec.replicas of a scale write's Scale object; nil otherwise.
	Replicas *int64
	// User is the user the apiserver names in the request (for an impersonated request, the
	// impersonated user, as audit's effective user).
	User audit.Identity
	// RequestUID is the AdmissionRequest's uid (for logs; retries of one request share it).
	RequestUID string
	// Received is when the webhook received the request.
	Received time.Time
}

// Digest returns the digest a candidate and a watched change are compared by: the hex SHA-256
// of a declared-form manifest.
func Digest(manifest []byte) string {
	sum := sha256.Sum256(manifest)
	return hex.EncodeToString(sum[:])
}

// DigestOf is Digest of a sum already computed.
func DigestOf(sum [32]byte) string { return hex.EncodeToString(sum[:]) }
