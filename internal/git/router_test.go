package git

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func testRemote(url string) Remote {
	return Remote{
		Provider:          types.NamespacedName{Namespace: "team-a", Name: "git"},
		URL:               url,
		Committer:         Signature{Name: "kubescribe", Email: "kubescribe@example.com"},
		CommitWindow:      10 * time.Millisecond,
		AuthorEmailDomain: "users.example.com",
	}
}

// startRouter starts a router with opts (its Logger discards unless set), stopped at cleanup.
func startRouter(t *testing.T, opts RouterOptions) *Router {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	r := NewRouter(opts)
	r.Start(context.Background())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
	return r
}

// TestRouterDeliversAndRecordsPushes: a routed target's change is committed into its folder and
// pushed; the push shows in the target's status and is signalled; an unrouted change is dropped.
func TestRouterDeliversAndRecordsPushes(t *testing.T) {
	dir, url := newBareRemote(t)
	r := startRouter(t, RouterOptions{})
	require.NoError(t, r.Route(tenants, Destination{Remote: testRemote(url), Branch: "main", Path: "clusters/prod"}))
	require.True(t, r.Routed(tenants))
	require.Equal(t, 1, r.WorkerCount())

	other := types.NamespacedName{Namespace: "team-a", Name: "other"}
	dropped := cmChange(watch.OpCreate, "shop", "nowhere", "x")
	dropped.Target = other
	r.Deliver(by("bob", "a0", dropped))
	r.Deliver(by("alice", "a1", cmChange(watch.OpCreate, "shop", "settings", "v1")))

	// Updates are signalled when the folder passed its check, and after the push.
	var changed []types.NamespacedName
	require.Eventually(t, func() bool {
		select {
		case <-r.Updates():
			changed = append(changed, r.Changed()...)
		default:
		}
		return r.TargetStatus(tenants).LastCommit != ""
	}, 30*time.Second, 10*time.Millisecond, "no push")
	require.Eventually(t, func() bool {
		changed = append(changed, r.Changed()...)
		return slices.Contains(changed, tenants)
	}, 30*time.Second, 10*time.Millisecond, "no update signalled after the push")
	require.NotContains(t, changed, other)
	st := r.TargetStatus(tenants)
	require.Equal(t, runGit(t, "", "--git-dir="+dir, "rev-parse", "refs/heads/main"), st.LastCommit)
	require.False(t, st.LastPush.IsZero())
	require.Equal(t, url, st.URL)
	require.Zero(t, st.Pending)
	require.Equal(t, []string{"clusters/prod/shop/core/configmaps/settings.yaml"}, gitFiles(t, dir, "main"))
	require.False(t, r.TargetStatus(other).Routed)

	// Unrouting keeps the push record; forgetting drops it, and the unused worker stops.
	r.Unroute(tenants, false)
	require.Equal(t, st.LastCommit, r.TargetStatus(tenants).LastCommit)
	require.Zero(t, r.WorkerCount())
	r.Unroute(tenants, true)
	require.Empty(t, r.TargetStatus(tenants).LastCommit)
}

