package watch

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

func TestTrailKeepsRetentionAndOnePointBefore(t *testing.T) {
	var trail []TrailPoint
	step := trailInterval.Milliseconds()
	n := int(trailRetention/trailInterval) + 20
	for i := range n {
		trail = trailAdd(trail, TrailPoint{At: int64(i) * step, RV: uint64(100 + i)})
	}
	newest := trail[len(trail)-1]
	if newest.RV != uint64(100+n-1) {
		t.Fatalf("newest point %v", newest)
	}
	cut := newest.At - trailRetention.Milliseconds()
	if trail[0].At > cut {
		t.Fatalf("oldest point %v is inside the retention (cut %d): the point before it was dropped", trail[0], cut)
	}
	if len(trail) > 1 && trail[1].At <= cut {
		t.Fatalf("points before the retention kept: %v, %v", trail[0], trail[1])
	}
	if max := int(trailRetention/trailInterval) + 2; len(trail) > max {
		t.Fatalf("%d points kept, want at most %d", len(trail), max)
	}

	b, err := json.Marshal(trail[:2])
	if err != nil {
		t.Fatal(err)
	}
	var back []TrailPoint
	if err := json.Unmarshal(b, &back); err != nil || back[0] != trail[0] || back[1] != trail[1] {
		t.Fatalf("round trip of %s: %v, %v", b, back, err)
	}
}

func TestReplayStart(t *testing.T) {
	if _, ok := replayStart(nil, time.Minute); ok {
		t.Fatal("a replay start from an empty trail")
	}
	s := int64(1000)
	trail := []TrailPoint{{At: 0, RV: 10}, {At: 100 * s, RV: 20}, {At: 200 * s, RV: 30}, {At: 300 * s, RV: 40}}
	for _, c := range []struct {
		lookback time.Duration
		want     uint64
	}{
		{0, 40},                 // the newest point itself
		{50 * time.Second, 30},  // the newest point at least 50s before the newest
		{100 * time.Second, 30}, // exactly 100s before
		{150 * time.Second, 20}, // 150s: the point at 100s
		{10 * time.Minute, 10},  // older than the trail: its oldest point
		{299 * time.Second, 10}, // just after the oldest point
		{300 * time.Second, 10}, // the oldest point itself
		{301 * time.Second, 10}, // before the trail: its oldest point
		{1 * time.Millisecond, 30},
	} {
		if got, _ := replayStart(trail, c.lookback); got != c.want {
			t.Errorf("lookback %s: start %d, want %d", c.lookback, got, c.want)
		}
	}
}

// The hand-over after a replay: the replayed events the cursor does not show pushed come first,
// in order and marked Replayed (of an object neither in the cursor nor alive, only its delete),
// then the state of objects the replay covered is recognised by the dedup, then the live events
// held back beyond the replay's end, then the sweep; an object the replay deleted is not
// deleted a second time.
func TestHandOverAfterReplay(t *testing.T) {
	var got []Change
	s := handOverInformer(func(c Change) { got = append(got, c) })
	obj := func(name, rv string) *compactObject {
		return &compactObject{Name: name, Namespace: "demo", UID: types.UID("uid-" + name), ResourceVersion: rv, manifest: name + "@" + rv}
	}
	store := s.informer.GetStore()
	require.NoError(t, store.Add(obj("x", "7")))
	require.NoError(t, store.Add(obj("y", "8")))
	require.NoError(t, store.Add(obj("late", "13"))) // changed after the replay's end

	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	sub := &subscription{target: target, seen: map[types.UID][32]byte{}, listed: map[string]bool{}, replaying: true,
		cursor: Cursor{Known: true, Objects: map[string]CursorEntry{
			"demo/x":    {UID: "uid-x", ResourceVersion: "5"},
			"demo/w":    {UID: "uid-w", ResourceVersion: "4"},
			"demo/late": {UID: "uid-late", ResourceVersion: "3"},
		}}}
	s.subs[target] = sub
	sub.hold(pendingEvent{obj: obj("x", "7"), old: obj("x", "6"), op: OpUpdate}) // covered by the replay
	sub.hold(pendingEvent{obj: obj("late", "13"), old: obj("late", "3"), op: OpUpdate})
	sub.hold(pendingEvent{obj: obj("x", "12"), old: obj("x", "7"), op: OpUpdate})

	events := []replayEvent{
		{typ: watch.Modified, obj: obj("x", "5"), rv: 5}, // pushed
		{typ: watch.Modified, obj: obj("x", "6"), rv: 6},
		{typ: watch.Modified, obj: obj("x", "7"), rv: 7},
		{typ: watch.Added, obj: obj("y", "8"), rv: 8},
		{typ: watch.Added, obj: obj("z", "9"), rv: 9}, // neither in the cursor nor alive: only its delete
		{typ: watch.Deleted, obj: obj("z", "10"), rv: 10},
		{typ: watch.Deleted, obj: obj("w", "11"), rv: 11},
	}
	s.mu.Lock()
	s.handOverAfterReplayLocked(sub, events, 11, true)
	s.mu.Unlock()

	var seq []string
	for _, c := range got {
		seq = append(seq, fmt.Sprintf("%s %s@%s replayed=%v", c.Op, c.Name, c.ResourceVersion, c.Replayed))
	}
	require.Equal(t, []string{
		"update x@6 replayed=true",
		"update x@7 replayed=true",
		"create y@8 replayed=true",
		"delete z@10 replayed=true",
		"delete w@11 replayed=true",
		"update late@13 replayed=false",
		"update x@12 replayed=false",
		"sweep @ replayed=false",
	}, seq)
	require.Equal(t, "5", got[0].BaseResourceVersion, "the first replayed version's base is the pushed one")
	require.Equal(t, "6", got[1].BaseResourceVersion)
	sweep := got[len(got)-1]
	for _, k := range []string{"demo/x", "demo/y", "demo/late", "demo/w", "demo/z"} { // w's and z's files go with their deletes
		require.True(t, sweep.Keep[k], k)
	}
	require.False(t, sub.replaying)
	require.True(t, sub.synced)
}

