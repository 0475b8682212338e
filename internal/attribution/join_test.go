package attribution

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// fakeFacts is an in-memory factSource.
type fakeFacts struct {
	mu       sync.Mutex
	facts    map[string]*audit.Fact
	lookups  int
	announce chan string
}

func newFakeFacts() *fakeFacts {
	return &fakeFacts{facts: map[string]*audit.Fact{}, announce: make(chan string, 16)}
}

func factKeyOf(route, uid, rv string, isDelete bool) string {
	if isDelete {
		return route + "/" + uid + "/delete"
	}
	return route + "/" + uid + "/" + rv
}

func (f *fakeFacts) add(fact audit.Fact, isDelete bool) {
	f.mu.Lock()
	f.facts[factKeyOf(fact.Route, fact.UID, fact.ResourceVersion, isDelete)] = &fact
	f.mu.Unlock()
	f.announce <- fact.Route + "/" + fact.UID
}

func (f *fakeFacts) Lookup(_ context.Context, route, uid, rv string, isDelete bool) (*audit.Fact, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	return f.facts[factKeyOf(route, uid, rv, isDelete)], nil
}

func (f *fakeFacts) Announcements(ctx context.Context) <-chan string {
	out := make(chan string)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case id := <-f.announce:
				out <- id
			}
		}
	}()
	return out
}

func change(uid, rv string, op watch.Op) watch.Change {
	return watch.Change{Cluster: "local", UID: uid, ResourceVersion: rv, Op: op, Name: uid}
}

func startJoiner(t *testing.T, facts *fakeFacts, grace time.Duration) (*Joiner, chan AttributedChange) {
	t.Helper()
	return startJoinerWith(t, JoinerOptions{Facts: facts, Grace: grace})
}

// startJoinerWith starts a Joiner with opts and metrics registered on a registry of its own.
func startJoinerWith(t *testing.T, opts JoinerOptions) (*Joiner, chan AttributedChange) {
	t.Helper()
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	j, err := NewJoiner(opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = j.Run(ctx) }()
	return j, make(chan AttributedChange, 16)
}

func TestJoinFactAlreadyStored(t *testing.T) {
	facts := newFakeFacts()
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "create", User: audit.Identity{Username: "alice"}, AuditID: "a1"}, false)
	j, out := startJoiner(t, facts, time.Hour)
	j.Join(change("u1", "10", watch.OpCreate), func(c AttributedChange) { out <- c })
	got := <-out
	require.True(t, got.Author.Resolved)
	require.Equal(t, "alice", got.Author.Username)
	require.Equal(t, "a1", got.Author.AuditID)
}

func TestJoinWokenByAnnouncement(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoiner(t, facts, time.Hour) // only an announcement can resolve it in time
	j.Join(change("u1", "11", watch.OpUpdate), func(c AttributedChange) { out <- c })
	// A fact for another resourceVersion wakes the waiter but does not resolve it.
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", User: audit.Identity{Username: "mallory"}}, false)
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "11", User: audit.Identity{Username: "bob"}}, false)
	got := <-out
	require.Equal(t, "bob", got.Author.Username)
}

func TestJoinDeleteUsesDeleteFact(t *testing.T) {
	facts := newFakeFacts()
	// The finalizer-removing patch returned the held delete's resourceVersion.
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "20", Verb: "patch", User: audit.Identity{Username: "finalizer-bot"}}, false)
	facts.add(audit.Fact{Route: "local", UID: "u1", Verb: "delete", User: audit.Identity{Username: "alice"}}, true)
	j, out := startJoiner(t, facts, time.Hour)
	j.Join(change("u1", "20", watch.OpDelete), func(c AttributedChange) { out <- c })
	require.Equal(t, "alice", (<-out).Author.Username)
}

func TestJoinUnresolvedAfterGrace(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoiner(t, facts, 50*time.Millisecond)
	j.Join(change("u1", "10", watch.OpCreate), func(c AttributedChange) { out <- c })
	got := <-out
	require.False(t, got.Author.Resolved)
	require.Equal(t, UnresolvedUsername, got.Author.Username)
	facts.mu.Lock()
	require.Equal(t, 2, facts.lookups, "one look on arrival, one at the deadline: no polling")
	facts.mu.Unlock()
}

