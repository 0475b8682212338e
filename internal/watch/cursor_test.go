package watch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
)

// fakeCursors is an in-memory cursorSource.
type fakeCursors struct {
	mu      sync.Mutex
	cursors map[StreamID]Cursor
	marked  []StreamID
	saves   int // SaveTrails calls
}

func (f *fakeCursors) Load(_ context.Context, id StreamID) (Cursor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cursors[id], nil
}

func (f *fakeCursors) MarkKnown(_ context.Context, id StreamID, trail []TrailPoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marked = append(f.marked, id)
	if f.cursors == nil {
		f.cursors = map[StreamID]Cursor{}
	}
	c := f.cursors[id]
	c.Known = true
	if len(trail) > 0 {
		c.Trail = trail
	}
	f.cursors[id] = c
	return nil
}

func (f *fakeCursors) SaveTrails(_ context.Context, trails map[StreamID][]TrailPoint) ([]StreamID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saves++
	var missing []StreamID
	for id, t := range trails {
		c, ok := f.cursors[id]
		if !ok || !c.Known {
			missing = append(missing, id)
			continue
		}
		c.Trail = t
		f.cursors[id] = c
	}
	return missing, nil
}

func (f *fakeCursors) saveCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.saves
}

// trail returns the trail recorded for id.
func (f *fakeCursors) trail(id StreamID) []TrailPoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]TrailPoint(nil), f.cursors[id].Trail...)
}

func (f *fakeCursors) markedIDs() []StreamID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]StreamID(nil), f.marked...)
}

// collect gathers emitted changes until the sweep, which closes a target's initial state.
func collectUntilSweep(t *testing.T, changes <-chan Change) (objects map[string]Change, sweep Change) {
	t.Helper()
	objects = map[string]Change{}
	for {
		select {
		case c := <-changes:
			if c.Op == OpSweep {
				return objects, c
			}
			objects[c.Name] = c
		case <-time.After(5 * time.Second):
			t.Fatal("no sweep emitted")
		}
	}
}

