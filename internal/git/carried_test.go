package git

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// Two writers of one slot at once (the Lease has moved while the old owner was paused): the
// older writer pushes three commits, in three pushes, while the newer one holds the same live
// changes unpushed (it observes the cluster too), and someone else edits a file of another
// folder in between. When the newer writer's push is refused, it reads what every commit
// between its base and the new tip carries, not only the last push's: it commits none of those
// versions again, nor the older version of an object, and asks for no replay of its folder,
// since only kubescribe's own slot wrote there.
func TestAWriterCommitsNothingAnotherWriterOfItsSlotCommitted(t *testing.T) {
	gitDir, url, d := branchOfCarol(t)

	app1 := by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101))
	app2 := by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102))
	web := by("alice", "a2", version(cmChange(watch.OpCreate, "demo", "web", "1"), 103))
	m := NewMetrics(prometheus.NewRegistry())
	newer := deliveryWorker(t, url, 3, d, m)
	newerCommitted, releaseNewer := holdPushes(t, newer)
	newer.start(t)
	for _, c := range []attribution.AttributedChange{app1, app2, web} {
		newer.Submit("team", c)
	}
	newerCommitted(3) // alice's window, bob's, alice's again

	older := deliveryWorker(t, url, 2, d, nil)
	older.start(t)
	for i, c := range []attribution.AttributedChange{app1, app2, web} {
		older.Submit("team", c)
		require.Eventually(t, func() bool { return len(older.pushes.commits()) == i+1 }, 20*time.Second, 10*time.Millisecond)
		if i == 0 {
			pushCommitFromClone(t, url, "main", "elsewhere/README.md", "not kubescribe's folder")
		}
	}
	require.NoError(t, older.stop(t))

	releaseNewer()
	require.Eventually(t, func() bool { return newer.Status().Pending == 0 }, 20*time.Second, 10*time.Millisecond, "%s", newer.logs.String())
	require.Equal(t, []string{"alice create configmaps demo/web", "bob update configmaps demo/app", "bob manual edit",
		"alice create configmaps demo/app", "carol create configmaps demo/db"},
		gitLog(t, gitDir, "main", "%an %s"), "each version once")
	require.Contains(t, gitShow(t, gitDir, "main", "team/demo/core/configmaps/app.yaml"), "key: 2")
	require.Equal(t, 3.0, testutil.ToFloat64(m.duplicates))
	require.Empty(t, newer.replays(), "commits of the slot are no one else's edits")
}

// A writer killed after a push of several commits, with someone else's commit pushed on top
// before its heir opens the branch: the heir reads down through that commit and the whole last
// push (its record names its base), and commits none of its versions again.
func TestAnHeirReadsTheWholeLastPushBelowSomeoneElsesCommit(t *testing.T) {
	gitDir, url, d := branchOfCarol(t)

	changes := []attribution.AttributedChange{
		by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101)),
		by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102)),
		by("alice", "a2", version(cmChange(watch.OpCreate, "demo", "web", "1"), 103)),
	}
	lost := deliveryWorker(t, url, 2, d, nil)
	committed, release := holdPushes(t, lost)
	lost.start(t)
	for _, c := range changes {
		lost.Submit("team", c)
	}
	committed(3)
	release()
	lost.waitPushed(t)
	require.NoError(t, lost.stop(t))
	pushCommitFromClone(t, url, "main", "elsewhere/README.md", "someone else's commit on top")
	pushCommitFromClone(t, url, "main", "elsewhere/NOTES.md", "and another")

	m := NewMetrics(prometheus.NewRegistry())
	heir := deliveryWorker(t, url, 3, d, m)
	heir.start(t)
	for _, c := range changes {
		heir.Submit("team", fromReplay(c))
	}
	heir.Submit("team", by("carol", "c2", version(cmChange(watch.OpUpdate, "demo", "app", "3"), 104)))
	heir.waitPushed(t)
	log := gitLog(t, gitDir, "main", "%an %s")
	require.Len(t, log, 7, "%v", log)
	require.Equal(t, "carol update configmaps demo/app", log[0])
	require.Equal(t, 3.0, testutil.ToFloat64(m.duplicates))
	require.Contains(t, gitShow(t, gitDir, "main", "team/demo/core/configmaps/app.yaml"), "key: 3")
}

// A sweep whose stream has not seen an object that another writer of the slot committed (two
// writers at once, the sweeping one's informer behind the other's: the version is newer than
// what the sweep saw) does not take its file away: its own stream reports the delete when
// there is one. Other files of objects that do not exist are swept as ever.
func TestASweepLeavesWhatAnotherWriterCommitted(t *testing.T) {
	gitDir, url := newBareRemote(t)
	d := NewDeliveries(redistest.Start(t), keyspace.MustParse("test:"))
	other := deliveryWorker(t, url, 1, d, nil)
	other.start(t)
	other.Submit("team", by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101)))
	other.waitPushed(t)
	require.NoError(t, other.stop(t))
	pushCommitFromClone(t, url, "main", "team/demo/core/configmaps/gone.yaml", string(manifest("ConfigMap", "demo", "gone", "1")))

	next := deliveryWorker(t, url, 2, d, nil)
	next.start(t)
	sweep := sweepOf("demo")
	sweep.ResourceVersion = "100" // its informer had seen up to 100: alice's create (101) is newer
	next.Submit("team", sweep)
	next.Submit("team", by("bob", "b1", version(cmChange(watch.OpCreate, "demo", "db", "1"), 102)))
	next.waitPushed(t)
	require.Equal(t, []string{"team/demo/core/configmaps/app.yaml", "team/demo/core/configmaps/db.yaml"}, gitFiles(t, gitDir, "main"))
}

// branchOfCarol makes a remote whose branch holds carol's create of demo/db (version 100),
// pushed by a writer of epoch 1 of the slot team-a/git, and returns it and the push records.
func branchOfCarol(t *testing.T) (gitDir, url string, d *Deliveries) {
	t.Helper()
	gitDir, url = newBareRemote(t)
	d = NewDeliveries(redistest.Start(t), keyspace.MustParse("test:"))
	first := deliveryWorker(t, url, 1, d, nil)
	first.Submit("team", by("carol", "c1", version(cmChange(watch.OpCreate, "demo", "db", "1"), 100)))
	first.start(t)
	first.waitPushed(t)
	require.NoError(t, first.stop(t))
	return gitDir, url, d
}