// TestJoinSnapshotNeedsNoFact: a listed change no fact explains is the committer's snapshot
// once its second look, a grace window after the first, finds none either.
func TestJoinSnapshotNeedsNoFact(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoiner(t, facts, 20*time.Millisecond)
	c := change("u1", "10", watch.OpCreate)
	c.Snapshot = true
	j.Join(c, func(c AttributedChange) { out <- c })
	got := <-out
	require.True(t, got.Snapshot)
	require.False(t, got.Author.Resolved)
	facts.mu.Lock()
	defer facts.mu.Unlock()
	require.Equal(t, 2, facts.lookups, "one look when listed, one a grace window later: no polling")
}

// TestJoinListedChangeRacingItsFact: an object written just before its stream listed it (its
// fact still on the way) is credited to its writer by the second look, not the committer.
func TestJoinListedChangeRacingItsFact(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoiner(t, facts, 2*time.Second)
	c := change("u1", "10", watch.OpCreate)
	c.Snapshot = true
	j.Join(c, func(c AttributedChange) { out <- c })
	require.Eventually(t, func() bool { facts.mu.Lock(); defer facts.mu.Unlock(); return facts.lookups == 1 }, 5*time.Second, time.Millisecond)
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "create", User: audit.Identity{Username: "alice"}, AuditID: "a1"}, false)
	got := <-out
	require.Equal(t, "alice", got.Author.Username)
	require.False(t, got.Snapshot)
}

func TestJoinOrderPerObjectAndOthersFlow(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoiner(t, facts, time.Hour)
	emit := func(c AttributedChange) { out <- c }
	// u1's first change waits for its fact; its second change and u2's change have theirs.
	facts.mu.Lock()
	facts.facts[factKeyOf("local", "u1", "2", false)] = &audit.Fact{User: audit.Identity{Username: "bob"}}
	facts.facts[factKeyOf("local", "u2", "1", false)] = &audit.Fact{User: audit.Identity{Username: "carol"}}
	facts.mu.Unlock()
	j.Join(change("u1", "1", watch.OpCreate), emit)
	j.Join(change("u1", "2", watch.OpUpdate), emit)
	j.Join(change("u2", "1", watch.OpCreate), emit)

	// u2 is not held up by u1.
	first := <-out
	require.Equal(t, "u2", first.UID)
	select {
	case c := <-out:
		t.Fatalf("u1's second change %s was emitted before its first", c.ResourceVersion)
	case <-time.After(50 * time.Millisecond):
	}
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "1", User: audit.Identity{Username: "alice"}}, false)
	a, b := <-out, <-out
	require.Equal(t, []string{"1", "2"}, []string{a.ResourceVersion, b.ResourceVersion})
	require.Equal(t, []string{"alice", "bob"}, []string{a.Author.Username, b.Author.Username})
	require.NoError(t, j.Wait(context.Background()))
}

// TestJoinSnapshotCreditedToItsFact: a change found by a list is credited to the fact of its
// (uid, resourceVersion) when one exists, looked up once without waiting; without one it stays
// the committer's snapshot.
func TestJoinSnapshotCreditedToItsFact(t *testing.T) {
	facts := newFakeFacts()
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "create", User: audit.Identity{Username: "alice"}, AuditID: "a1"}, false)
	j, out := startJoiner(t, facts, 20*time.Millisecond)
	known := change("u1", "10", watch.OpCreate)
	known.Snapshot = true
	unknown := change("u2", "11", watch.OpCreate)
	unknown.Snapshot = true
	j.Join(known, func(ac AttributedChange) { out <- ac })
	j.Join(unknown, func(ac AttributedChange) { out <- ac })
	got := map[string]AttributedChange{}
	for range 2 {
		ac := <-out
		got[ac.UID] = ac
	}
	require.Equal(t, "alice", got["u1"].Author.Username)
	require.True(t, got["u1"].Author.Resolved)
	require.False(t, got["u1"].Snapshot, "a change a fact explains is that user's change")
	require.True(t, got["u2"].Snapshot)
	require.False(t, got["u2"].Author.Resolved)
	require.Empty(t, got["u2"].Author.Username, "no author: the writer credits the committer")
}

// TestJoinUnchangedIsNotLookedUp: a change the resume cursor shows the folder held in that
// very version is nobody's new change: it is not looked up, even though a fact of that version
// exists, and stays the committer's snapshot should the writer have to write it again.
func TestJoinUnchangedIsNotLookedUp(t *testing.T) {
	facts := newFakeFacts()
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "create", User: audit.Identity{Username: "alice"}, AuditID: "a1"}, false)
	j, out := startJoiner(t, facts, time.Hour)
	c := change("u1", "10", watch.OpUpdate)
	c.Snapshot, c.Unchanged = true, true
	j.Join(c, func(ac AttributedChange) { out <- ac })
	got := <-out
	require.True(t, got.Snapshot)
	require.False(t, got.Author.Resolved)
	facts.mu.Lock()
	defer facts.mu.Unlock()
	require.Zero(t, facts.lookups)
}

