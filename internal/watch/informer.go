package watch

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// cursorTimeout bounds one read or write of a resume cursor.
const cursorTimeout = 5 * time.Second

// cursorSource reads and marks resume cursors; CursorStore implements it.
type cursorSource interface {
	Load(ctx context.Context, id StreamID) (Cursor, error)
	MarkKnown(ctx context.Context, id StreamID, trail []TrailPoint) error
	SaveTrails(ctx context.Context, trails map[StreamID][]TrailPoint) (missing []StreamID, err error)
}

// informerKey identifies a shared informer within a cluster.
type informerKey struct {
	gvr       schema.GroupVersionResource
	namespace string
}

// subscription is one GitTarget's view of a shared informer.
type subscription struct {
	target types.NamespacedName
	// subscriptionSpec is what the target's owners want: its destination, the operations
	// (empty: all) and the stream's write exclusions.
	subscriptionSpec
	seen map[types.UID][32]byte // uid -> hash of the last manifest emitted, for dedup
	// cursor is what the target's folder held of this stream at the last push, and listed
	// the objects the initial state held; both are dropped once synced.
	cursor Cursor
	listed map[string]bool
	// synced is set once the target was handed the whole initial state: every object that
	// differs from its cursor, the deletions the cursor reveals, and the sweep.
	synced bool

	// replaying is set while the events its previous owner may have held unpushed are
	// replayed (resumeWithReplay); the live events meanwhile wait in pending (at most
	// replayMaxEvents, else overflowed).
	replaying  bool
	pending    []pendingEvent
	overflowed bool
	// trail is the stream's recorded positions (see replay.go); trailRV its newest position.
	trail   []TrailPoint
	trailRV uint64
	// trailDirty is set when trail has a point not recorded yet.
	trailDirty bool
}

// advanceTrail adds to the trail that by unix millisecond at the stream had been handed every
// event up to rv, if that is further than its newest point.
func (s *subscription) advanceTrail(at int64, rv uint64) {
	if rv > s.trailRV {
		s.trail, s.trailRV, s.trailDirty = trailAdd(s.trail, TrailPoint{At: at, RV: rv}), rv, true
	}
}

// hold keeps a live event for after the replay.
func (s *subscription) hold(e pendingEvent) {
	if len(s.pending) >= replayMaxEvents {
		s.overflowed = true
		return
	}
	s.pending = append(s.pending, e)
}

func (s *subscription) allows(op Op) bool { return len(s.ops) == 0 || slices.Contains(s.ops, op) }

// sharedInformer is one running informer of a cluster, fanning its events out to the targets
// that subscribe to it.
type sharedInformer struct {
	cluster string
	key     informerKey
	emit    func(Change)
	// synced is told of each target whose subscription handed its whole initial state over.
	synced  func(types.NamespacedName)
	metrics *Metrics
	log     *slog.Logger

	compactor    *compactor // its arena holds the manifests of the informer's objects
	informer     cache.SharedIndexInformer
	registration cache.ResourceEventHandlerRegistration
	cursors      cursorSource // nil: no resume
	cancel       context.CancelFunc
	done         chan struct{}

	// mu serialises event fan-out with subscription changes, so a new subscriber is handed
	// the informer's state exactly once, before any later event.
	mu      sync.Mutex
	subs    map[types.NamespacedName]*subscription
	lastErr error
	// versions is the resourceVersion of each object the handler saw last, and held the
	// version each object had before its deletionTimestamp appeared: a delete event carries
	// the deletion's own version, and its Change names the versions the delete started from.
	versions map[types.UID]string
	held     map[types.UID]string
	// handled is the newest resourceVersion the handler has seen (a number, as etcd's
	// revisions are; 0 while none was).
	handled uint64
	// trailsDue asks recordTrails to record the trails now rather than at its next tick.
	trailsDue chan struct{}

	// client watches the events a replay needs; ctx ends with the informer. resumable is
	// RegistryOptions.Resumable.
	client    dynamic.Interface
	resumable func(StreamID) bool
	ctx       context.Context
	// secretDigest is RegistryOptions.SecretDigest.
	secretDigest func([]byte) [32]byte
}

