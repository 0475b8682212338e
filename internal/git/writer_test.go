package git

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func TestCommitEpochReadsItsSlotsTrailerOnly(t *testing.T) {
	const slot = "team-a/git"
	for msg, want := range map[string]int64{
		"update configmaps demo/a\n\nupdate core/configmaps demo/a resourceVersion=7\n\nKubescribe-User: alice\nKubescribe-Writer: team-a/git 12\n": 12,
		"x\n\nKubescribe-Writer: team-b/git 40\nKubescribe-Writer: team-a/git 3\n":                                                                  3,
		"x\n\nKubescribe-Writer: team-b/git 40\n":                                                                                                   0,
		"Snapshot of 3 objects\n\nKubescribe-Attribution: snapshot\nKubescribe-Cluster: prod\n":                                                     0,
		"Kubescribe-Writer: team-a/git 9\n\nsomeone's text after it\n":                                                                              0,
		"x\n\nKubescribe-Writer: team-a/git -3\n":                                                                                                   0,
		"x\n\nKubescribe-Writer: team-a/git many\n":                                                                                                 0,
		"x\n\nKubescribe-Writer: 9\n":                                                                                                               0,
		"":                                                                                                                                          0,
	} {
		require.Equal(t, want, commitEpoch(msg, slot), "%q", msg)
	}
	require.Equal(t, "", writerTrailer(slot, 0))
	require.Equal(t, "", writerTrailer("", 3))
	require.Equal(t, int64(4), commitEpoch("m\n\nKubescribe-User: a\n"+writerTrailer(slot, 4), slot))
}

// epochWorker starts a worker on url with writer epoch epoch, a commit window of window, and a
// record of its OnSuperseded calls.
func epochWorker(t *testing.T, url string, epoch int64, window time.Duration) (*testWorker, *atomic.Int64) {
	return slotWorker(t, url, "team-a/git", epoch, window)
}

// slotWorker is epochWorker for the writer slot slot.
func slotWorker(t *testing.T, url, slot string, epoch int64, window time.Duration) (*testWorker, *atomic.Int64) {
	t.Helper()
	opts := testOptions(url)
	opts.CommitWindow = window
	opts.WriterSlot = slot
	opts.WriterEpoch = func(context.Context) (int64, error) { return epoch, nil }
	var newer atomic.Int64
	opts.OnSuperseded = func(n int64) { newer.Store(n) }
	return startWorker(t, opts), &newer
}

// A writer that lost the branch to a newer one (a paused replica whose branch moved to
// another while it slept) finds the newer writer's commit when its push is refused: it gives
// the branch up and pushes nothing, so its stale state never lands over the newer one, and no
// change is committed twice.
func TestAStaleWriterGivesTheBranchUpToANewerOne(t *testing.T) {
	gitDir, url := newBareRemote(t)
	old, newer := epochWorker(t, url, 1, 10*time.Millisecond)
	old.Submit("team", by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101)))
	old.waitPushed(t)

	next, _ := epochWorker(t, url, 2, 10*time.Millisecond)
	next.Submit("team", by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 103)))
	next.waitPushed(t)

	// The stale writer still holds an older view of the object and commits it.
	old.Submit("team", by("alice", "a2", version(cmChange(watch.OpUpdate, "demo", "app", "1b"), 102)))
	require.Eventually(t, old.Superseded, 20*time.Second, 10*time.Millisecond)
	// OnSuperseded is called after the worker marked itself superseded.
	require.Eventually(t, func() bool { return newer.Load() == 2 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, old.stop(t), "a superseded worker returns without error")

	require.Equal(t, []string{"bob team-a/git 2", "alice team-a/git 1"}, gitLog(t, gitDir, "main", "%an %(trailers:key=Kubescribe-Writer,valueonly,separator=)"))
	require.Contains(t, gitShow(t, gitDir, "main", "team/demo/core/configmaps/app.yaml"), "key: 2")
	require.Zero(t, old.Status().Pending)

	// Later changes are dropped quietly: the owner of the branch observes them itself.
	old.Submit("team", by("alice", "a3", cmChange(watch.OpUpdate, "demo", "app", "3")))
	require.NotContains(t, old.logs.String(), "it is dropped")
}

