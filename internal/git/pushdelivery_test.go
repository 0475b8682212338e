package git

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// version is c at resourceVersion rv.
func version(c watch.Change, rv int) watch.Change {
	c.ResourceVersion = fmt.Sprint(rv)
	return c
}

// fromReplay is c as a resumed stream replays it (watch/replay.go).
func fromReplay(c attribution.AttributedChange) attribution.AttributedChange {
	c.Replayed = true
	return c
}

// deliveryWorker creates (without running) a worker of slot team-a/git with writer epoch epoch
// that records its pushes in d.
func deliveryWorker(t *testing.T, url string, epoch int64, d *Deliveries, m *Metrics) *testWorker {
	t.Helper()
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.WriterSlot = "team-a/git"
	opts.WriterEpoch = func(context.Context) (int64, error) { return epoch, nil }
	opts.Pushes = d
	opts.Metrics = m
	return newTestWorker(t, opts)
}

// holdPushes makes tw's pushes fail until release is called, typically once the
// returned waitCommits saw it make that many local commits: what it commits meanwhile goes in
// one push.
func holdPushes(t *testing.T, tw *testWorker) (waitCommits func(commits int), release func()) {
	var released atomic.Bool
	tw.pushFn = func(ctx context.Context) error {
		if !released.Load() {
			return errors.New("not yet")
		}
		return tw.pushOnce(ctx)
	}
	waitCommits = func(commits int) {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Count(tw.logs.String(), "msg=committed") == commits }, 20*time.Second, 10*time.Millisecond)
	}
	return waitCommits, func() { released.Store(true) }
}

// A writer killed after its push landed and before the resume cursors advanced leaves the
// branch ahead of them: its heir's streams replay the push's changes. The heir finds the push
// record naming the branch's tip and commits none of those versions again, not even the older
// version of an object whose push held two, which would otherwise be written over the newer
// one and then the newer one again. A replayed version newer than the push is committed.
func TestAnHeirCommitsNoVersionOfItsPredecessorsLastPushAgain(t *testing.T) {
	gitDir, url := newBareRemote(t)
	d := NewDeliveries(redistest.Start(t), keyspace.MustParse("test:"))

	app1 := by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101))
	app2 := by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102))
	db := by("alice", "a2", version(cmChange(watch.OpCreate, "demo", "db", "1"), 103))
	lost := deliveryWorker(t, url, 1, d, nil)
	// The three commits go in one push: the push waits until they are made.
	committed, release := holdPushes(t, lost)
	lost.start(t)
	for _, c := range []attribution.AttributedChange{app1, app2, db} {
		lost.Submit("team", c)
	}
	committed(3)
	release()
	lost.waitPushed(t)
	require.NoError(t, lost.stop(t))
	pushed := gitLog(t, gitDir, "main", "%an %s")
	require.Equal(t, []string{"alice create configmaps demo/db", "bob update configmaps demo/app", "alice create configmaps demo/app"}, pushed)

	m := NewMetrics(prometheus.NewRegistry())
	heir := deliveryWorker(t, url, 2, d, m)
	heir.start(t)
	app3 := by("carol", "c1", version(cmChange(watch.OpUpdate, "demo", "app", "3"), 104))
	for _, c := range []attribution.AttributedChange{app1, app2, db, app3} {
		heir.Submit("team", fromReplay(c))
	}
	heir.waitPushed(t)

	require.Equal(t, append([]string{"carol update configmaps demo/app"}, pushed...), gitLog(t, gitDir, "main", "%an %s"),
		"each version is committed once")
	require.Contains(t, gitShow(t, gitDir, "main", "team/demo/core/configmaps/app.yaml"), "key: 3")
	require.Equal(t, 3.0, testutil.ToFloat64(m.duplicates))
	require.Contains(t, heir.logs.String(), "the branch holds versions committed by other writers of its slot")
	// Every replayed change is reported done, so that the heir's cursors advance past them.
	var done []string
	for _, c := range heir.pushes.commits() {
		for _, ch := range c.Changes {
			done = append(done, ch.ResourceVersion)
		}
	}
	for _, c := range heir.pushes.settled() {
		done = append(done, c.ResourceVersion)
	}
	require.ElementsMatch(t, []string{"101", "102", "103", "104"}, done)
}