func newSharedInformer(client dynamic.Interface, cluster string, key informerKey, opts RegistryOptions, synced func(types.NamespacedName), log *slog.Logger) *sharedInformer {
	s := &sharedInformer{
		cluster: cluster,
		key:     key,
		synced:  synced,

		emit:         opts.Emit,
		metrics:      opts.Metrics,
		cursors:      opts.Cursors,
		log:          log.With("resource", key.gvr.String(), "namespace", key.namespace),
		subs:         map[types.NamespacedName]*subscription{},
		done:         make(chan struct{}),
		trailsDue:    make(chan struct{}, 1),
		client:       client,
		resumable:    opts.Resumable,
		secretDigest: opts.SecretDigest,

		versions: map[types.UID]string{},
		held:     map[types.UID]string{},
	}
	// No periodic resync: a resync re-delivers unchanged objects, which the dedup would only
	// have to discard again.
	s.compactor = &compactor{render: opts.Render, gvr: key.gvr, namespace: key.namespace,
		refused: func(u *unstructured.Unstructured, reason string) {
			s.metrics.refused(cluster, key.gvr, reason)
			s.log.Error("object outside the informer's scope; refused", "reason", reason,
				"objectNamespace", u.GetNamespace(), "name", u.GetName(), "apiVersion", u.GetAPIVersion())
		}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.compactor.arena.idle = s.repackIfWasteful
	s.informer = newCompactInformer(client, key.gvr, key.namespace, s.compactor)
	_ = s.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		s.setErr(err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	s.registration, _ = s.informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) { s.onUpsert(obj, nil, OpCreate, isInInitialList) },
		UpdateFunc: func(oldObj, newObj any) {
			o, _ := oldObj.(*compactObject)
			if n, ok := newObj.(*compactObject); ok && o != nil && o.GetResourceVersion() == n.GetResourceVersion() {
				return
			}
			s.onUpsert(newObj, o, OpUpdate, false)
		},
		DeleteFunc: s.onDelete,
	})
	return s
}

func (s *sharedInformer) run(parent context.Context) {
	ctx := s.ctx
	stop := context.AfterFunc(parent, s.cancel)
	go func() {
		defer close(s.done)
		defer stop()
		s.informer.RunWithContext(ctx)
	}()
	// Once the handler has seen the initial list, the subscribers that were waiting for it get
	// the rest of their initial state.
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), s.registration.HasSynced) {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, sub := range s.subs {
			if !sub.replaying {
				s.finishInitialLocked(sub)
			}
		}
	}()
	if s.cursors != nil {
		go s.recordTrails(ctx)
	}
}

// recordTrails records, every trailInterval while events flow, each synced stream's position
// in its trail (see replay.go); and at once when a stream's first point is due (trailsDue).
func (s *sharedInformer) recordTrails(ctx context.Context) {
	t := time.NewTicker(trailInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.trailsDue:
		}
		s.mu.Lock()
		var trails map[StreamID][]TrailPoint
		subs := map[StreamID]*subscription{}
		now := time.Now().UnixMilli()
		for _, sub := range s.subs {
			if !sub.synced || sub.replaying {
				continue
			}
			sub.advanceTrail(now, s.handled)
			if !sub.trailDirty {
				continue
			}
			sub.trailDirty = false
			if trails == nil {
				trails = map[StreamID][]TrailPoint{}
			}
			id := s.streamID(sub.target, sub.destination)
			trails[id], subs[id] = slices.Clone(sub.trail), sub
		}
		s.mu.Unlock()
		if len(trails) == 0 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, cursorTimeout)
		missing, err := s.cursors.SaveTrails(wctx, trails)
		cancel()
		if err != nil {
			missing = slices.Collect(maps.Keys(trails))
		}
		if len(missing) > 0 {
			// Not recorded (Redis failed, or the cursor is not marked known yet): the whole
			// trail goes with the next attempt, its oldest point included.
			s.mu.Lock()
			for _, id := range missing {
				if sub := subs[id]; s.subs[id.Target] == sub {
					sub.trailDirty = true
				}
			}
			s.mu.Unlock()
		}
		if err != nil && !failing {
			s.log.Warn("cannot record the streams' positions; a successor may collapse versions this replica holds unpushed", "err", err)
		}
		failing = err != nil
	}
}

