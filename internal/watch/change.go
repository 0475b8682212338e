package watch

import (
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Op is what happened to an object.
type Op string

// The operations a watch reports.
const (
	OpCreate Op = "create"
	OpUpdate Op = "update"
	OpDelete Op = "delete"
)

// Change is one observed change of one watched object, already in declared form. It is the
// output of internal/watch and the input of internal/attribution.
type Change struct {
	// Cluster is the audit route of the source cluster the object lives in.
	Cluster string
	// Target is the GitTarget this change is mirrored to.
	Target types.NamespacedName
	// GVR is the resource watched.
	GVR schema.GroupVersionResource
	// Namespace is empty for cluster-scoped objects.
	Namespace string
	Name      string
	UID       string
	// ResourceVersion is the object's resourceVersion as the watch delivered it.
	ResourceVersion string
	Op              Op
	// Manifest is the declared form as stable YAML; nil for OpDelete.
	Manifest []byte
	// Observed is when the watch delivered the change.
	Observed time.Time
	// Snapshot is true for objects found by the initial list rather than by a watch event:
	// they are not a change anyone made now, so nobody is credited with them.
	Snapshot bool
}