// TestRouterKeepsWorkerOfRoutedTarget: unrouting one target stops only workers no route uses,
// so a worker another target was just routed to keeps running; targets of one provider branch
// share one worker, and rotated credentials and a new fetch interval are taken in place.
func TestRouterKeepsWorkerOfRoutedTarget(t *testing.T) {
	_, url := newBareRemote(t)
	r := startRouter(t, RouterOptions{})
	web := types.NamespacedName{Namespace: "team-a", Name: "web"}
	db := types.NamespacedName{Namespace: "team-a", Name: "db"}
	remote := testRemote(url)
	require.NoError(t, r.Route(web, Destination{Remote: remote, Branch: "main", Path: "web"}))
	r.Unroute(types.NamespacedName{Namespace: "team-a", Name: "unready"}, false)
	require.NoError(t, r.Route(db, Destination{Remote: remote, Branch: "main", Path: "db"}))
	w1, _ := r.RouteOf(web)
	w2, _ := r.RouteOf(db)
	require.Same(t, w1.Worker, w2.Worker)
	require.Equal(t, 1, r.WorkerCount())

	remote.Credentials = Credentials{Username: "git", Password: "rotated"}
	require.NoError(t, r.Route(web, Destination{Remote: remote, Branch: "main", Path: "web"}))
	w3, _ := r.RouteOf(db)
	require.Same(t, w1.Worker, w3.Worker, "a credentials rotation keeps the worker")
	require.Equal(t, "rotated", w3.Remote.Credentials.Password)

	remote.FetchInterval = 10 * time.Second
	require.NoError(t, r.Route(web, Destination{Remote: remote, Branch: "main", Path: "web"}))
	w5, _ := r.RouteOf(db)
	require.Same(t, w1.Worker, w5.Worker, "a new fetch interval keeps the worker")
	require.Equal(t, 10*time.Second, time.Duration(w5.Worker.fetchEvery.Load()))

	remote.CommitWindow = time.Second
	require.NoError(t, r.Route(web, Destination{Remote: remote, Branch: "main", Path: "web"}))
	w4, _ := r.RouteOf(db)
	require.NotSame(t, w1.Worker, w4.Worker, "other settings replace the worker for every target on the branch")
	require.Equal(t, 1, r.WorkerCount())
}

// TestRouterNotStarted: routing before Start fails and leaves the target unrouted.
func TestRouterNotStarted(t *testing.T) {
	r := NewRouter(RouterOptions{})
	err := r.Route(tenants, Destination{Remote: testRemote("file:///nonexistent"), Branch: "main"})
	require.ErrorContains(t, err, "not running")
	require.False(t, r.Routed(tenants))
}

// recordedCursors records what the router advances the cursors with.
type recordedCursors struct {
	mu      sync.Mutex
	changes []watch.Change
}

func (c *recordedCursors) Advance(_ context.Context, changes []watch.Change) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changes = append(c.changes, changes...)
	return nil
}

// TestRouterAdvancesCursorsAfterPush: the changes a push delivered, and only those, advance the
// resume cursors.
func TestRouterAdvancesCursorsAfterPush(t *testing.T) {
	_, url := newBareRemote(t)
	cursors := &recordedCursors{}
	r := startRouter(t, RouterOptions{Cursors: cursors})
	require.NoError(t, r.Route(tenants, Destination{Remote: testRemote(url), Branch: "main", Path: "prod"}))
	cursors.mu.Lock()
	require.Empty(t, cursors.changes, "nothing advances before a push")
	cursors.mu.Unlock()
	r.Deliver(by("alice", "a1", cmChange(watch.OpCreate, "shop", "settings", "v1")))
	require.Eventually(t, func() bool {
		cursors.mu.Lock()
		defer cursors.mu.Unlock()
		return len(cursors.changes) == 1
	}, 30*time.Second, 10*time.Millisecond)
	cursors.mu.Lock()
	require.Equal(t, "settings", cursors.changes[0].Name)
	require.Equal(t, "uid-settings", cursors.changes[0].UID)
	cursors.mu.Unlock()

	// An unchanged object of a resumed stream: its cursor already holds that very version,
	// whether its file was there (settled) or written again (pushed), so nothing is written to
	// Redis for it; the change after it is.
	for _, name := range []string{"settings", "limits"} {
		c := cmChange(watch.OpUpdate, "shop", name, "v1")
		c.Snapshot, c.Unchanged = true, true
		r.Deliver(attribution.AttributedChange{Change: c})
	}
	r.Deliver(by("alice", "a2", cmChange(watch.OpUpdate, "shop", "settings", "v2")))
	require.Eventually(t, func() bool { return r.TargetStatus(tenants).Unpushed == 0 && r.TargetStatus(tenants).LastCommit != "" }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		cursors.mu.Lock()
		defer cursors.mu.Unlock()
		return len(cursors.changes) == 2
	}, 30*time.Second, 10*time.Millisecond)
	cursors.mu.Lock()
	defer cursors.mu.Unlock()
	for _, c := range cursors.changes {
		require.False(t, c.Unchanged, "%s/%s", c.Namespace, c.Name)
	}
}