// recordTrailsSoonLocked has recordTrails record the trails now.
func (s *sharedInformer) recordTrailsSoonLocked() {
	select {
	case s.trailsDue <- struct{}{}:
	default:
	}
}

func (s *sharedInformer) stop() {
	s.cancel()
	<-s.done
	s.compactor.arena.stop()
}

// repackIfWasteful copies the manifests of the objects the informer holds into fresh chunks
// when its arena holds much more than them (objects were replaced or deleted since).
func (s *sharedInformer) repackIfWasteful() {
	s.mu.Lock()
	defer s.mu.Unlock()
	objs := s.informer.GetStore().List()
	ms := make([]*string, 0, len(objs))
	live := 0
	for _, obj := range objs {
		if o, ok := obj.(*compactObject); ok {
			ms = append(ms, &o.manifest)
			live += len(o.manifest)
		}
	}
	if s.compactor.arena.wasteful(live) {
		s.compactor.arena.repack(ms)
		s.metrics.repacked(s.cluster, s.key.gvr)
	}
}

func (s *sharedInformer) setErr(err error) {
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	s.log.Warn("watch failed", "err", err)
}

// setSubscriptions makes the subscribers exactly subs (target -> operations). A new
// subscriber is handed every object the informer already holds, as snapshot changes; the
// operations of an existing one change in place.
func (s *sharedInformer) setSubscriptions(subs map[types.NamespacedName]subscriptionSpec) {
	s.mu.Lock()
	var added []types.NamespacedName
	for t := range s.subs {
		if _, ok := subs[t]; !ok {
			delete(s.subs, t)
		}
	}
	for t, spec := range subs {
		if sub, ok := s.subs[t]; ok && sub.destination == spec.destination && slices.Equal(sealedFor(sub.seal), sealedFor(spec.seal)) {
			sub.subscriptionSpec = spec // the same destination: the state it was handed stays
			continue
		}
		// A new target, or one whose destination moved, or whose objects are sealed for other
		// recipients now: it gets the whole state again (a file sealed for others is
		// written again).
		delete(s.subs, t)
		added = append(added, t)
	}
	s.mu.Unlock()
	if len(added) == 0 {
		return
	}
	// Cursors are read, and the owner asked whether to replay, without holding up the
	// informer's events.
	cursors := make(map[types.NamespacedName]Cursor, len(added))
	replay := make(map[types.NamespacedName]bool, len(added))
	for _, t := range added {
		cursors[t] = s.loadCursor(t, subs[t].destination)
		replay[t] = s.resumable == nil || s.resumable(s.streamID(t, subs[t].destination))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range added {
		s.subscribeLocked(t, subs[t], cursors[t], replay[t])
	}
}

// subscribeLocked subscribes target afresh, resuming from cursor: it is handed the informer's
// whole state (primeLocked), after the events since the cursor's trail when fromTrail is set
// (resumeWithReplay). A rebuild of a stream this process feeds does not replay: the events
// since its trail were handed over by this very process, and those not pushed yet are still
// on their way to the branch.
func (s *sharedInformer) subscribeLocked(target types.NamespacedName, spec subscriptionSpec, cursor Cursor, fromTrail bool) {
	sub := &subscription{target: target, subscriptionSpec: spec, seen: map[types.UID][32]byte{}, cursor: cursor, listed: map[string]bool{},
		trail: cursor.Trail}
	s.subs[target] = sub
	if fromTrail && cursor.Known && len(cursor.Trail) > 0 && s.client != nil {
		// The previous owner may have held changes unpushed: they are replayed first.
		sub.replaying = true
		go s.resumeWithReplay(s.ctx, sub)
		return
	}
	if fromTrail {
		s.metrics.replayed(s.cluster, s.key.gvr, ReplayNone, 0, 0)
	}
	s.primeLocked(sub)
}

// replay hands target's subscription the whole state again, resuming from its cursor as a new
// subscription would, after the events since its trail when fromTrail; it reports whether
// target subscribes to this informer.
func (s *sharedInformer) replay(target types.NamespacedName, fromTrail bool) bool {
	s.mu.Lock()
	sub, ok := s.subs[target]
	var spec subscriptionSpec
	if ok {
		spec = sub.subscriptionSpec // setSubscriptions replaces it under s.mu
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	cursor := s.loadCursor(target, spec.destination)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[target] != sub {
		return true // subscribed again meanwhile: handed the whole state already
	}
	s.subscribeLocked(target, spec, cursor, fromTrail)
	return true
}

// loadCursor reads a new subscriber's resume cursor. Without one (no store, or Redis does not
// answer) the target is handed the whole state as a snapshot and its folder is swept, which
// loses nothing but the authors of changes made while nothing watched.
func (s *sharedInformer) loadCursor(target types.NamespacedName, destination string) Cursor {
	if s.cursors == nil {
		return Cursor{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cursorTimeout)
	defer cancel()
	c, err := s.cursors.Load(ctx, s.streamID(target, destination))
	if err != nil {
		s.log.Warn("resume cursor unavailable; the target gets a full snapshot", "target", target.String(), "err", err)
		return Cursor{}
	}
	return c
}

func (s *sharedInformer) streamID(target types.NamespacedName, destination string) StreamID {
	return StreamID{Cluster: s.cluster, Target: target, Destination: destination, GVR: s.key.gvr, Namespace: s.key.namespace}
}

// primeLocked hands a new subscriber the objects the informer's store holds. Events the
// handler has not delivered yet for those objects are then recognised by the dedup. Before the
// handler has seen the informer's initial list, the list's remaining objects reach the
// subscriber as they are delivered, and the run goroutine finishes its initial state.
func (s *sharedInformer) primeLocked(sub *subscription) {
	for _, obj := range s.informer.GetStore().List() {
		u, ok := obj.(*compactObject)
		if !ok {
			continue
		}
		manifest, err := manifestOf(u)
		if err != nil {
			s.log.Error("cannot render the declared form; object skipped", "name", u.GetName(), "err", err)
			continue
		}
		s.initialLocked(sub, u, manifest, sha256.Sum256(manifest))
	}
	if s.registration.HasSynced() {
		s.finishInitialLocked(sub)
	}
}

// initialLocked hands sub one object of its initial state as a snapshot change: marked
// Resumed when the cursor shows it changed (or appeared) while nothing watched, Unchanged when
// the cursor shows the folder held this very version at the last push. The cursor says what
// was pushed, not what the branch holds now, so an unchanged object is handed over too: the
// writer commits nothing for it unless its file is gone or differs.
func (s *sharedInformer) initialLocked(sub *subscription, u *compactObject, manifest []byte, sum [32]byte) {
	field := objectField(u.GetNamespace(), u.GetName())
	if sub.listed != nil {
		sub.listed[field] = true
	}
	prev, known := sub.seen[u.GetUID()]
	sub.seen[u.GetUID()] = sum
	if known && prev == sum {
		return
	}
	op := OpCreate
	e, held := sub.cursor.Objects[field]
	if held {
		op = OpUpdate // the folder holds a version of it
		if e.UID == string(u.GetUID()) && e.ResourceVersion == u.GetResourceVersion() {
			c := s.change(sub, u, op)
			c.Manifest, c.Digest, c.Snapshot = manifest, sum, true
			switch seal := sealPrint(sealedFor(sub.seal)); {
			case e.Sealed != seal:
				// Pushed in this version, but sealed for other recipients (or in the
				// clear): the committer writes it again, sealed as the target says now.
			case seal != "":
				// A new encryption of the same version would only differ: a file the
				// branch holds is left as it is, a lost one written again.
				c.Unchanged, c.IfMissing = true, true
			default:
				c.Unchanged = true
			}
			s.emitObjectLocked(sub, c)
			return
		}
	}
	if sub.cursor.Known && s.excludedLocked(sub, u) {
		// A write made while nothing watched, by an excluded field manager: not mirrored.
		delete(sub.seen, u.GetUID()) // the folder does not hold this form
		if held {
			// The folder holds an older version; should the branch have lost its file, the
			// writer writes the current form rather than leave the object out.
			c := s.change(sub, u, op)
			c.Manifest, c.Digest, c.Snapshot, c.Unchanged, c.IfMissing = manifest, sum, true, true, true
			s.emitObjectLocked(sub, c)
		}
		return
	}
	c := s.change(sub, u, op)
	c.Manifest, c.Digest, c.Snapshot, c.Resumed = manifest, sum, true, sub.cursor.Known
	s.emitObjectLocked(sub, c)
}

// emitObjectLocked hands sub a change that carries an object's declared form, sealed first
// when sub seals its objects: then neither the form nor an unkeyed digest of it leaves the
// watch. An object that cannot be sealed is not handed over (it cannot be written).
func (s *sharedInformer) emitObjectLocked(sub *subscription, c Change) {
	if sub.seal != nil {
		sealed, err := sub.seal.Seal(c.Manifest)
		s.metrics.sealed(s.cluster, s.key.gvr, err)
		if err != nil {
			s.log.Error("cannot encrypt the object; change skipped", "target", sub.target.String(),
				"objectNamespace", c.Namespace, "name", c.Name, "err", err)
			return
		}
		digest := [32]byte{}
		if s.secretDigest != nil {
			digest = s.secretDigest(c.Manifest) // keyed: it cannot be checked against guesses
		}
		c.Manifest, c.Digest, c.SealedFor = sealed, digest, sub.seal.Recipients()
	}
	s.emit(c)
}

// excludedLocked reports whether u's last write is one sub does not mirror, by its field
// manager, and counts it.
func (s *sharedInformer) excludedLocked(sub *subscription, u *compactObject) bool {
	if len(sub.excludeFieldManagers) == 0 || !newestManagersExcluded(u.managers(), sub.excludeFieldManagers) {
		return false
	}
	s.metrics.Excluded(sub.target, s.key.gvr, ReasonFieldManager)
	return true
}

// newestManagersExcluded reports whether the field managers of an object's newest write
// (ignoring status writes: compactObject.managers) all are excluded ones. Several managers at the newest time (managedFields
// times have a one-second resolution) exclude the write only when every one of them is
// excluded. An object without managedFields is never excluded.
func newestManagersExcluded(managers, excluded []string) bool {
	if len(managers) == 0 {
		return false
	}
	for _, m := range managers {
		if !slices.Contains(excluded, m) {
			return false
		}
	}
	return true
}

// finishInitialLocked completes sub's initial state once it has every listed object: the
// objects its cursor holds that no longer exist are deleted (Resumed, so their delete facts
// can name who did it), and the sweep removes the files of any other object that does not
// exist. The cursor is then marked as known, so a restart resumes from it.
func (s *sharedInformer) finishInitialLocked(sub *subscription) {
	if sub.synced {
		return
	}
	keep := sub.listed
	for field, e := range sub.cursor.Objects {
		if keep[field] {
			continue
		}
		ns, name := cursorObjectKey(field)
		keep[field] = true // its file goes with the attributed delete, not with the sweep
		s.emit(Change{
			Cluster: s.cluster, Target: sub.target, Destination: sub.destination, GVR: s.key.gvr, Scope: s.key.namespace,
			Namespace: ns, Name: name, UID: e.UID, ResourceVersion: e.ResourceVersion,
			Op: OpDelete, Observed: time.Now(), Snapshot: true, Resumed: true, ExcludeUsers: sub.excludeUsers,
		})
	}
	sweep := Change{
		Cluster: s.cluster, Target: sub.target, Destination: sub.destination, GVR: s.key.gvr, Scope: s.key.namespace,
		Namespace: s.key.namespace, Op: OpSweep, Observed: time.Now(), Keep: keep, Snapshot: true,
	}
	if s.handled > 0 {
		sweep.ResourceVersion = strconv.FormatUint(s.handled, 10) // what the sweep has seen (Change.Keep)
	}
	s.emit(sweep)
	sub.synced, sub.listed, sub.cursor = true, nil, Cursor{}
	sub.advanceTrail(time.Now().UnixMilli(), s.handled) // handed every event up to here
	if s.synced != nil {
		s.synced(sub.target)
	}
	if s.cursors != nil {
		// The cursor is marked with the trail so far: a successor's replay starts no later
		// than this stream's initial state, even if this process dies before its first tick.
		id, trail := s.streamID(sub.target, sub.destination), slices.Clone(sub.trail)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), cursorTimeout)
			defer cancel()
			if err := s.cursors.MarkKnown(ctx, id, trail); err != nil {
				s.log.Warn("cannot record the resume cursor; the next start sends a full snapshot", "target", id.Target.String(), "err", err)
			}
		}()
	}
}