// A newer writer that finds an older writer's commit on the branch (the old owner's last
// push, made while the new one started) builds on it, as on anyone's commit.
func TestANewerWriterBuildsOnAnOlderOnesCommits(t *testing.T) {
	gitDir, url := newBareRemote(t)
	next, newer := epochWorker(t, url, 2, 300*time.Millisecond)
	next.Submit("team", by("bob", "b1", cmChange(watch.OpCreate, "demo", "db", "2")))

	old, _ := epochWorker(t, url, 1, 10*time.Millisecond)
	old.Submit("team", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "1")))
	old.waitPushed(t)

	next.waitPushed(t)
	require.Zero(t, newer.Load())
	require.False(t, next.Superseded())
	require.Equal(t, []string{"bob team-a/git 2", "alice team-a/git 1"}, gitLog(t, gitDir, "main", "%an %(trailers:key=Kubescribe-Writer,valueonly,separator=)"))
	require.ElementsMatch(t, []string{"team/demo/core/configmaps/app.yaml", "team/demo/core/configmaps/db.yaml"}, gitFiles(t, gitDir, "main"))
}

// Two GitProviders naming one repository write one branch through two writer slots: however
// their epochs compare, neither gives the branch up to the other.
func TestWritersOfTwoSlotsShareABranch(t *testing.T) {
	gitDir, url := newBareRemote(t)
	a, aLost := slotWorker(t, url, "team-a/git", 9, 10*time.Millisecond)
	b, bLost := slotWorker(t, url, "team-b/git", 1, 10*time.Millisecond)
	for i, name := range []string{"one", "two", "three"} {
		a.Submit("team-a", by("alice", "a"+name, cmChange(watch.OpCreate, "demo", name, "1")))
		a.waitPushed(t)
		b.Submit("team-b", by("bob", "b"+name, cmChange(watch.OpCreate, "demo", name, "1")))
		b.waitPushed(t)
		require.Len(t, gitLog(t, gitDir, "main", "%H"), 2*(i+1))
	}
	require.False(t, a.Superseded())
	require.False(t, b.Superseded())
	require.Zero(t, aLost.Load()+bLost.Load())
}

// A writer whose first clone finds a newer writer's commit at the tip gives up before it
// commits anything.
func TestAWriterThatClonesANewerWritersBranchGivesUp(t *testing.T) {
	gitDir, url := newBareRemote(t)
	next, _ := epochWorker(t, url, 5, 10*time.Millisecond)
	next.Submit("team", by("bob", "b1", cmChange(watch.OpCreate, "demo", "db", "2")))
	next.waitPushed(t)

	old, newer := epochWorker(t, url, 4, 10*time.Millisecond)
	old.Submit("team", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "1")))
	require.Eventually(t, old.Superseded, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return newer.Load() == 5 }, 20*time.Second, 10*time.Millisecond)
	require.Len(t, gitLog(t, gitDir, "main", "%H"), 1)
}

// A counter that lags the branch (Redis lost it, and a new worker took epoch 1 where epoch 7
// pushed) cannot tell epoch 7 from a forgery: it was never handed out by the counter Redis now
// holds. The new worker is not superseded by it; it writes on, on top of epoch 7's commits,
// whose changes it does not commit again (carried.go). Correctness does not rest on epochs.
func TestAWorkerBelowAnEpochItsCounterNeverIssuedWritesOn(t *testing.T) {
	gitDir, url := newBareRemote(t)
	before, _ := epochWorker(t, url, 7, 10*time.Millisecond)
	db := by("bob", "b1", version(cmChange(watch.OpCreate, "demo", "db", "1"), 101))
	before.Submit("team", db)
	before.waitPushed(t)

	epochs := &counterEpochs{} // the counter Redis lost
	metrics := NewMetrics(prometheus.NewRegistry())
	r := startRouter(t, RouterOptions{Epochs: epochs, SupersededHold: time.Hour, Metrics: metrics})
	dest := Destination{Remote: testRemote(url), Branch: "main", Path: "team"}
	require.NoError(t, r.Route(tenants, dest))
	r.Deliver(db)
	r.Deliver(by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 102)))
	require.Eventually(t, func() bool { return r.TargetStatus(tenants).LastCommit != "" }, 20*time.Second, 10*time.Millisecond)
	require.True(t, r.Routed(tenants))
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.epochsForged))
	require.Zero(t, testutil.ToFloat64(metrics.supersedes))
	require.Equal(t, []string{"alice team-a/git 1", "bob team-a/git 7"}, gitLog(t, gitDir, "main", "%an %(trailers:key=Kubescribe-Writer,valueonly,separator=)"))
}