// TestRouterFollowsTheDestinationStream: the router counts a target's changes for its current
// destination until they are pushed; a change observed for a destination the target has left is
// dropped, and a push of changes the target handed over before it moved does not advance the
// cursors of the destination it left.
func TestRouterFollowsTheDestinationStream(t *testing.T) {
	dir, url := newBareRemote(t)
	cursors := &recordedCursors{}
	metrics := NewMetrics(prometheus.NewRegistry())
	r := startRouter(t, RouterOptions{Cursors: cursors, Metrics: metrics})
	remote := testRemote(url)
	remote.CommitWindow = 2 * time.Second // the move below happens inside the window
	require.NoError(t, r.Route(tenants, Destination{Remote: remote, Branch: "main", Path: "old", Stream: "main:old"}))
	// The folder check of "old" (absent: nothing to read) is done, so the change below is not
	// held by it: held changes of a folder the target leaves are dropped.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(metrics.folderChecks.WithLabelValues("known")) == 1
	}, 30*time.Second, 10*time.Millisecond)
	old := cmChange(watch.OpCreate, "shop", "settings", "v1")
	old.Destination = "main:old"
	r.Deliver(by("alice", "a1", old))
	require.Equal(t, 1, r.TargetStatus(tenants).Unpushed)

	// The target moves before the change is pushed: it still lands in the old folder (it was
	// handed over for it), but the old destination's cursor is not advanced, and the new
	// destination counts afresh.
	require.NoError(t, r.Route(tenants, Destination{Remote: remote, Branch: "main", Path: "new", Stream: "main:new", Cluster: "prod"}))
	require.Zero(t, r.TargetStatus(tenants).Unpushed)
	late := cmChange(watch.OpUpdate, "shop", "settings", "v2")
	late.Destination = "main:old"
	r.Deliver(by("alice", "a2", late)) // observed for the old destination: dropped
	require.Zero(t, r.TargetStatus(tenants).Unpushed)
	elsewhere := cmChange(watch.OpUpdate, "shop", "settings", "v3")
	elsewhere.Destination, elsewhere.Cluster = "main:new", "edge"
	r.Deliver(by("alice", "a2", elsewhere)) // observed in another source cluster: dropped
	require.Zero(t, r.TargetStatus(tenants).Unpushed)
	moved := cmChange(watch.OpCreate, "shop", "settings", "v1")
	moved.Destination = "main:new"
	r.Deliver(by("alice", "a3", moved))
	require.Equal(t, 1, r.TargetStatus(tenants).Unpushed)

	// The stream's sweep counts too, though it removes nothing: until it is through, the move
	// may still have deletions to push.
	sweep := watch.Change{Cluster: "prod", Target: tenants, GVR: configMaps, Scope: "shop", Op: watch.OpSweep,
		Keep: map[string]bool{"shop/settings": true}, Destination: "main:new", Snapshot: true}
	r.Deliver(attribution.AttributedChange{Change: sweep})
	require.Equal(t, 2, r.TargetStatus(tenants).Unpushed)

	require.Eventually(t, func() bool { return r.TargetStatus(tenants).Unpushed == 0 }, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return len(gitFiles(t, dir, "main")) == 2
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"new/shop/core/configmaps/settings.yaml", "old/shop/core/configmaps/settings.yaml"}, gitFiles(t, dir, "main"))
	require.Contains(t, runGit(t, "", "--git-dir="+dir, "show", "main:old/shop/core/configmaps/settings.yaml"), "v1")
	cursors.mu.Lock()
	defer cursors.mu.Unlock()
	require.Len(t, cursors.changes, 1, "only the new destination's change advances a cursor")
	require.Equal(t, "main:new", cursors.changes[0].Destination)
}

// routeWebAndDB routes GitTargets team-a/web and team-a/db to folders web and db of branch main
// of url: two targets sharing one worker.
func routeWebAndDB(t *testing.T, r *Router, url string) (web, db types.NamespacedName) {
	t.Helper()
	web = types.NamespacedName{Namespace: "team-a", Name: "web"}
	db = types.NamespacedName{Namespace: "team-a", Name: "db"}
	for _, tgt := range []types.NamespacedName{web, db} {
		require.NoError(t, r.Route(tgt, Destination{Remote: testRemote(url), Branch: "main", Path: tgt.Name}))
	}
	return web, db
}