// status reports whether target's subscription has its initial state, and the last watch
// error, if any since.
func (s *sharedInformer) status(target types.NamespacedName) (synced bool, err error) {
	synced = s.informer.HasSynced()
	s.mu.Lock()
	defer s.mu.Unlock()
	sub, ok := s.subs[target]
	synced = synced && ok && sub.synced
	if synced {
		s.lastErr = nil
	}
	return synced, s.lastErr
}

// advanceLocked records that the handler has seen u's version: every subscriber not replaying
// has been handed every event up to the newest such version (handled).
func (s *sharedInformer) advanceLocked(u *compactObject) {
	rv, ok := parseRV(u.GetResourceVersion())
	if !ok || rv <= s.handled {
		return
	}
	if s.handled == 0 {
		// The first object of an informer that listed none: a stream synced on it has no
		// trail point (its sync had no version to record). It has been handed every event
		// before this one: that is its first point, recorded at once, not at the next tick.
		now := time.Now().UnixMilli()
		due := false
		for _, sub := range s.subs {
			if sub.synced && !sub.replaying {
				sub.advanceTrail(now, rv-1)
				due = true
			}
		}
		if due {
			s.recordTrailsSoonLocked()
		}
	}
	s.handled = rv
}

// terminating reports whether a compact object carries a deletionTimestamp.
func terminating(u *compactObject) bool { return u.DeletionTimestamp != nil }