// TestJoinResumedWaitsForItsFact: a change the resume cursor shows happened while nothing
// watched waits for its fact past the grace window, for the resume grace (the apiserver may still
// be retrying the audit batch); a resumed delete is credited by the delete fact of its uid.
func TestJoinResumedWaitsForItsFact(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoinerWith(t, JoinerOptions{Facts: facts, Grace: time.Millisecond, ResumeGrace: time.Hour})
	del := change("u3", "12", watch.OpDelete)
	del.Snapshot, del.Resumed = true, true
	j.Join(del, func(ac AttributedChange) { out <- ac })
	require.Eventually(t, func() bool { return testutil.ToFloat64(j.metrics.resumeGauge) == 1 }, 5*time.Second, time.Millisecond,
		"the change must wait the resume grace, not the grace window")
	facts.add(audit.Fact{Route: "local", UID: "u3", Verb: "delete", User: audit.Identity{Username: "bob"}, AuditID: "a3"}, true)
	ac := <-out
	require.Equal(t, "bob", ac.Author.Username)
	require.False(t, ac.Snapshot)
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.resumeWaits.WithLabelValues(resumeResumed, "resolved")))
	require.Zero(t, testutil.ToFloat64(j.metrics.resumeGauge))
}

// TestJoinReplayedWaitsForItsFact: an event a resumed stream replayed (its previous owner may
// have held it unpushed, and the apiserver may have sent its audit batch to that owner, which
// is gone) waits for its fact the resume grace, not the grace window, and is a user's change.
func TestJoinReplayedWaitsForItsFact(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoinerWith(t, JoinerOptions{Facts: facts, Grace: time.Millisecond, ResumeGrace: time.Hour})
	c := change("u5", "14", watch.OpUpdate)
	c.Replayed = true
	j.Join(c, func(ac AttributedChange) { out <- ac })
	require.Eventually(t, func() bool { return testutil.ToFloat64(j.metrics.resumeGauge) == 1 }, 5*time.Second, time.Millisecond,
		"the change must wait the resume grace, not the grace window")
	facts.add(audit.Fact{Route: "local", UID: "u5", ResourceVersion: "14", Verb: "update", User: audit.Identity{Username: "carol"}, AuditID: "a5"}, false)
	ac := <-out
	require.Equal(t, "carol", ac.Author.Username)
	require.False(t, ac.Snapshot)
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.resumeWaits.WithLabelValues(resumeReplayed, "resolved")))
}

// TestJoinResumedWithoutFactIsUnresolved: a change somebody made while nothing watched that finds
// no fact within the resume grace is that unknown person's change, never the committer's
// snapshot.
func TestJoinResumedWithoutFactIsUnresolved(t *testing.T) {
	j, out := startJoinerWith(t, JoinerOptions{Facts: newFakeFacts(), Grace: time.Millisecond, ResumeGrace: 20 * time.Millisecond})
	lost := change("u4", "13", watch.OpUpdate)
	lost.Snapshot, lost.Resumed = true, true
	j.Join(lost, func(ac AttributedChange) { out <- ac })
	ac := <-out
	require.False(t, ac.Snapshot, "a person's change is never the committer's snapshot")
	require.False(t, ac.Author.Resolved)
	require.Equal(t, UnresolvedUsername, ac.Author.Username)
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.resumeWaits.WithLabelValues(resumeResumed, "unresolved")))
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.joins.WithLabelValues("unresolved")))
	require.Zero(t, testutil.ToFloat64(j.metrics.joins.WithLabelValues("snapshot")))
}

// TestJoinSweepPassesAtOnce: a sweep is handed on synchronously, before Join returns.
func TestJoinSweepPassesAtOnce(t *testing.T) {
	j, _ := startJoiner(t, newFakeFacts(), time.Hour)
	var got []AttributedChange
	j.Join(watch.Change{Cluster: "local", Op: watch.OpSweep, Keep: map[string]bool{"demo/a": true}}, func(ac AttributedChange) { got = append(got, ac) })
	require.Len(t, got, 1)
	require.Equal(t, watch.OpSweep, got[0].Op)
}

