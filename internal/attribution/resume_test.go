package attribution

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// doubt is a deliveryDoubt answering doubtful for the routes listed.
type doubt map[string]bool

func (d doubt) Doubtful(route string, _ time.Time) bool { return d[route] }

// waitingFor waits until n changes wait the resume grace.
func waitingFor(t *testing.T, j *Joiner, n float64) {
	t.Helper()
	require.Eventually(t, func() bool { return testutil.ToFloat64(j.metrics.resumeGauge) == n }, 5*time.Second, time.Millisecond,
		"changes waiting the resume grace")
}

// TestJoinLiveChangeWaitsWhileItsBatchMayBeRetried: a live change whose audit batch may have
// failed (the route's deliveries are doubtful) waits past its grace window for the apiserver's
// retry; on a route whose deliveries are fine it is unresolved after the grace window.
func TestJoinLiveChangeWaitsWhileItsBatchMayBeRetried(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoinerWith(t, JoinerOptions{Facts: facts, Grace: time.Millisecond, ResumeGrace: time.Hour,
		Deliveries: doubt{"local": true}})
	live := change("u1", "10", watch.OpUpdate)
	live.Observed = time.Now()
	j.Join(live, func(ac AttributedChange) { out <- ac })
	remote := change("u2", "11", watch.OpUpdate)
	remote.Cluster, remote.Observed = "remote", time.Now()
	j.Join(remote, func(ac AttributedChange) { out <- ac })

	ac := <-out
	require.Equal(t, "u2", ac.UID, "a change of a route delivering fine ends after its grace window")
	require.Equal(t, UnresolvedUsername, ac.Author.Username)
	waitingFor(t, j, 1)
	// The apiserver's retry arrives.
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "update", User: audit.Identity{Username: "bob"}, AuditID: "a1"}, false)
	ac = <-out
	require.Equal(t, "bob", ac.Author.Username)
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.resumeWaits.WithLabelValues(resumeDelivery, "resolved")))
}

// flakyFacts fails lookups until healed, then answers from facts.
type flakyFacts struct {
	*fakeFacts
	mu     sync.Mutex
	broken bool
}

func (f *flakyFacts) Lookup(ctx context.Context, route, uid, rv string, isDelete bool) (*audit.Fact, error) {
	f.mu.Lock()
	broken := f.broken
	f.mu.Unlock()
	if broken {
		return nil, errors.New("redis: connection refused")
	}
	return f.fakeFacts.Lookup(ctx, route, uid, rv, isDelete)
}

// TestJoinFailedLookupWaitsTheResumeGrace: a change whose lookups failed (Redis away) during its
// grace window goes on waiting: the audit batch kubescribe answered 503 meanwhile is retried.
func TestJoinFailedLookupWaitsTheResumeGrace(t *testing.T) {
	facts := &flakyFacts{fakeFacts: newFakeFacts(), broken: true}
	j, out := startJoinerWith(t, JoinerOptions{Facts: facts, Grace: time.Millisecond, ResumeGrace: time.Hour})
	j.Join(change("u1", "10", watch.OpCreate), func(ac AttributedChange) { out <- ac })
	waitingFor(t, j, 1)
	facts.mu.Lock()
	facts.broken = false
	facts.mu.Unlock()
	facts.add(audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "create", User: audit.Identity{Username: "alice"}, AuditID: "a1"}, false)
	require.Equal(t, "alice", (<-out).Author.Username)
}

// clockAt is a waitClock whose every change began to wait at since.
type clockAt struct {
	since time.Time
	mu    sync.Mutex
	asked []string
}

func (c *clockAt) WaitingSince(_ context.Context, route, uid, rv string, isDelete bool, _ time.Time, _ time.Duration) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, route+"/"+uid+"/"+rv)
	return c.since, nil
}

// TestJoinResumedWaitGoesOnAfterARestart: the resume grace counts from when the change first
// began to wait, as recorded by an earlier process: a change whose wait began long ago ends
// after the grace window.
func TestJoinResumedWaitGoesOnAfterARestart(t *testing.T) {
	clock := &clockAt{since: time.Now().Add(-2 * time.Hour)}
	j, out := startJoinerWith(t, JoinerOptions{Facts: newFakeFacts(), Grace: 10 * time.Millisecond, ResumeGrace: time.Hour, WaitClock: clock})
	c := change("u1", "10", watch.OpUpdate)
	c.Snapshot, c.Resumed = true, true
	j.Join(c, func(ac AttributedChange) { out <- ac })
	ac := <-out
	require.Equal(t, UnresolvedUsername, ac.Author.Username, "its resume grace was over before this start")
	require.Equal(t, []string{"local/u1/10"}, clock.asked)
}