// trackLocked records u's version, and the version before its deletionTimestamp appeared.
func (s *sharedInformer) trackLocked(u, old *compactObject) {
	uid := u.GetUID()
	s.versions[uid] = u.GetResourceVersion()
	if old != nil && terminating(u) && !terminating(old) {
		if _, ok := s.held[uid]; !ok {
			s.held[uid] = old.GetResourceVersion()
		}
	}
}

func (s *sharedInformer) onUpsert(obj any, old *compactObject, op Op, initial bool) {
	u, ok := obj.(*compactObject)
	if !ok {
		return
	}
	s.metrics.observed(s.cluster, s.key.gvr, op)
	s.mu.Lock() // a manifest is read under mu: repackLocked moves it
	defer s.mu.Unlock()
	s.trackLocked(u, old)
	s.advanceLocked(u)
	manifest, err := manifestOf(u)
	if err != nil {
		s.log.Error("cannot render the declared form; change skipped", "name", u.GetName(), "err", err)
		return
	}
	sum := sha256.Sum256(manifest)
	base := ""
	if old != nil {
		base = old.GetResourceVersion()
	}
	for _, sub := range s.subs {
		if sub.replaying {
			// Its initial state comes after the replay; live events wait until then.
			if !initial {
				sub.hold(pendingEvent{obj: u, old: old, op: op})
			}
			continue
		}
		if initial && !sub.synced {
			s.initialLocked(sub, u, manifest, sum)
			continue
		}
		s.upsertOneLocked(sub, u, manifest, sum, op, base, false)
	}
}