// WriterEpochs.Reached raises the counter to a higher epoch and never lowers it.
func TestWriterEpochsReached(t *testing.T) {
	ctx := context.Background()
	e := NewWriterEpochs(redistest.Start(t), keyspace.MustParse("test:"))
	p := types.NamespacedName{Namespace: "team-a", Name: "git"}
	require.NoError(t, e.Reached(ctx, p, "main", 5)) // no key yet
	n, err := e.Next(ctx, p, "main")
	require.NoError(t, err)
	require.Equal(t, int64(6), n)
	require.NoError(t, e.Reached(ctx, p, "main", 3)) // lower: kept
	n, err = e.Next(ctx, p, "main")
	require.NoError(t, err)
	require.Equal(t, int64(7), n)
	n, err = e.Next(ctx, p, "other") // per branch
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// counterEpochs hands out epochs from one counter, as WriterEpochs does from Redis.
type counterEpochs struct{ n atomic.Int64 }

func (c *counterEpochs) Next(context.Context, types.NamespacedName, string) (int64, error) {
	return c.n.Add(1), nil
}

func (c *counterEpochs) Issued(_ context.Context, _ types.NamespacedName, _ string, epoch int64) (bool, error) {
	return epoch <= c.n.Load(), nil
}

func (c *counterEpochs) Reached(_ context.Context, _ types.NamespacedName, _ string, epoch int64) error {
	for {
		v := c.n.Load()
		if v >= epoch || c.n.CompareAndSwap(v, epoch) {
			return nil
		}
	}
}

// Two routers (two replicas) that both believe they own a branch: the one routed first is
// superseded by the other's first push, releases its targets (their changes are dropped
// quietly, not counted as unrouted), refuses the branch until the ownership view changes, and
// takes it back with a newer epoch then.
func TestRouterOfASupersededWriterReleasesItsTargets(t *testing.T) {
	gitDir, url := newBareRemote(t)
	epochs := &counterEpochs{}
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	a := startRouter(t, RouterOptions{Epochs: epochs, Metrics: metrics})
	b := startRouter(t, RouterOptions{Epochs: epochs})
	dest := Destination{Remote: testRemote(url), Branch: "main", Path: "team"}
	require.NoError(t, a.Route(tenants, dest))
	a.Deliver(by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101)))
	require.Eventually(t, func() bool { return a.TargetStatus(tenants).LastCommit != "" }, 20*time.Second, 10*time.Millisecond)

	require.NoError(t, b.Route(tenants, dest))
	b.Deliver(by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 103)))
	require.Eventually(t, func() bool { return b.TargetStatus(tenants).LastCommit != "" }, 20*time.Second, 10*time.Millisecond)

	a.Deliver(by("alice", "a2", version(cmChange(watch.OpUpdate, "demo", "app", "1b"), 102)))
	require.Eventually(t, func() bool { return !a.Routed(tenants) }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.supersedes))
	last := a.LastSuperseded(dest.Remote.Provider, "main")
	require.False(t, last.IsZero(), "the controller learns of the supersede")
	require.ErrorIs(t, a.Route(tenants, dest), ErrSuperseded)
	a.Deliver(by("alice", "a3", cmChange(watch.OpUpdate, "demo", "app", "3")))
	require.Equal(t, 0.0, testutil.ToFloat64(metrics.unrouted))
	require.GreaterOrEqual(t, testutil.ToFloat64(metrics.released), 1.0)
	require.Equal(t, []string{"bob team-a/git 2", "alice team-a/git 1"}, gitLog(t, gitDir, "main", "%an %(trailers:key=Kubescribe-Writer,valueonly,separator=)"))

	// Without a view change the branch is refused for SupersededHold only: if b's replica gave
	// it up meanwhile, a takes it up again.
	short := startRouter(t, RouterOptions{Epochs: &counterEpochs{}, SupersededHold: 100 * time.Millisecond})
	elsewhere := Destination{Remote: testRemote(url), Branch: "elsewhere", Path: "team"}
	short.superseded[workerKey{provider: elsewhere.Remote.Provider, branch: "elsewhere"}] = time.Now()
	require.True(t, short.Superseded(elsewhere.Remote.Provider, "elsewhere"))
	require.ErrorIs(t, short.Route(otherTgt, elsewhere), ErrSuperseded)
	require.Eventually(t, func() bool { return !short.Superseded(elsewhere.Remote.Provider, "elsewhere") }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, short.Route(otherTgt, elsewhere))
	short.Unroute(otherTgt, true)

	// The view changed and a owns the branch again: a newer epoch than b's.
	a.ClearSuperseded()
	require.Equal(t, last, a.LastSuperseded(dest.Remote.Provider, "main"), "kept: what the worker dropped is still to be handed over")
	require.NoError(t, a.Route(tenants, dest))
	a.Deliver(by("carol", "c1", version(cmChange(watch.OpUpdate, "demo", "app", "4"), 104)))
	require.Eventually(t, func() bool {
		return len(gitLog(t, gitDir, "main", "%H")) == 3
	}, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, "carol team-a/git 3", gitLog(t, gitDir, "main", "%an %(trailers:key=Kubescribe-Writer,valueonly,separator=)")[0])
}