// TestJoinKeepsOrderAcrossRecreation: an object deleted and created again under its name has
// two uids; the create, whose fact is already there, must not overtake the delete still waiting
// for its own, or the writer would remove the new file.
func TestJoinKeepsOrderAcrossRecreation(t *testing.T) {
	facts := newFakeFacts()
	facts.add(audit.Fact{Route: "local", UID: "new", ResourceVersion: "20", Verb: "create", User: audit.Identity{Username: "bob"}, AuditID: "a2"}, false)
	j, out := startJoiner(t, facts, 200*time.Millisecond)
	del := change("old", "10", watch.OpDelete)
	del.Name = "cfg"
	create := change("new", "20", watch.OpCreate)
	create.Name = "cfg"
	j.Join(del, func(ac AttributedChange) { out <- ac })
	j.Join(create, func(ac AttributedChange) { out <- ac })
	require.Equal(t, watch.OpDelete, (<-out).Op)
	require.Equal(t, watch.OpCreate, (<-out).Op)
}

// TestJoinExcludesUsers: a change attributed to a user its rule excludes is dropped; an
// unresolved change never is.
func TestJoinExcludesUsers(t *testing.T) {
	facts := newFakeFacts()
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "update", User: audit.Identity{Username: "argocd"}, AuditID: "a1"}, false)
	facts.add(audit.Fact{Route: "local", UID: "u2", ResourceVersion: "11", Verb: "update", User: audit.Identity{Username: "alice"}, AuditID: "a2"}, false)
	j, out := startJoiner(t, facts, 20*time.Millisecond)
	for _, c := range []watch.Change{change("u1", "10", watch.OpUpdate), change("u2", "11", watch.OpUpdate), change("u3", "12", watch.OpUpdate)} {
		c.ExcludeUsers = []string{"argocd", unresolvedName}
		j.Join(c, func(ac AttributedChange) { out <- ac })
	}
	got := map[string]string{}
	for range 2 {
		ac := <-out
		got[ac.UID] = ac.Author.Username
	}
	require.NoError(t, j.Wait(context.Background()))
	require.Equal(t, map[string]string{"u2": "alice", "u3": UnresolvedUsername}, got)
	require.Empty(t, out, "the excluded user's change is dropped")
}

// unresolvedName is listed as excluded in the test: an unresolved change must still pass.
const unresolvedName = UnresolvedUsername

// failingFacts fails every lookup and counts them.
type failingFacts struct {
	mu    sync.Mutex
	calls int
}

func (f *failingFacts) Lookup(context.Context, string, string, string, bool) (*audit.Fact, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return nil, errors.New("redis: connection refused")
}

func (f *failingFacts) Announcements(ctx context.Context) <-chan string {
	out := make(chan string)
	go func() { <-ctx.Done(); close(out) }()
	return out
}

// TestJoinListedChangesDuringAnOutage: listed changes are resolved one after another; when a
// lookup fails, the rest of the list is not looked up (each would wait out a timeout), and all
// of them still pass as the committer's snapshot.
func TestJoinListedChangesDuringAnOutage(t *testing.T) {
	facts := &failingFacts{}
	j, err := NewJoiner(JoinerOptions{Facts: facts, Grace: time.Hour})
	require.NoError(t, err)
	out := make(chan AttributedChange, 100)
	for i := range 100 {
		c := change(fmt.Sprintf("u%d", i), "1", watch.OpCreate)
		c.Snapshot = true
		j.Join(c, func(ac AttributedChange) { out <- ac })
	}
	require.NoError(t, j.Wait(context.Background()))
	require.Len(t, out, 100)
	facts.mu.Lock()
	defer facts.mu.Unlock()
	require.Equal(t, 1, facts.calls, "after a failed lookup the rest of the list is not looked up")
}

// TestJoinInFlightPerTarget: a change counts for its target from Join until it is emitted (or
// dropped as excluded); a sweep never counts; other targets are not affected.
func TestJoinInFlightPerTarget(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoiner(t, facts, time.Hour)
	web := types.NamespacedName{Namespace: "team-a", Name: "web"}
	db := types.NamespacedName{Namespace: "team-a", Name: "db"}
	waiting := change("u1", "11", watch.OpUpdate)
	waiting.Target = web
	j.Join(waiting, func(c AttributedChange) { out <- c })
	require.Equal(t, 1, j.InFlight(web))
	require.Equal(t, 0, j.InFlight(db))
	j.Join(watch.Change{Target: web, Op: watch.OpSweep}, func(c AttributedChange) { out <- c })
	require.Equal(t, watch.OpSweep, (<-out).Op)
	require.Equal(t, 1, j.InFlight(web), "a sweep passes at once and is never in flight")

	excluded := change("u2", "5", watch.OpUpdate)
	excluded.Target, excluded.ExcludeUsers = web, []string{"bot"}
	facts.add(audit.Fact{Route: "local", UID: "u2", ResourceVersion: "5", User: audit.Identity{Username: "bot"}}, false)
	j.Join(excluded, func(c AttributedChange) { out <- c })
	require.Eventually(t, func() bool { return j.InFlight(web) == 1 }, 5*time.Second, time.Millisecond, "the excluded change left the join")

	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "11", User: audit.Identity{Username: "bob"}}, false)
	require.Equal(t, "u1", (<-out).UID)
	require.Eventually(t, func() bool { return j.InFlight(web) == 0 }, 5*time.Second, time.Millisecond)
}