// TestResumeFromCursor: a target whose cursor says what its folder holds is handed what
// changed while nothing watched: changed and new objects as resumed snapshot changes, deleted
// ones as resumed deletes with the uid the cursor recorded, then a sweep that keeps all of
// them. An object the cursor holds in that very version is handed as an unchanged snapshot
// change, which waits for no fact: the writer commits it only if the branch lost its file.
func TestResumeFromCursor(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("same", "1", map[string]any{"a": "1"}),
		configMap("changed", "5", map[string]any{"a": "2"}),
		configMap("new", "6", map[string]any{"a": "3"}))
	target := types.NamespacedName{Namespace: "demo", Name: "target"}
	id := StreamID{Cluster: "local", Target: target, GVR: configMaps, Namespace: "demo"}
	cursors := &fakeCursors{cursors: map[StreamID]Cursor{id: {Known: true, Objects: map[string]CursorEntry{
		"demo/same":    {UID: "uid-same", ResourceVersion: "1"},
		"demo/changed": {UID: "uid-changed", ResourceVersion: "2"},
		"demo/gone":    {UID: "uid-gone", ResourceVersion: "3"},
	}}}}
	m, changes := startCluster(t, client, RegistryOptions{Cursors: cursors})
	ctx := context.Background()
	m.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})

	got, sweep := collectUntilSweep(t, changes)
	require.Len(t, got, 4, "%v", got)
	for name, op := range map[string]Op{"changed": OpUpdate, "new": OpCreate} {
		require.Equal(t, op, got[name].Op, name)
		require.True(t, got[name].Snapshot && got[name].Resumed && !got[name].Unchanged, name)
		require.NotEmpty(t, got[name].Manifest)
	}
	same := got["same"]
	require.Equal(t, OpUpdate, same.Op)
	require.True(t, same.Snapshot && same.Unchanged && !same.Resumed, "the folder held this version at the last push")
	require.Equal(t, "1", same.ResourceVersion)
	require.NotEmpty(t, same.Manifest)
	gone := got["gone"]
	require.Equal(t, OpDelete, gone.Op)
	require.Equal(t, "uid-gone", gone.UID, "the delete carries the uid its fact is keyed by")
	require.Equal(t, "demo", gone.Namespace)
	require.True(t, gone.Snapshot && gone.Resumed)
	require.Equal(t, map[string]bool{"demo/same": true, "demo/changed": true, "demo/new": true, "demo/gone": true}, sweep.Keep)
	require.Equal(t, "demo", sweep.Scope)
	require.Eventually(t, func() bool { return len(cursors.markedIDs()) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, id, cursors.markedIDs()[0])
	ok, err := m.Status("demo/rule")
	require.NoError(t, err)
	require.True(t, ok)

	// After the initial state, the unchanged object's later change is a live one.
	_, err = client.Resource(configMaps).Namespace("demo").Update(ctx, configMap("same", "7", map[string]any{"a": "9"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	live := nextChange(t, changes)
	require.Equal(t, "same", live.Name)
	require.Equal(t, OpUpdate, live.Op)
	require.False(t, live.Snapshot)
}

// TestFreshTargetSnapshotAndSweep: without a cursor, every object is a snapshot change that
// did not wait (not Resumed), and the sweep keeps exactly the listed objects.
func TestFreshTargetSnapshotAndSweep(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("a", "1", map[string]any{"a": "1"}), configMap("b", "2", map[string]any{"b": "1"}))
	m, changes := startCluster(t, client, RegistryOptions{Cursors: &fakeCursors{}})
	m.Set("demo/rule", "", []StreamSpec{{Target: types.NamespacedName{Namespace: "demo", Name: "t"}, GVR: configMaps, Namespace: "demo"}})

	got, sweep := collectUntilSweep(t, changes)
	require.Len(t, got, 2)
	for _, c := range got {
		require.True(t, c.Snapshot)
		require.False(t, c.Resumed)
	}
	require.Equal(t, map[string]bool{"demo/a": true, "demo/b": true}, sweep.Keep)
}

// TestCursorStoreRoundTrip: against a real Redis, a cursor advanced by pushed changes reads
// back what the folder holds; a record of another version is ignored; sweeps are skipped.
func TestCursorStoreRoundTrip(t *testing.T) {
	rdb := redistest.Start(t)
	ctx := context.Background()
	s := NewCursorStore(rdb, keyspace.MustParse("test"))
	target := types.NamespacedName{Namespace: "team-a", Name: "web"}
	id := StreamID{Cluster: "local", Target: target, Destination: "main:apps", GVR: configMaps, Namespace: "demo"}

	c, err := s.Load(ctx, id)
	require.NoError(t, err)
	require.False(t, c.Known)
	require.NoError(t, s.MarkKnown(ctx, id, nil))
	c, err = s.Load(ctx, id)
	require.NoError(t, err)
	require.True(t, c.Known)
	require.Empty(t, c.Objects)

	change := func(op Op, name, uid, rv string) Change {
		return Change{Cluster: "local", Target: target, Destination: "main:apps", GVR: configMaps, Scope: "demo", Namespace: "demo", Name: name, UID: uid, ResourceVersion: rv, Op: op}
	}
	require.NoError(t, s.Advance(ctx, []Change{
		change(OpCreate, "a", "u-a", "1"),
		change(OpCreate, "b", "u-b", "2"),
		change(OpUpdate, "a", "u-a", "3"),
		change(OpDelete, "b", "u-b", "2"),
		{Op: OpSweep, Keep: map[string]bool{}},
	}))
	require.NoError(t, rdb.HSet(ctx, s.key(id), "demo/future", `{"v":99,"uid":"x","rv":"1"}`).Err())
	c, err = s.Load(ctx, id)
	require.NoError(t, err)
	require.Equal(t, map[string]CursorEntry{"demo/a": {UID: "u-a", ResourceVersion: "3"}}, c.Objects)
	require.Equal(t, "test:cursor:local:team-a/web:main:apps:configmaps/v1:demo", s.key(id))

	// Another folder's cursor is separate.
	moved, err := s.Load(ctx, StreamID{Cluster: "local", Target: target, Destination: "main:elsewhere", GVR: configMaps, Namespace: "demo"})
	require.NoError(t, err)
	require.False(t, moved.Known)

	// Another stream's cursor is separate; all namespaces is scope "*".
	all, err := s.Load(ctx, StreamID{Cluster: "local", Target: target, GVR: configMaps})
	require.NoError(t, err)
	require.False(t, all.Known)
}

// TestCursorStoreTrails: against a real Redis, a trail is written only into a cursor that
// exists (never reviving one a retarget or a deletion dropped), reads back in order, and an
// unreadable one reads as none.
func TestCursorStoreTrails(t *testing.T) {
	rdb := redistest.Start(t)
	ctx := context.Background()
	s := NewCursorStore(rdb, keyspace.MustParse("test"))
	id := StreamID{Cluster: "local", Target: types.NamespacedName{Namespace: "team-a", Name: "web"}, Destination: "main:apps", GVR: configMaps, Namespace: "demo"}
	trail := []TrailPoint{{At: 1000, RV: 10}, {At: 3000, RV: 42}}

	missing, err := s.SaveTrails(ctx, map[StreamID][]TrailPoint{id: trail})
	require.NoError(t, err)
	require.Equal(t, []StreamID{id}, missing, "a trail without its cursor is reported unwritten")
	n, err := rdb.Exists(ctx, s.key(id)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "a trail created a cursor")

	require.NoError(t, s.MarkKnown(ctx, id, trail[:1]))
	c, err := s.Load(ctx, id)
	require.NoError(t, err)
	require.True(t, c.Known)
	require.Equal(t, trail[:1], c.Trail, "marked known with the trail of its initial state")
	missing, err = s.SaveTrails(ctx, map[StreamID][]TrailPoint{id: trail})
	require.NoError(t, err)
	require.Empty(t, missing)
	c, err = s.Load(ctx, id)
	require.NoError(t, err)
	require.True(t, c.Known)
	require.Equal(t, trail, c.Trail)
	require.Empty(t, c.Objects, "the trail is not an object")

	require.NoError(t, rdb.HSet(ctx, s.key(id), trailField, "not json").Err())
	c, err = s.Load(ctx, id)
	require.NoError(t, err)
	require.Nil(t, c.Trail)
}

// TestDestinationChangeHandsTheStateAgain: when a target's destination (branch or folder)
// moves, its stream starts over: every object as a snapshot change for the new destination,
// then a sweep of it, with the new destination's cursor.
func TestDestinationChangeHandsTheStateAgain(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("a", "1", map[string]any{"a": "1"}))
	cursors := &fakeCursors{}
	m, changes := startCluster(t, client, RegistryOptions{Cursors: cursors})
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	m.Set("demo/rule", "main:old", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})
	got, sweep := collectUntilSweep(t, changes)
	require.Equal(t, "main:old", got["a"].Destination)
	require.Equal(t, "main:old", sweep.Destination)

	m.Set("demo/rule", "main:new", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})
	got, sweep = collectUntilSweep(t, changes)
	require.True(t, got["a"].Snapshot)
	require.Equal(t, "main:new", got["a"].Destination)
	require.Equal(t, map[string]bool{"demo/a": true}, sweep.Keep)
	require.Eventually(t, func() bool { return len(cursors.markedIDs()) == 2 }, 5*time.Second, 10*time.Millisecond)
	// Each stream marks its cursor from a goroutine of its own: in either order.
	var marked []string
	for _, id := range cursors.markedIDs() {
		marked = append(marked, id.Destination)
	}
	require.ElementsMatch(t, []string{"main:old", "main:new"}, marked)
}