// A push record the branch's tip does not follow from (a writer that recorded a push the server
// never took, or another branch history) settles nothing: the replayed versions are written.
func TestAPushRecordOffTheBranchSettlesNothing(t *testing.T) {
	gitDir, url := newBareRemote(t)
	rdb := redistest.Start(t)
	d := NewDeliveries(rdb, keyspace.MustParse("test:"))
	first := deliveryWorker(t, url, 1, d, nil)
	first.Submit("team", by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101)))
	first.start(t)
	first.waitPushed(t)
	require.NoError(t, first.stop(t))
	// A push recorded and never made: its commit is not on the branch.
	never := pushDelivery{V: deliveryVersion, SHA: plumbing.ComputeHash(plumbing.CommitObject, []byte("never")).String()}
	require.NoError(t, d.record(context.Background(), "team-a/git", "main", 1, never))

	m := NewMetrics(prometheus.NewRegistry())
	heir := deliveryWorker(t, url, 2, d, m)
	heir.start(t)
	heir.Submit("team", fromReplay(by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102))))
	heir.waitPushed(t)
	require.Equal(t, []string{"bob update configmaps demo/app", "alice create configmaps demo/app"}, gitLog(t, gitDir, "main", "%an %s"))
	require.Zero(t, testutil.ToFloat64(m.duplicates))
}

// A record that is no JSON record (written by something else, cut short) is ignored with a
// warning, as one of another version is: the branch opens, and replayed versions are written.
func TestAnUnreadablePushRecordIsIgnored(t *testing.T) {
	gitDir, url, first := startPushed(t, "team", func(o *Options) {
		o.WriterSlot = "team-a/git"
		o.WriterEpoch = func(context.Context) (int64, error) { return 1, nil }
	}, "app")
	require.NoError(t, first.stop(t))
	rdb := redistest.Start(t)
	d := NewDeliveries(rdb, keyspace.MustParse("test:"))
	require.NoError(t, rdb.Set(context.Background(), d.key("team-a/git", "main", 1), "{not json", time.Hour).Err())

	heir := deliveryWorker(t, url, 2, d, nil)
	heir.start(t)
	heir.Submit("team", fromReplay(by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102))))
	heir.waitPushed(t)
	require.Equal(t, []string{"bob update configmaps demo/app", "alice create configmaps demo/app"}, gitLog(t, gitDir, "main", "%an %s"))
	require.Contains(t, heir.logs.String(), "ignoring a push record that is no JSON record")
}