// TestJoinAbandonLeavesLongWaitsForTheNextStart: at shutdown, a change waiting the resume grace
// is not emitted (its cursor does not cover it; the next start finds it again), while a change
// in its grace window still ends as usual.
func TestJoinAbandonLeavesLongWaitsForTheNextStart(t *testing.T) {
	facts := newFakeFacts()
	j, out := startJoinerWith(t, JoinerOptions{Facts: facts, Grace: 200 * time.Millisecond, ResumeGrace: time.Hour})
	resumed := change("u1", "10", watch.OpUpdate)
	resumed.Snapshot, resumed.Resumed = true, true
	j.Join(resumed, func(ac AttributedChange) { out <- ac })
	j.Join(change("u2", "20", watch.OpUpdate), func(ac AttributedChange) { out <- ac })
	waitingFor(t, j, 1)
	j.Abandon()
	require.NoError(t, j.Wait(context.Background()))
	require.Len(t, out, 1)
	require.Equal(t, "u2", (<-out).UID)
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.resumeWaits.WithLabelValues(resumeResumed, "abandoned")))
	require.Zero(t, testutil.ToFloat64(j.metrics.pending))
}

// TestJoinResumedOnAdmissionIsUnresolved: on a cluster whose authors come from admission
// candidates alone, a change made while nothing watched has no candidate to wait for (the
// webhook call was lost, and no base version was seen): unresolved at once, never a snapshot.
func TestJoinResumedOnAdmissionIsUnresolved(t *testing.T) {
	j, out := startJoinerWith(t, JoinerOptions{Facts: newFakeFacts(), Candidates: &fakeCandidates{}, Source: SourceAdmission,
		Grace: time.Hour, ResumeGrace: time.Hour})
	c := change("u1", "10", watch.OpCreate)
	c.Snapshot, c.Resumed = true, true
	j.Join(c, func(ac AttributedChange) { out <- ac })
	ac := <-out
	require.False(t, ac.Snapshot)
	require.Equal(t, UnresolvedUsername, ac.Author.Username)
}

// TestJoinReplayedOnAdmissionWaitsTheGraceOnly: on a cluster whose authors come from admission
// candidates alone, an event a resumed stream replayed waits the grace window, not the resume
// grace: its candidate was stored before the write was admitted, so it is there or never comes.
func TestJoinReplayedOnAdmissionWaitsTheGraceOnly(t *testing.T) {
	j, out := startJoinerWith(t, JoinerOptions{Facts: newFakeFacts(), Candidates: &fakeCandidates{}, Source: SourceAdmission,
		Grace: 20 * time.Millisecond, ResumeGrace: time.Hour})
	c := change("u1", "10", watch.OpCreate)
	c.Replayed = true
	j.Join(c, func(ac AttributedChange) { out <- ac })
	ac := <-out
	require.False(t, ac.Snapshot)
	require.Equal(t, UnresolvedUsername, ac.Author.Username)
	require.Zero(t, testutil.ToFloat64(j.metrics.resumeWaits.WithLabelValues(resumeReplayed, "unresolved")), "no resume wait")
}

// TestStoreWaitingSinceKeepsTheFirstStart: the first process to wait for a change records when;
// a later one reads that time back, for writes and deletes apart.
func TestStoreWaitingSinceKeepsTheFirstStart(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute)
	t0 := time.UnixMilli(time.Now().Add(-time.Minute).UnixMilli())
	got, err := s.WaitingSince(ctx, "local", "u1", "10", false, t0, time.Minute)
	require.NoError(t, err)
	require.Equal(t, t0, got)
	got, err = s.WaitingSince(ctx, "local", "u1", "10", false, t0.Add(30*time.Second), time.Minute)
	require.NoError(t, err)
	require.True(t, t0.Equal(got), "a restart goes on from the first start: got %s", got)
	got, err = s.WaitingSince(ctx, "local", "u1", "10", true, t0.Add(30*time.Second), time.Minute)
	require.NoError(t, err)
	require.True(t, t0.Add(30*time.Second).Equal(got), "the delete of the object is another change")
	ttl, err := rdb.PTTL(ctx, "test:ks:wait:local:u1:rv:10").Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Duration(0))
}