// targetChange is the create of ConfigMap shop/name for target.
func targetChange(target types.NamespacedName, name string) watch.Change {
	c := cmChange(watch.OpCreate, "shop", name, "v1")
	c.Target = target
	return c
}

// TestRouterStartOverAsksEveryTargetOfTheBranch: when the worker of a branch two targets share
// starts the branch over, both targets' StartOvers grow and they are signalled; the dropped
// change no longer counts as unpushed and advances no cursor. Their streams' replay, delivered
// next, creates the branch again with both folders.
func TestRouterStartOverAsksEveryTargetOfTheBranch(t *testing.T) {
	dir, url := newBareRemote(t)
	cursors := &recordedCursors{}
	r := startRouter(t, RouterOptions{Cursors: cursors})
	web, db := routeWebAndDB(t, r, url)
	r.Deliver(by("alice", "a1", targetChange(web, "front")))
	require.Eventually(t, func() bool { return r.TargetStatus(web).LastCommit != "" }, 30*time.Second, 10*time.Millisecond)
	deleteAndCollect(t, dir)
	r.Changed()

	r.Deliver(by("bob", "b1", targetChange(db, "orders")))
	require.Eventually(t, func() bool { return r.TargetStatus(db).StartOvers == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, r.TargetStatus(web).StartOvers, "every target on the branch replays")
	require.Zero(t, r.TargetStatus(db).Unpushed, "the dropped change comes back with the replay")
	require.ErrorContains(t, r.TargetStatus(db).LastError, "started over")
	require.ElementsMatch(t, []types.NamespacedName{web, db}, r.Changed())
	cursors.mu.Lock()
	require.Len(t, cursors.changes, 1, "only the first push advanced a cursor")
	cursors.mu.Unlock()

	front := targetChange(web, "front")
	front.Snapshot, front.Unchanged = true, true
	r.Deliver(attribution.AttributedChange{Change: front})
	orders := targetChange(db, "orders")
	orders.Snapshot, orders.Resumed = true, true
	r.Deliver(by("bob", "b1", orders))
	require.Eventually(t, func() bool {
		return r.TargetStatus(db).LastError == nil && r.TargetStatus(db).Unpushed == 0 && r.TargetStatus(web).Unpushed == 0
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"db/shop/core/configmaps/orders.yaml", "web/shop/core/configmaps/front.yaml"}, gitFiles(t, dir, "main"))
}

// TestRouterForeignEditAsksOnlyTheFoldersTargets: someone else's commit edits the folder of
// one of two targets on a branch; when the worker learns of it (its next push is refused),
// only that target's ForeignEdits grows, and it is signalled.
func TestRouterForeignEditAsksOnlyTheFoldersTargets(t *testing.T) {
	_, url := newBareRemote(t)
	r := startRouter(t, RouterOptions{})
	web, db := routeWebAndDB(t, r, url)
	change := func(target types.NamespacedName, name string) attribution.AttributedChange {
		return by("alice", "a-"+name, targetChange(target, name))
	}
	r.Deliver(change(web, "front"))
	r.Deliver(change(db, "orders"))
	require.Eventually(t, func() bool {
		return r.TargetStatus(web).LastCommit != "" && r.TargetStatus(db).LastCommit != ""
	}, 30*time.Second, 10*time.Millisecond)
	pushCommitFromClone(t, url, "main", "web/shop/core/configmaps/front.yaml", "tampered")
	r.Changed()

	r.Deliver(change(db, "payments"))
	require.Eventually(t, func() bool { return r.TargetStatus(web).ForeignEdits == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, r.TargetStatus(db).ForeignEdits, "db's folder is as it was pushed")
	require.Zero(t, r.TargetStatus(web).StartOvers)
	require.Eventually(t, func() bool { return slices.Contains(r.Changed(), web) }, 30*time.Second, 10*time.Millisecond)
}
