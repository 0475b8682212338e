package watch

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// A stream's changes leave its replica in memory until they are pushed: joined with their
// audit facts, then committed and pushed by the branch's worker. The resume cursor advances only
// after the push, so a replica that dies (SIGKILL, OOM, a node lost) takes the changes it held
// with it; its successor finds each object's current state and commits that, so the versions in
// between, and their authors, would be gone.
//
// So each stream's owner also keeps a trail in the cursor: every trailInterval while events
// flow, the resourceVersion up to which it had handed the stream every event, with the time.
// A successor starts a watch from the position its predecessor had reached a lookback before
// its last recorded one (a change is pushed well within that), and replays the events since,
// skipping each one the cursor shows pushed, before it hands over the current state. The
// apiserver serves such a watch from its watch cache, which keeps at least 75 s of events
// (k8s.io/apiserver's eventFreshDuration) and often much more; an older start is refused
// (410 Gone), and a shorter lookback is tried.

// TrailPoint says that by unix millisecond At, the stream had been handed every event up to
// resourceVersion RV.
type TrailPoint struct {
	At int64
	RV uint64
}

// MarshalJSON writes a point as [at, rv].
func (p TrailPoint) MarshalJSON() ([]byte, error) { return json.Marshal([2]uint64{uint64(p.At), p.RV}) }

// UnmarshalJSON reads [at, rv].
func (p *TrailPoint) UnmarshalJSON(b []byte) error {
	var v [2]uint64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	p.At, p.RV = int64(v[0]), v[1]
	return nil
}

const (
	// trailInterval is how often a stream's position is recorded while events flow.
	trailInterval = 2 * time.Second
	// trailRetention is how much of the trail is kept (plus the newest point before it).
	trailRetention = 4 * time.Minute
	// replayIdle ends a replay when the watch delivered nothing for that long: the watch cache
	// sends the history it holds at once.
	replayIdle = 2 * time.Second
	// replayTimeout bounds one replay watch.
	replayTimeout = time.Minute
	// replayMaxEvents bounds the events one replay holds, and the live events a stream holds
	// back while it replays; beyond it the stream resumes without replay.
	replayMaxEvents = 100_000
)

// replayLookbacks are how far before a trail's newest point a replay starts, tried in turn while
// the apiserver answers that the start is too old: the longest covers a change that waited
// for its audit fact for the apiserver's whole retry schedule (attribution.DefaultResumeGrace,
// 130 s) and its push; the shortest one a change whose fact came at once.
var replayLookbacks = []time.Duration{150 * time.Second, 45 * time.Second}

// trailAdd appends p to trail and drops the points older than trailRetention before it, but
// the newest of those.
func trailAdd(trail []TrailPoint, p TrailPoint) []TrailPoint {
	trail = append(trail, p)
	cut := p.At - trailRetention.Milliseconds()
	i := 0
	for i+1 < len(trail) && trail[i+1].At <= cut {
		i++
	}
	return trail[i:]
}

// replayStart is the position a replay with lookback starts from: the newest point at least
// lookback older than the trail's newest; without one, the oldest point (the stream was handed
// its initial state then). ok is false on an empty trail.
func replayStart(trail []TrailPoint, lookback time.Duration) (rv uint64, ok bool) {
	if len(trail) == 0 {
		return 0, false
	}
	cut := trail[len(trail)-1].At - lookback.Milliseconds()
	rv = trail[0].RV
	for _, p := range trail {
		if p.At > cut {
			break
		}
		rv = p.RV
	}
	return rv, true
}

// parseRV reads a resourceVersion as the number etcd's revisions are; ok is false for anything
// else (then nothing is compared, and no replay is tried).
func parseRV(rv string) (uint64, bool) {
	n, err := strconv.ParseUint(rv, 10, 64)
	return n, err == nil
}

// replayEvent is one event of a replay, compacted like the informer's.
type replayEvent struct {
	typ watch.EventType
	obj *compactObject
	rv  uint64
}

// errReplayExpired: the apiserver no longer holds the events since the start.
var errReplayExpired = errors.New("the apiserver no longer holds the events since the replay's start")

