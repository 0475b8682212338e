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
	// OpSweep is not an object's change: once a stream has handed a GitTarget the state of
	// its resource, it says which objects exist (Keep), so that the writer removes the files of
	// every other object of that resource in the target's folder. Only the stream's resource
	// and namespace scope are swept.
	OpSweep Op = "sweep"
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
	// BaseResourceVersion is the resourceVersion the informer held of the object before this
	// event: the old object's for an update, the last one seen for a delete, "" for a create
	// and for a change found by a list. An admission candidate is confirmed against it.
	BaseResourceVersion string
	// DeletionBaseResourceVersion, for a delete of an object whose deletion was held by
	// finalizers, is the resourceVersion it had before its deletionTimestamp was set (the
	// version the DELETE request started from), when the informer saw that happen.
	DeletionBaseResourceVersion string
	// Digest is the SHA-256 of Manifest (zero for OpDelete): admission candidates carry the
	// same digest of the object they would write. A sealed change's is the keyed digest of its
	// plaintext form (RegistryOptions.SecretDigest), zero without a key.
	Digest [32]byte
	// Manifest is the declared form as stable YAML; nil for OpDelete. Read-only: it shares its
	// memory with the informer's cached object.
	Manifest []byte
	// Observed is when the watch delivered the change.
	Observed time.Time
	// Snapshot is true for objects found by a list rather than by a watch event. Such a
	// change is credited to the fact of its (uid, resourceVersion) when one exists, and
	// otherwise to the committer: nobody was seen making it.
	Snapshot bool
	// Resumed is set on a snapshot change that the stream's resume cursor shows happened
	// while nothing watched: the object appeared, changed or disappeared since the last push.
	// It waits for its fact like a live change.
	Resumed bool
	// Replayed is set on a change a resumed stream replayed (a watch from the position its
	// previous owner had reached): an event that owner may have held unpushed when it was lost.
	// Not a snapshot: its author is its fact's, and it waits for it as long as a Resumed change
	// does, since the apiserver may have sent its audit batch to the replica that was lost.
	Replayed bool
	// Unchanged is set on a snapshot change whose object the stream's resume cursor shows
	// the folder held in this very version at the last push: nobody changed it while nothing
	// watched, and it needs no author. It is handed over anyway because the branch may no
	// longer hold what was pushed (someone else edited the folder, or deleted the branch):
	// the writer commits it only where the file differs, and then as the committer's snapshot.
	Unchanged bool
	// IfMissing, set with Unchanged, marks an object whose newest write the stream excludes
	// (excludeFieldManagers, or excludeUsers in the join) while the folder holds an older
	// version of it: the excluded write is not mirrored, so the writer leaves a file that
	// exists as it is, whatever it holds; but where the branch has no file for it (a branch
	// started over, a file someone else removed) it writes the object's current form, as the
	// committer's snapshot, so that the folder keeps every object it held.
	IfMissing bool
	// Scope is the namespace scope of the stream that observed the change: the namespace its
	// informer watches, "" for all namespaces. With Cluster, Target and GVR it names the
	// stream's resume cursor.
	Scope string
	// Keep, for OpSweep only, lists the objects that exist, as "<namespace>/<name>": every
	// object of the stream's scope at the sweep's ResourceVersion (the newest the informer had
	// seen; "" when unknown). An object newer than that may exist without being listed.
	Keep map[string]bool
	// ExcludeUsers are the users whose changes the stream does not mirror: the join drops a
	// change attributed to one of them.
	ExcludeUsers []string
	// Destination is the target's destination when the stream observed the change (see
	// Cluster.Set).
	Destination string
	// SealedFor, when set, names the recipients Manifest is encrypted for (StreamSpec.Seal);
	// Digest is then zero, since nothing derived from the plaintext without a key leaves the
	// watch. An Unchanged sealed change leaves a file sealed for the same recipients as it is:
	// the object's version is the one pushed, and a new encryption would only differ.
	SealedFor []string
}

// Stream names the stream (and so the resume cursor) a change belongs to.
func (c Change) Stream() StreamID {
	return StreamID{Cluster: c.Cluster, Target: c.Target, Destination: c.Destination, GVR: c.GVR, Namespace: c.Scope}
}
