package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/keyspace"
)

// Keys owned by this package, all under the configured prefix P:
//
//	P:cursor:<cluster>:<target namespace>/<target name>:<destination>:<resource>.<group>/<version>:<namespace scope>
//	    a hash: one field per object the GitTarget's folder holds, "<namespace>/<name>" ("/<name>"
//	    for a cluster-scoped object), whose value is a cursorRecord (JSON); plus the field
//	    cursorInitField once the target was first handed the resource's state. The namespace
//	    scope is the informer's namespace, "*" for all namespaces.
//
// The cursor is the resume point of one stream: what the GitTarget's folder holds of one
// resource, as pushed. It advances only after a push (CursorStore.Advance), so after a crash a
// restart compares the cluster with what really reached the remote, and replays the rest.

// cursorVersion is the version of cursorRecord; a record of another version is ignored (the
// object is then treated as unknown: replayed, which is safe).
const cursorVersion = 1

// cursorInitField marks a cursor that exists; an object name can never be "." (Kubernetes
// refuses it as a path segment), so it cannot collide.
const cursorInitField = "."

// cursorRecord is the stored value of one object in a cursor.
type cursorRecord struct {
	V   int    `json:"v"`
	UID string `json:"uid"`
	RV  string `json:"rv"`
	// Sealed is the fingerprint of the recipients the pushed file is sealed for (sealPrint),
	// omitted for a file in the clear.
	Sealed string `json:"s,omitempty"`
}

// CursorEntry is what a cursor holds of one object.
type CursorEntry struct {
	UID             string
	ResourceVersion string
	// Sealed is the fingerprint of the recipients its file was sealed for; "" in the clear.
	Sealed string
}

// Cursor is a stream's resume point: the objects the folder holds, by "<namespace>/<name>".
// Known is false when no cursor was ever written for the stream (a new GitTarget or resource).
type Cursor struct {
	Known   bool
	Objects map[string]CursorEntry
	// Trail is the positions the stream's owners recorded (see replay.go), oldest first.
	Trail []TrailPoint
}

// trailField holds a cursor's trail: a JSON array of [unix ms, resourceVersion]. Object fields
// always hold a "/", so it cannot collide.
const trailField = "trail"

// CursorStore keeps resume cursors in Redis.
type CursorStore struct {
	rdb    redis.UniversalClient
	prefix keyspace.Prefix
}

// NewCursorStore returns a CursorStore.
func NewCursorStore(rdb redis.UniversalClient, prefix keyspace.Prefix) *CursorStore {
	return &CursorStore{rdb: rdb, prefix: prefix}
}

// StreamID identifies a stream's cursor.
type StreamID struct {
	Cluster string
	Target  types.NamespacedName
	// Destination is the target's branch and folder: a cursor describes one folder.
	Destination string
	GVR         schema.GroupVersionResource
	Namespace   string // the informer's scope; "" is all namespaces
}

func (s *CursorStore) key(id StreamID) string {
	scope := id.Namespace
	if scope == "" {
		scope = "*"
	}
	return s.prefix.Key("cursor", id.Cluster, id.Target.String(), id.Destination, resourceLabel(id.GVR)+"/"+id.GVR.Version, scope)
}

// objectField is the hash field of an object.
func objectField(namespace, name string) string { return namespace + "/" + name }

// Load reads a stream's cursor.
func (s *CursorStore) Load(ctx context.Context, id StreamID) (Cursor, error) {
	all, err := s.rdb.HGetAll(ctx, s.key(id)).Result()
	if err != nil {
		return Cursor{}, fmt.Errorf("reading the resume cursor of %s: %w", s.key(id), err)
	}
	c := Cursor{Objects: make(map[string]CursorEntry, len(all))}
	for field, val := range all {
		if field == cursorInitField {
			c.Known = true
			continue
		}
		if field == trailField {
			if json.Unmarshal([]byte(val), &c.Trail) != nil {
				c.Trail = nil // unreadable: no replay, which only collapses versions
			}
			continue
		}
		var rec cursorRecord
		if json.Unmarshal([]byte(val), &rec) != nil || rec.V != cursorVersion {
			continue
		}
		c.Objects[field] = CursorEntry{UID: rec.UID, ResourceVersion: rec.RV, Sealed: rec.Sealed}
	}
	if len(c.Objects) > 0 {
		c.Known = true
	}
	return c, nil
}

// setIfExists sets a hash's field only if the hash exists; it returns 0 when it does not.
const setIfExists = `if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1 end return 0`