// TestCursorStoreDrops: a retarget drops the cursors of exactly one destination of one target
// (not a folder that merely starts with the same characters, nor one that holds glob
// characters); a deleted target's cursors go in every cluster and destination, and nobody
// else's.
func TestCursorStoreDrops(t *testing.T) {
	rdb := redistest.Start(t)
	ctx := context.Background()
	s := NewCursorStore(rdb, keyspace.MustParse("test"))
	web := types.NamespacedName{Namespace: "team-a", Name: "web"}
	db := types.NamespacedName{Namespace: "team-a", Name: "db"}
	mark := func(cluster string, target types.NamespacedName, dest string, gvr schema.GroupVersionResource, scope string) StreamID {
		id := StreamID{Cluster: cluster, Target: target, Destination: dest, GVR: gvr, Namespace: scope}
		require.NoError(t, s.MarkKnown(ctx, id, nil))
		return id
	}
	widgets := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	oldA := mark("local", web, "main:apps", configMaps, "demo")
	oldB := mark("local", web, "main:apps", widgets, "")
	longer := mark("local", web, "main:apps:2", configMaps, "demo")
	glob := mark("local", web, "main:a*", configMaps, "demo")
	other := mark("local", db, "main:apps", configMaps, "demo")
	remote := mark("remote-1", web, "main:apps", configMaps, "demo")
	// A folder named like a target must not make that target's cursors match.
	lookalike := mark("local", db, "main:team-a/web", configMaps, "demo")

	known := func(id StreamID) bool {
		c, err := s.Load(ctx, id)
		require.NoError(t, err)
		return c.Known
	}
	n, err := s.DropDestination(ctx, "local", web, "main:apps")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.False(t, known(oldA))
	require.False(t, known(oldB))
	for _, id := range []StreamID{longer, glob, other, remote, lookalike} {
		require.True(t, known(id), "%s was dropped", s.key(id))
	}

	n, err = s.DropTarget(ctx, web)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for _, id := range []StreamID{longer, glob, remote} {
		require.False(t, known(id), "%s was kept", s.key(id))
	}
	require.True(t, known(other))
	require.True(t, known(lookalike))
}