// replayEvents watches the informer's resource from resourceVersion from and returns its events
// up to resourceVersion until, in order, but those pushed reports as pushed already (they are
// not held: a replay reads up to a lookback of events, and holds only what was unpushed).
func (s *sharedInformer) replayEvents(ctx context.Context, from, until uint64, pushed func(*compactObject, uint64) bool) ([]replayEvent, int, error) {
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	var events []replayEvent
	read := 0
	w, err := s.client.Resource(s.key.gvr).Namespace(s.key.namespace).Watch(ctx, metav1.ListOptions{
		ResourceVersion: strconv.FormatUint(from, 10),
	})
	if err != nil {
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return nil, read, errReplayExpired
		}
		return nil, read, err
	}
	defer w.Stop()
	w = watch.Filter(w, s.compactor.compactEvent)
	idle := time.NewTimer(replayIdle)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, read, fmt.Errorf("replay from %d: %w", from, ctx.Err())
		case <-idle.C:
			return events, read, nil // nothing more since from
		case e, ok := <-w.ResultChan():
			if !ok {
				return nil, read, fmt.Errorf("replay from %d: the watch closed early", from)
			}
			switch e.Type {
			case watch.Error:
				err := apierrors.FromObject(e.Object)
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					return nil, read, errReplayExpired
				}
				return nil, read, fmt.Errorf("replay from %d: %w", from, err)
			case watch.Bookmark:
				continue
			}
			o, isObj := e.Object.(*compactObject)
			if !isObj {
				continue
			}
			rv, ok := parseRV(o.GetResourceVersion())
			if !ok {
				return nil, read, fmt.Errorf("replay from %d: resourceVersion %q is not a number", from, o.GetResourceVersion())
			}
			if rv > until {
				return events, read, nil
			}
			read++
			if !pushed(o, rv) {
				if len(events) == replayMaxEvents {
					return nil, read, fmt.Errorf("replay from %d: more than %d events not pushed", from, replayMaxEvents)
				}
				events = append(events, replayEvent{typ: e.Type, obj: o, rv: rv})
			}
			if rv == until {
				return events, read, nil
			}
			idle.Reset(replayIdle)
		}
	}
}

// pendingEvent is a live event held back from a stream while it replays.
type pendingEvent struct {
	obj, old *compactObject
	op       Op
	// base and held are the delete's versions (onDelete).
	base, held string
}