// A stream subscribed with a trail (a start, a takeover) replays; a rebuild of a stream this
// process feeds (replay: the branch started over, a foreign edit) does not, since the events
// since its trail were handed over by this very process and may still be on their way.
func TestOnlyASubscriptionReplays(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"})
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	trail := []TrailPoint{{At: 1, RV: 5}}
	cursors := &fakeCursors{cursors: map[StreamID]Cursor{
		{Cluster: "local", Target: target, GVR: configMaps, Namespace: "demo"}: {Known: true, Trail: trail},
	}}
	s := newSharedInformer(client, "local", informerKey{gvr: configMaps, namespace: "demo"},
		RegistryOptions{Emit: func(Change) {}, Cursors: cursors}, nil, slog.New(slog.DiscardHandler))
	defer s.cancel() // never run: the replay waits for a sync that does not come

	s.setSubscriptions(map[types.NamespacedName]subscriptionSpec{target: {}})
	s.mu.Lock()
	replaying := s.subs[target].replaying
	s.mu.Unlock()
	require.True(t, replaying, "a subscription with a trail replays first")

	s.mu.Lock()
	s.subs[target].replaying = false // as if its hand-over was done
	s.mu.Unlock()
	require.True(t, s.replay(target, false))
	s.mu.Lock()
	replaying = s.subs[target].replaying
	s.mu.Unlock()
	require.False(t, replaying, "a rebuild replays")

	// A writer that takes its branch back after it was superseded (Registry.Resume) replays
	// the events since the trail, as an heir's new subscription does.
	require.True(t, s.replay(target, true))
	s.mu.Lock()
	replaying = s.subs[target].replaying
	s.mu.Unlock()
	require.True(t, replaying, "a resumed subscription replays first")
}

// A name deleted and created again within the replayed span: the cursor holds the new object,
// pushed. The old object's replayed delete is not the file's: it must not remove the new
// object's file (which the state handed over after would then restore, by the committer).
func TestReplayedDeleteOfAnEarlierObjectKeepsTheNewOnesFile(t *testing.T) {
	var got []Change
	s := handOverInformer(func(c Change) { got = append(got, c) })
	obj := func(uid, rv string) *compactObject {
		return &compactObject{Name: "a", Namespace: "demo", UID: types.UID(uid), ResourceVersion: rv, manifest: uid + "@" + rv}
	}
	require.NoError(t, s.informer.GetStore().Add(obj("uid-new", "7")))
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	sub := &subscription{target: target, seen: map[types.UID][32]byte{}, listed: map[string]bool{}, replaying: true,
		cursor: Cursor{Known: true, Objects: map[string]CursorEntry{"demo/a": {UID: "uid-new", ResourceVersion: "7"}}}}
	s.subs[target] = sub
	events := []replayEvent{
		{typ: watch.Added, obj: obj("uid-old", "5"), rv: 5},
		{typ: watch.Deleted, obj: obj("uid-old", "6"), rv: 6},
		{typ: watch.Added, obj: obj("uid-new", "7"), rv: 7}, // pushed
	}
	s.mu.Lock()
	s.handOverAfterReplayLocked(sub, events, 7, true)
	s.mu.Unlock()
	for _, c := range got {
		require.NotEqual(t, OpDelete, c.Op, "the old object's delete removed the new one's file: %+v", c)
		if c.Op != OpSweep {
			require.True(t, c.Unchanged, "the new object is as pushed: %+v", c)
		}
	}
}