// The record is read with the branch: while Redis does not answer, the clone fails with its
// reason and is retried, rather than replaying without knowing what the branch holds.
func TestTheBranchIsNotOpenedWithoutItsPushRecord(t *testing.T) {
	_, url, first := startPushed(t, "team", func(o *Options) {
		o.WriterSlot = "team-a/git"
		o.WriterEpoch = func(context.Context) (int64, error) { return 1, nil }
	}, "app")
	require.NoError(t, first.stop(t))
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	w := deliveryWorker(t, url, 1, NewDeliveries(rdb, keyspace.MustParse("test:")), nil)
	w.start(t)
	w.Submit("team", by("alice", "a2", cmChange(watch.OpCreate, "demo", "db", "1")))
	require.Eventually(t, func() bool {
		for _, err := range w.failures() {
			if strings.Contains(err.Error(), "read the last push") {
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond)
	require.NotZero(t, w.Status().Pending, "nothing is pushed without the record")
}

// What the branch holds stops a change of the same version (unless it only restores a file
// the branch lost) and of every older one, in that folder and cluster only.
func TestWhatTheBranchHoldsStopsOlderVersions(t *testing.T) {
	app := func(rv int) attribution.AttributedChange {
		return by("alice", "a", version(cmChange(watch.OpUpdate, "demo", "app", "x"), rv))
	}
	held := onBranch{{"team", pushedObject(app(0))}: {rv: 9}}
	require.True(t, held.holds("team", app(9)))
	require.True(t, held.holds("/team/", app(5)))
	require.False(t, held.holds("team", app(10)))
	require.False(t, held.holds("other", app(4)))
	restore := app(9)
	restore.Unchanged = true
	require.False(t, held.holds("team", restore), "a file the branch lost is restored at its own version")
	restore.ResourceVersion = "8"
	require.True(t, held.holds("team", restore))
	elsewhere := app(1)
	elsewhere.Cluster = "other-cluster"
	require.False(t, held.holds("team", elsewhere))

	// A delete found from a resume cursor names the version the branch holds alive: it is news.
	del := by("alice", "a", version(cmChange(watch.OpDelete, "demo", "app", ""), 9))
	require.False(t, held.holds("team", del))
	del.ResourceVersion = "8"
	require.True(t, held.holds("team", del), "older than what the branch holds: the name was taken again")
	gone := onBranch{{"team", pushedObject(app(0))}: {rv: 9, deleted: true}}
	del.ResourceVersion = "9"
	require.True(t, gone.holds("team", del))
	require.True(t, gone.holds("team", app(8)), "older than the delete the branch holds")
	require.False(t, gone.holds("team", app(10)), "created again")

	// A sweep keeps an object only when the branch holds a version newer than it saw.
	require.True(t, held.alive("team", app(0), "8"))
	require.False(t, held.alive("team", app(0), "9"))
	require.False(t, held.alive("team", app(0), ""), "a sweep that does not say what it saw keeps nothing")
	require.False(t, gone.alive("team", app(0), "1"))
}

// A commit says what it carries: its change lines, with the folder and cluster of its trailers;
// only a commit of the worker's own slot is read, and one naming no folder carries nothing.
func TestACommitSaysWhatItCarries(t *testing.T) {
	msg := "2 changes by alice\n\n" +
		"update core/configmaps demo/app resourceVersion=7 uid=u-1\n" +
		"update core/configmaps demo/app resourceVersion=9 uid=u-1\n" +
		"create apps/deployments demo/web resourceVersion=8\n" +
		"delete core/namespaces team-x resourceVersion=11 uid=u-3\n" +
		"delete core/configmaps demo/swept resourceVersion=\n\n" +
		"Kubescribe-User: alice\nKubescribe-Cluster: prod\nKubescribe-Folder: /team\nKubescribe-Writer: team-a/git 4\n"
	cr, ok := carriedBy(&object.Commit{Message: msg}, "team-a/git")
	require.True(t, ok)
	require.Equal(t, "team", cr.folder)
	require.Equal(t, map[string]heldVersion{
		"prod\x00/configmaps\x00demo/app":      {rv: 9},
		"prod\x00apps/deployments\x00demo/web": {rv: 8},
		"prod\x00/namespaces\x00/team-x":       {rv: 11, deleted: true},
	}, cr.versions)
	_, ok = carriedBy(&object.Commit{Message: msg}, "team-b/git")
	require.False(t, ok, "another slot's commit")
	_, ok = carriedBy(&object.Commit{Message: strings.Replace(msg, "Kubescribe-Folder: /team\n", "", 1)}, "team-a/git")
	require.False(t, ok, "a commit that names no folder")
	cr, ok = carriedBy(&object.Commit{Message: strings.Replace(msg, "Kubescribe-Folder: /team", "Kubescribe-Folder: /", 1)}, "team-a/git")
	require.True(t, ok)
	require.Empty(t, cr.folder, "the repository's root")
}

// The writer a branch went to and came back from (a paused replica's heir, or the paused one)
// may push while a newer writer holds replayed changes unpushed. The newer writer's push fails
// (refused); it fetches, finds the other writer's push record at the tip, and rebuilds its plans
// without the replayed versions that push delivered: alice's create is not written back over
// bob's update.
func TestARebuildLeavesOutWhatAnotherWritersLastPushDelivered(t *testing.T) {
	gitDir, url, d := branchOfCarol(t)

	app1 := by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101))
	app2 := by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102))
	m := NewMetrics(prometheus.NewRegistry())
	newer := deliveryWorker(t, url, 3, d, m)
	newerCommitted, releaseNewer := holdPushes(t, newer)
	newer.start(t)
	newer.Submit("team", fromReplay(app1))
	newerCommitted(1)

	older := deliveryWorker(t, url, 2, d, nil)
	olderCommitted, releaseOlder := holdPushes(t, older) // both versions go in one push
	older.start(t)
	older.Submit("team", app1)
	older.Submit("team", app2)
	olderCommitted(2)
	releaseOlder()
	older.waitPushed(t)
	require.NoError(t, older.stop(t))

	// The newer writer's push was refused meanwhile, or is now: either way it fetches.
	releaseNewer()
	require.Eventually(t, func() bool { return newer.Status().Pending == 0 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"bob update configmaps demo/app", "alice create configmaps demo/app", "carol create configmaps demo/db"},
		gitLog(t, gitDir, "main", "%an %s"), "the replayed create is not committed again")
	require.Contains(t, gitShow(t, gitDir, "main", "team/demo/core/configmaps/app.yaml"), "key: 2")
	require.Equal(t, 1.0, testutil.ToFloat64(m.duplicates))
}