// resumeWithReplay runs in its own goroutine for a subscription whose cursor has a trail: once
// the informer holds the resource's state, it replays the events since the trail's start and
// hands sub its initial state after them. Live events meanwhile wait in sub.pending.
func (s *sharedInformer) resumeWithReplay(ctx context.Context, sub *subscription) {
	if !cache.WaitForCacheSync(ctx.Done(), s.registration.HasSynced) {
		return
	}
	// The replay ends at the newest version the handler has seen, an event of this resource
	// the watch delivers too; the live events after it wait in sub.pending.
	s.mu.Lock()
	until := s.handled
	s.mu.Unlock()

	// The cursor shows what was pushed; nothing writes sub.cursor while sub replays.
	pushed := func(u *compactObject, rv uint64) bool {
		ce, ok := sub.cursor.Objects[objectField(u.GetNamespace(), u.GetName())]
		if !ok || ce.UID != string(u.GetUID()) {
			return false
		}
		n, ok := parseRV(ce.ResourceVersion)
		return ok && rv <= n
	}
	var events []replayEvent
	read := 0
	result, err := ReplayNone, error(nil)
	for _, lb := range replayLookbacks {
		from, ok := replayStart(sub.trail, lb)
		if !ok {
			break
		}
		if from >= until {
			result = ReplayDone // nothing happened since
			break
		}
		var n int
		events, n, err = s.replayEvents(ctx, from, until, pushed)
		read += n
		if err == nil {
			result = ReplayDone
			break
		}
		if !errors.Is(err, errReplayExpired) {
			result = ReplayFailed
			break
		}
		result = ReplayExpired
	}
	if ctx.Err() != nil {
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[sub.target] != sub {
		return // unsubscribed, or subscribed again, meanwhile
	}
	if sub.overflowed {
		result = ReplayFailed
		err = fmt.Errorf("more than %d live events held back during the replay", replayMaxEvents)
	}
	if result != ReplayDone {
		s.log.Warn("replay impossible; the stream resumes from the current state: versions its previous owner held unpushed are collapsed into it",
			"target", sub.target.String(), "result", result, "err", err)
		events = nil
	}
	s.metrics.replayed(s.cluster, s.key.gvr, result, read, len(events))
	s.handOverAfterReplayLocked(sub, events, until, result == ReplayDone)
}

// The results of a replay (kubescribe_watch_replays_total).
const (
	ReplayDone    = "replayed" // the events since the start were replayed (maybe none)
	ReplayExpired = "expired"  // the apiserver no longer held them for any lookback
	ReplayFailed  = "failed"   // the watch failed, or too many events
	ReplayNone    = "no_trail" // the cursor had no trail
)

// handOverAfterReplayLocked hands sub the replayed events the cursor does not show pushed, then
// the informer's state for every object not changed since until, then the live events held
// back, and finishes its initial state.
func (s *sharedInformer) handOverAfterReplayLocked(sub *subscription, events []replayEvent, until uint64, replayed bool) {
	handed := map[types.UID]uint64{} // the newest version handed over, by object
	last := map[types.UID]string{}   // the version before, for the next change's base
	held := map[types.UID]string{}   // the version before a deletionTimestamp appeared
	inStore := map[types.UID]bool{}
	for _, obj := range s.informer.GetStore().List() {
		if u, ok := obj.(*compactObject); ok {
			inStore[u.GetUID()] = true
		}
	}
	for _, e := range events {
		u := e.obj
		uid := u.GetUID()
		field := objectField(u.GetNamespace(), u.GetName())
		ce, named := sub.cursor.Objects[field]
		inCursor := named && ce.UID == string(uid)
		if named && !inCursor && e.typ == watch.Deleted {
			// The cursor holds another object of this name: one created after this delete
			// and pushed, so the branch's file is that object's; or one before it, whose own
			// delete comes earlier in the replay. Either way this delete is not the file's.
			continue
		}
		if !inCursor && !inStore[uid] && e.typ != watch.Deleted {
			// Neither in the cursor nor alive: its delete was pushed, or it lived and died in
			// the replayed span; its versions are not written again. Its delete is (below): the
			// lost owner may have pushed it without recording it (killed during the push), and
			// the branch may hold its file, which then goes with an attributed delete rather than
			// with the sweep; where the branch has no file, the delete changes nothing.
			continue
		}
		if inCursor {
			if pushed, ok := parseRV(ce.ResourceVersion); !ok || e.rv <= pushed {
				continue
			}
			if _, ok := last[uid]; !ok {
				last[uid] = ce.ResourceVersion
			}
		}
		handed[uid] = e.rv
		if e.typ == watch.Deleted {
			s.deleteOneLocked(sub, u, last[uid], held[uid], true) // its file goes with it, not with the sweep
			continue
		}
		op := OpUpdate
		if e.typ == watch.Added {
			op = OpCreate
		}
		if terminating(u) {
			if _, ok := held[uid]; !ok {
				held[uid] = last[uid]
			}
		}
		base := last[uid]
		last[uid] = u.GetResourceVersion()
		s.upsertRenderedLocked(sub, u, op, base, true)
	}
	// The current state of every object the replay did not reach past.
	for _, obj := range s.informer.GetStore().List() {
		u, ok := obj.(*compactObject)
		if !ok {
			continue
		}
		if replayed {
			if rv, ok := parseRV(u.GetResourceVersion()); ok && rv > until {
				// Changed since until: the live events held back bring it, in order.
				sub.listed[objectField(u.GetNamespace(), u.GetName())] = true
				continue
			}
		}
		manifest, err := manifestOf(u)
		if err != nil {
			s.log.Error("cannot render the declared form; object skipped", "name", u.GetName(), "err", err)
			continue
		}
		if rv, ok := parseRV(u.GetResourceVersion()); ok && rv > handed[u.GetUID()] {
			handed[u.GetUID()] = rv
		}
		s.initialLocked(sub, u, manifest, sha256.Sum256(manifest))
	}
	// The live events held back, but those the replay or the state covered.
	pending := sub.pending
	sub.pending, sub.replaying = nil, false
	for _, p := range pending {
		rv, _ := parseRV(p.obj.GetResourceVersion())
		if (replayed && rv <= until) || rv <= handed[p.obj.GetUID()] {
			continue // the replay or the state handed over covers it
		}
		if p.op == OpDelete {
			s.deleteOneLocked(sub, p.obj, p.base, p.held, false)
			continue
		}
		base := ""
		if p.old != nil {
			base = p.old.GetResourceVersion()
		}
		s.upsertRenderedLocked(sub, p.obj, p.op, base, false)
	}
	s.finishInitialLocked(sub)
}