// The attack of a pushed trailer: someone with push access pushes a commit claiming the slot's
// writer epoch MaxInt64 (and another one just above the counter). The worker does not give the
// branch up for either, the counter is never raised to them (and so never overflows), and the
// next worker takes the next epoch and writes on. An epoch above the counter is honoured only
// where Redis lost the counter, and never past maxWriterEpoch.
func TestAForgedWriterEpochSupersedesNobody(t *testing.T) {
	ctx := context.Background()
	gitDir, url := newBareRemote(t)
	epochs := NewWriterEpochs(redistest.Start(t), keyspace.MustParse("test:"))
	provider := types.NamespacedName{Namespace: "team-a", Name: "git"}
	worker := func() *testWorker {
		opts := testOptions(url)
		opts.CommitWindow = 10 * time.Millisecond
		opts.WriterSlot = "team-a/git"
		opts.WriterEpoch = func(ctx context.Context) (int64, error) { return epochs.Next(ctx, provider, "main") }
		opts.EpochIssued = func(ctx context.Context, e int64) (bool, error) { return epochs.Issued(ctx, provider, "main", e) }
		opts.OnSuperseded = func(n int64) { _ = epochs.Reached(ctx, provider, "main", n) }
		opts.Metrics = NewMetrics(prometheus.NewRegistry())
		return startWorker(t, opts)
	}
	w := worker()
	w.Submit("team", by("alice", "a1", version(cmChange(watch.OpCreate, "demo", "app", "1"), 101)))
	w.waitPushed(t)

	for _, forged := range []string{"9223372036854775807", "2"} {
		bobCommits(t, url, "main", "innocent\n\nKubescribe-Writer: team-a/git "+forged, func(dir string) {
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "elsewhere"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "elsewhere", forged), []byte("x"), 0o644))
			runGit(t, dir, "add", "elsewhere")
		})
	}
	w.Submit("team", by("bob", "b1", version(cmChange(watch.OpUpdate, "demo", "app", "2"), 102)))
	require.Eventually(t, func() bool { return len(w.pushes.commits()) == 2 }, 20*time.Second, 10*time.Millisecond, "%s", w.logs.String())
	require.False(t, w.Superseded())
	require.GreaterOrEqual(t, testutil.ToFloat64(w.opts.Metrics.epochsForged), 1.0)
	require.Contains(t, w.logs.String(), "claims a writer epoch that was never handed out")
	require.NoError(t, w.stop(t))

	// The next worker opens the branch, whose tip is w's commit, below them the forged ones.
	next := worker()
	next.Submit("team", by("carol", "c1", version(cmChange(watch.OpUpdate, "demo", "app", "3"), 103)))
	next.waitPushed(t)
	require.Equal(t, "carol team-a/git 2", gitLog(t, gitDir, "main", "%an %(trailers:key=Kubescribe-Writer,valueonly,separator=)")[0])
	require.Error(t, epochs.Reached(ctx, provider, "main", 1<<62), "never raised past maxWriterEpoch")
	n, err := epochs.Next(ctx, provider, "main")
	require.NoError(t, err)
	require.Equal(t, int64(3), n)

	ok, err := epochs.Issued(ctx, provider, "lost", 40)
	require.NoError(t, err)
	require.True(t, ok, "a counter Redis lost: the branch's epoch is honoured")
	ok, err = epochs.Issued(ctx, provider, "lost", maxWriterEpoch+1)
	require.NoError(t, err)
	require.False(t, ok)
}