// TestReplayHandsTheStateOverAgain: Replay gives a subscribed target its whole state again from
// its cursor as it is now (objects it holds in their version come Unchanged, the others
// Resumed, then the sweep), on every stream of the target and only the target's; another
// target of the same informer is handed nothing.
func TestReplayHandsTheStateOverAgain(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("pushed", "1", map[string]any{"a": "1"}), configMap("unpushed", "2", map[string]any{"b": "1"}))
	cursors := &fakeCursors{cursors: map[StreamID]Cursor{}}
	m, changes := startCluster(t, client, RegistryOptions{Cursors: cursors})
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	other := types.NamespacedName{Namespace: "demo", Name: "other"}
	m.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo"}})
	collectUntilSweep(t, changes)
	m.Set("demo/other", "", []StreamSpec{{Target: other, GVR: configMaps, Namespace: "demo"}})
	collectUntilSweep(t, changes)
	require.Zero(t, m.Replay(types.NamespacedName{Namespace: "demo", Name: "nobody"}))

	// One object was pushed since.
	cursors.mu.Lock()
	cursors.cursors[StreamID{Cluster: "local", Target: target, GVR: configMaps, Namespace: "demo"}] = Cursor{Known: true,
		Objects: map[string]CursorEntry{"demo/pushed": {UID: "uid-pushed", ResourceVersion: "1"}}}
	cursors.mu.Unlock()
	require.Equal(t, 1, m.Replay(target))
	got, sweep := collectUntilSweep(t, changes)
	require.Len(t, got, 2)
	for _, c := range got {
		require.Equal(t, target, c.Target)
	}
	require.True(t, got["pushed"].Snapshot && got["pushed"].Unchanged)
	require.True(t, got["unpushed"].Snapshot && got["unpushed"].Resumed && !got["unpushed"].Unchanged)
	require.Equal(t, target, sweep.Target)
	require.Equal(t, map[string]bool{"demo/pushed": true, "demo/unpushed": true}, sweep.Keep)
	select {
	case c := <-changes:
		t.Fatalf("nothing else is handed over: %+v", c)
	default:
	}
}