// upsertRenderedLocked renders u's declared form and hands it to sub (upsertOneLocked).
func (s *sharedInformer) upsertRenderedLocked(sub *subscription, u *compactObject, op Op, base string, replayed bool) {
	manifest, err := manifestOf(u)
	if err != nil {
		s.log.Error("cannot render the declared form; change skipped", "name", u.GetName(), "err", err)
		return
	}
	s.upsertOneLocked(sub, u, manifest, sha256.Sum256(manifest), op, base, replayed)
}

// upsertOneLocked hands sub a created or updated object, unless nothing it declares changed
// or the stream excludes the write.
func (s *sharedInformer) upsertOneLocked(sub *subscription, u *compactObject, manifest []byte, sum [32]byte, op Op, base string, replayed bool) {
	if !sub.synced && sub.listed != nil {
		// An event the handler delivers between the initial list's last object and the end
		// of the initial state (finishInitialLocked, from another goroutine), or one a replay
		// hands over, comes before the sweep: the sweep must keep its file.
		sub.listed[objectField(u.GetNamespace(), u.GetName())] = true
	}
	prev, known := sub.seen[u.GetUID()]
	if known && prev == sum {
		return // only server-side or status fields changed: nothing declared changed
	}
	if s.excludedLocked(sub, u) {
		// Not mirrored, and not seeding the dedup state either: the folder does not hold
		// this form, so the next write that produces it must be mirrored.
		return
	}
	sub.seen[u.GetUID()] = sum
	if !sub.allows(op) {
		return
	}
	c := s.change(sub, u, op)
	c.Manifest, c.Digest, c.BaseResourceVersion, c.Replayed = manifest, sum, base, replayed
	s.emitObjectLocked(sub, c)
}