// handOverInformer is an informer of ConfigMaps in namespace demo that is never run: a test
// fills its store and hands a subscription over (handOverAfterReplayLocked); emit gets the
// changes.
func handOverInformer(emit func(Change)) *sharedInformer {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"})
	s := &sharedInformer{cluster: "local", key: informerKey{gvr: configMaps, namespace: "demo"},
		emit: emit, subs: map[types.NamespacedName]*subscription{},
		versions: map[types.UID]string{}, held: map[types.UID]string{}, compactor: &compactor{}}
	s.informer = newCompactInformer(client, configMaps, "demo", s.compactor)
	return s
}

// A stream's cursor is marked known with the position its initial state was handed at, so a
// successor replays from there even if this process dies before its first tick records one.
func TestAStreamsInitialStateStartsItsRecordedTrail(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"},
		configMap("a", "4", map[string]any{"a": "1"}))
	cursors := &fakeCursors{}
	streamDemoConfigMaps(t, client, RegistryOptions{Cursors: cursors}, nil)

	require.Eventually(t, func() bool { return len(cursors.markedIDs()) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, demoStream, cursors.markedIDs()[0])
	trail := cursors.trail(demoStream) // written with the mark, not by a later tick
	require.Len(t, trail, 1, "the cursor is marked known with its first position")
	require.Equal(t, uint64(4), trail[0].RV, "the trail starts where the initial state was handed")
}

// A stream synced on an informer that listed nothing has no trail point until its first
// event; that event records the point just before it, and has it recorded at once rather than
// at the next tick, so a successor's replay covers the stream's first events too.
func TestAStreamsFirstEventStartsItsTrail(t *testing.T) {
	s := &sharedInformer{subs: map[types.NamespacedName]*subscription{}, trailsDue: make(chan struct{}, 1)}
	synced := &subscription{synced: true}
	listing := &subscription{}
	s.subs[types.NamespacedName{Name: "synced"}] = synced
	s.subs[types.NamespacedName{Name: "listing"}] = listing
	obj := func(rv string) *compactObject { return &compactObject{Name: "x", ResourceVersion: rv} }

	s.advanceLocked(obj("41"))
	require.Len(t, synced.trail, 1)
	require.Equal(t, uint64(40), synced.trail[0].RV, "handed every event before the first")
	require.True(t, synced.trailDirty)
	require.Len(t, s.trailsDue, 1, "the first point is recorded at once")
	require.Empty(t, listing.trail, "a stream not synced yet records nothing")

	<-s.trailsDue
	s.advanceLocked(obj("45"))
	require.Len(t, synced.trail, 1, "later points come from the ticks (recordTrails)")
	require.Empty(t, s.trailsDue)
	require.Equal(t, uint64(45), s.handled)

	// Through a real informer: an empty namespace's first ConfigMap starts the trail.
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"})
	cursors := &fakeCursors{}
	changes, _ := streamDemoConfigMaps(t, client, RegistryOptions{Cursors: cursors}, nil)
	id := demoStream
	require.Eventually(t, func() bool { return len(cursors.markedIDs()) == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Empty(t, cursors.trail(id), "nothing handled yet: no position")
	_, err := client.Resource(configMaps).Namespace("demo").Create(context.Background(), configMap("b", "9", map[string]any{"b": "1"}), metav1.CreateOptions{})
	require.NoError(t, err)
	nextChange(t, changes)
	require.Eventually(t, func() bool { return len(cursors.trail(id)) > 0 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, uint64(8), cursors.trail(id)[0].RV)
}

// A trail the store did not write (Redis failed, or the cursor was not marked known yet) stays
// due: the next attempt writes it whole, its oldest point included.
func TestATrailNotRecordedStaysDue(t *testing.T) {
	target := types.NamespacedName{Namespace: "demo", Name: "t"}
	id := StreamID{Cluster: "local", Target: target, GVR: configMaps, Namespace: "demo"}
	cursors := &fakeCursors{cursors: map[StreamID]Cursor{}}
	s := &sharedInformer{cluster: "local", key: informerKey{gvr: configMaps, namespace: "demo"}, cursors: cursors,
		subs: map[types.NamespacedName]*subscription{}, trailsDue: make(chan struct{}, 1), log: slog.New(slog.DiscardHandler)}
	sub := &subscription{target: target, synced: true}
	s.subs[target] = sub
	s.mu.Lock()
	s.advanceLocked(&compactObject{Name: "x", ResourceVersion: "41"})
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.recordTrails(ctx)

	require.Eventually(t, func() bool { return cursors.saveCalls() == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return sub.trailDirty
	}, 5*time.Second, 10*time.Millisecond, "an unwritten trail is due again")
	require.Empty(t, cursors.trail(id))

	require.NoError(t, cursors.MarkKnown(ctx, id, nil))
	s.mu.Lock()
	s.recordTrailsSoonLocked()
	s.mu.Unlock()
	require.Eventually(t, func() bool { return len(cursors.trail(id)) > 0 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, uint64(40), cursors.trail(id)[0].RV, "the first point is written with the trail")
}