func TestJoinMapsAreMadeAnewOnceABurstDrained(t *testing.T) {
	// A Go map keeps the room of its largest size: after a burst of more than shrinkAfter
	// changes, the joiner's maps are made anew once empty, and not before.
	facts := newFakeFacts()
	j, _ := startJoiner(t, facts, 2*time.Second) // the live changes all wait at once
	mapID := func() (tails, waiters uintptr) {
		j.mu.Lock()
		defer j.mu.Unlock()
		return reflect.ValueOf(j.tails).Pointer(), reflect.ValueOf(j.waiters).Pointer()
	}
	tails0, waiters0 := mapID()

	var emitted sync.WaitGroup
	const n = shrinkAfter + 100
	emitted.Add(2 * n)
	for i := range n {
		listed := change(fmt.Sprintf("s%d", i), "1", watch.OpCreate)
		listed.Snapshot = true
		j.Join(listed, func(AttributedChange) { emitted.Done() })
		live := change(fmt.Sprintf("l%d", i), "2", watch.OpUpdate) // waits out its grace
		j.Join(live, func(AttributedChange) { emitted.Done() })
	}
	emitted.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, j.Wait(ctx))

	j.mu.Lock()
	require.Empty(t, j.tails)
	require.Empty(t, j.waiters)
	require.Zero(t, j.tailsPeak)
	require.Zero(t, j.waitersPeak)
	j.mu.Unlock()
	tails1, waiters1 := mapID()
	require.NotEqual(t, tails0, tails1, "the drained tails map is made anew")
	require.NotEqual(t, waiters0, waiters1, "the drained waiters map is made anew")

	// A small load keeps its maps.
	j.Join(change("x", "3", watch.OpUpdate), func(AttributedChange) {})
	require.NoError(t, j.Wait(ctx))
	tails2, waiters2 := mapID()
	require.Equal(t, tails1, tails2)
	require.Equal(t, waiters1, waiters2)
}

// TestJoinExcludedUserKeepsListedState: what a list found is state, which an excluded author
// does not take out of the folder. A stream's first list hands it over as the committer's
// snapshot; an object whose older version the folder holds comes back as IfMissing (written
// only where the branch lost its file); an object created while nothing watched, like a live
// write, leaves nothing.
func TestJoinExcludedUserKeepsListedState(t *testing.T) {
	facts := newFakeFacts()
	for uid, rv := range map[string]string{"first": "1", "held": "2", "new": "3", "live": "4"} {
		facts.add(audit.Fact{Route: "local", UID: uid, ResourceVersion: rv, Verb: "update", User: audit.Identity{Username: "bot"}, AuditID: uid}, false)
	}
	j, out := startJoiner(t, facts, 20*time.Millisecond)
	first := change("first", "1", watch.OpCreate)
	first.Snapshot = true
	held := change("held", "2", watch.OpUpdate)
	held.Snapshot, held.Resumed = true, true
	created := change("new", "3", watch.OpCreate)
	created.Snapshot, created.Resumed = true, true
	live := change("live", "4", watch.OpUpdate)
	for _, c := range []watch.Change{first, held, created, live} {
		c.ExcludeUsers = []string{"bot"}
		j.Join(c, func(ac AttributedChange) { out <- ac })
	}
	require.NoError(t, j.Wait(context.Background()))
	got := map[string]AttributedChange{}
	for len(out) > 0 {
		ac := <-out
		got[string(ac.UID)] = ac
	}
	require.Len(t, got, 2, "%+v", got)
	require.False(t, got["first"].Author.Resolved, "the first list's state is the committer's snapshot")
	require.True(t, got["first"].Snapshot && !got["first"].Unchanged && !got["first"].IfMissing)
	require.False(t, got["held"].Author.Resolved)
	require.True(t, got["held"].Snapshot && got["held"].Unchanged && got["held"].IfMissing && !got["held"].Resumed)
}