func (s *sharedInformer) onDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	u, ok := obj.(*compactObject)
	if !ok {
		return
	}
	s.metrics.observed(s.cluster, s.key.gvr, OpDelete)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(u)
	uid := u.GetUID()
	base, held := s.versions[uid], s.held[uid]
	delete(s.versions, uid)
	delete(s.held, uid)
	for _, sub := range s.subs {
		if sub.replaying {
			sub.hold(pendingEvent{obj: u, op: OpDelete, base: base, held: held})
			continue
		}
		s.deleteOneLocked(sub, u, base, held, false)
	}
}

// deleteOneLocked hands sub a deleted object. Before the end of its initial state, the delete
// comes before the sweep and the cursor's deletions: the object's file goes with this delete.
func (s *sharedInformer) deleteOneLocked(sub *subscription, u *compactObject, base, held string, replayed bool) {
	if !sub.synced && sub.listed != nil {
		field := objectField(u.GetNamespace(), u.GetName())
		if ce, ok := sub.cursor.Objects[field]; ok && ce.UID == string(u.GetUID()) {
			delete(sub.cursor.Objects, field) // not deleted a second time by finishInitialLocked
		}
		sub.listed[field] = true // kept by the sweep
	}
	delete(sub.seen, u.GetUID())
	if sub.allows(OpDelete) {
		c := s.change(sub, u, OpDelete)
		c.BaseResourceVersion, c.DeletionBaseResourceVersion, c.Replayed = base, held, replayed
		s.emit(c)
	}
}

// change describes an operation on u as a Change for sub's target, without a manifest.
func (s *sharedInformer) change(sub *subscription, u *compactObject, op Op) Change {
	return Change{
		ExcludeUsers:    sub.excludeUsers,
		Destination:     sub.destination,
		Cluster:         s.cluster,
		Target:          sub.target,
		GVR:             s.key.gvr,
		Scope:           s.key.namespace,
		Namespace:       u.GetNamespace(),
		Name:            u.GetName(),
		UID:             string(u.GetUID()),
		ResourceVersion: u.GetResourceVersion(),
		Op:              op,
		Observed:        time.Now(),
	}
}