// TestReplayHandsOverExcludedObjectsIfMissing: an object whose newest write is by an excluded
// field manager, while the folder holds an older version (the cursor's), is handed over again
// as Unchanged and IfMissing: the writer restores its file if the branch lost it and otherwise
// leaves the older version. One the folder never held leaves nothing to hand over.
func TestReplayHandsOverExcludedObjectsIfMissing(t *testing.T) {
	byArgo := func(name, rv string) *unstructured.Unstructured {
		u := configMap(name, rv, map[string]any{"a": rv})
		u.SetManagedFields([]metav1.ManagedFieldsEntry{entry("kubectl", 1, ""), entry("argocd-controller", 5, "")})
		return u
	}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"}, byArgo("synced", "2"), byArgo("created", "3"))
	cursors := &fakeCursors{cursors: map[StreamID]Cursor{}}
	m, changes := startCluster(t, client, RegistryOptions{Cursors: cursors})
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	cursors.cursors[StreamID{Cluster: "local", Target: target, GVR: configMaps, Namespace: "demo"}] = Cursor{Known: true,
		Objects: map[string]CursorEntry{"demo/synced": {UID: "uid-synced", ResourceVersion: "1"}}}
	m.Set("demo/rule", "", []StreamSpec{{Target: target, GVR: configMaps, Namespace: "demo", ExcludeFieldManagers: []string{"argocd-controller"}}})
	check := func() {
		t.Helper()
		got, sweep := collectUntilSweep(t, changes)
		require.Len(t, got, 1, "the object the folder never held is not handed over: %v", got)
		c := got["synced"]
		require.True(t, c.Snapshot && c.Unchanged && c.IfMissing && !c.Resumed, "%+v", c)
		require.Equal(t, "2", c.ResourceVersion)
		require.JSONEq(t, `{"a":"2"}`, string(c.Manifest), "the current form, for a branch that lost the file")
		require.Equal(t, map[string]bool{"demo/synced": true, "demo/created": true}, sweep.Keep)
	}
	check() // at the start, from the cursor
	require.Equal(t, 1, m.Replay(target))
	check() // and again at a replay
}

// A live event the handler delivers after the initial list's objects but before the initial
// state is finished (finishInitialLocked runs from another goroutine) is handed over before the
// sweep, so the sweep keeps its file: the rolling-restart e2e once saw a ConfigMap created in
// that window committed, then removed by the sweep.
func TestSweepKeepsAnObjectCreatedBeforeTheInitialStateEnds(t *testing.T) {
	var got []Change
	s := &sharedInformer{cluster: "local", key: informerKey{gvr: configMaps, namespace: "demo"},
		emit: func(c Change) { got = append(got, c) }, subs: map[types.NamespacedName]*subscription{},
		versions: map[types.UID]string{}, held: map[types.UID]string{}}
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	sub := &subscription{target: target, seen: map[types.UID][32]byte{}, listed: map[string]bool{}, cursor: Cursor{Known: true}}
	s.subs[target] = sub

	s.onUpsert(&compactObject{Name: "listed", Namespace: "demo", UID: "u1", ResourceVersion: "5"}, nil, OpCreate, true)
	s.onUpsert(&compactObject{Name: "new", Namespace: "demo", UID: "u2", ResourceVersion: "7"}, nil, OpCreate, false)
	s.mu.Lock()
	s.finishInitialLocked(sub)
	s.mu.Unlock()

	require.Len(t, got, 3)
	require.Equal(t, "new", got[1].Name)
	sweep := got[2]
	require.Equal(t, OpSweep, sweep.Op)
	require.True(t, sweep.Keep["demo/listed"])
	require.True(t, sweep.Keep["demo/new"], "the sweep removes the file of an object created before it")
}