// SaveTrails records streams' trails, in one pipelined round trip. A trail is written only to
// a cursor that exists (its stream was handed its initial state), so that it never revives one
// DropDestination or DropTarget removed; it returns the streams whose cursor did not exist.
func (s *CursorStore) SaveTrails(ctx context.Context, trails map[StreamID][]TrailPoint) ([]StreamID, error) {
	pipe := s.rdb.Pipeline()
	ids := make([]StreamID, 0, len(trails))
	cmds := make([]*redis.Cmd, 0, len(trails))
	for id, t := range trails {
		b, err := json.Marshal(t)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
		cmds = append(cmds, pipe.Eval(ctx, setIfExists, []string{s.key(id)}, trailField, string(b)))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("recording %d streams' positions: %w", len(trails), err)
	}
	var missing []StreamID
	for i, cmd := range cmds {
		if n, err := cmd.Int(); err == nil && n == 0 {
			missing = append(missing, ids[i])
		}
	}
	return missing, nil
}

// MarkKnown records that a stream's cursor exists, even while it holds no object, with the
// stream's trail so far (none when trail is empty): the position its initial state was handed
// at is recorded before any change after it can be pushed.
func (s *CursorStore) MarkKnown(ctx context.Context, id StreamID, trail []TrailPoint) error {
	values := []any{cursorInitField, "1"}
	if len(trail) > 0 {
		b, err := json.Marshal(trail)
		if err != nil {
			return err
		}
		values = append(values, trailField, string(b))
	}
	return s.rdb.HSet(ctx, s.key(id), values...).Err()
}

// Advance records pushed changes in their streams' cursors: a created or updated object with
// the resourceVersion pushed, a deleted one removed. Changes are applied in order, in one
// pipelined round trip. Sweeps carry no object and are skipped.
func (s *CursorStore) Advance(ctx context.Context, changes []Change) error {
	pipe := s.rdb.Pipeline()
	n := 0
	for _, c := range changes {
		if c.Op == OpSweep {
			continue
		}
		key := s.key(c.Stream())
		field := objectField(c.Namespace, c.Name)
		n++
		if c.Op == OpDelete {
			pipe.HDel(ctx, key, field)
			continue
		}
		val, _ := json.Marshal(cursorRecord{V: cursorVersion, UID: c.UID, RV: c.ResourceVersion, Sealed: sealPrint(c.SealedFor)})
		pipe.HSet(ctx, key, field, val, cursorInitField, "1")
	}
	if n == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("advancing %d resume cursor entries: %w", n, err)
	}
	return nil
}

// cursorObjectKey splits a cursor field back into namespace and name.
func cursorObjectKey(field string) (namespace, name string) {
	ns, name, _ := strings.Cut(field, "/")
	return ns, name
}

// DropDestination removes every resume cursor of target's streams at destination in cluster:
// what a retarget does to the old destination once its streams are stopped, so that a later
// move back starts with a full snapshot rather than resuming from a folder nobody maintained
// in between. It reports how many cursors it removed.
func (s *CursorStore) DropDestination(ctx context.Context, cluster string, target types.NamespacedName, destination string) (int, error) {
	head := s.prefix.Key("cursor", cluster, target.String(), destination) + ":"
	return s.drop(ctx, globEscape(head)+"*", func(key string) bool {
		// The rest is "<resource>.<group>/<version>:<scope>", which holds exactly one ':'; a
		// destination whose folder extends this one by ":..." has more.
		rest, ok := strings.CutPrefix(key, head)
		return ok && strings.Count(rest, ":") == 1
	})
}

// DropTarget removes every resume cursor of target, in every cluster and destination: what
// the deletion of a GitTarget leaves behind otherwise.
func (s *CursorStore) DropTarget(ctx context.Context, target types.NamespacedName) (int, error) {
	head := s.prefix.Key("cursor") + ":"
	return s.drop(ctx, globEscape(head)+"*:"+globEscape(target.String())+":*", func(key string) bool {
		// "<cluster>:<namespace>/<name>:..."; neither a cluster name (an audit route) nor a
		// target name holds ':', so the second field is the target.
		parts := strings.SplitN(strings.TrimPrefix(key, head), ":", 3)
		return len(parts) == 3 && parts[1] == target.String()
	})
}

// drop deletes the keys that match pattern and that keep accepts. It scans every primary
// (each shard of a Redis Cluster holds its own keys).
func (s *CursorStore) drop(ctx context.Context, pattern string, keep func(string) bool) (int, error) {
	var mu sync.Mutex
	n := 0
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, pattern, 500).Iterator()
		for iter.Next(ctx) {
			if !keep(iter.Val()) {
				continue
			}
			if err := c.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
			mu.Lock()
			n++
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("unsupported Redis client %T", s.rdb)
	}
	if err != nil {
		return n, fmt.Errorf("dropping resume cursors matching %s: %w", pattern, err)
	}
	return n, nil
}

// globEscape quotes the characters a Redis MATCH pattern treats specially (a folder may hold
// them).
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\', '^':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
