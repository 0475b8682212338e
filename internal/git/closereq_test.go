package git

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// routeLongWindow routes tenants with a window long enough that only a close request (or
// another author) closes it.
func routeLongWindow(t *testing.T) (*Router, string) {
	t.Helper()
	dir, url := newBareRemote(t)
	r := startRouter(t, RouterOptions{})
	remote := testRemote(url)
	remote.CommitWindow = time.Hour
	require.NoError(t, r.Route(tenants, Destination{Remote: remote, Branch: "main", Path: "clusters/prod"}))
	return r, dir
}

func waitClose(t *testing.T, r *Router, id string, want CloseOutcome) CloseResult {
	t.Helper()
	var res CloseResult
	require.Eventually(t, func() bool {
		var ok bool
		res, ok = r.CloseResult(tenants, id)
		return ok && res.Outcome != ClosePending
	}, 20*time.Second, 10*time.Millisecond, "close request %s never finished", id)
	require.Equal(t, want, res.Outcome, "close request %s", id)
	return res
}

// TestCloseRequestClosesTheSubmittersWindow: the submitter's window is closed at once with the
// request's message, the change lines and trailers kept, the submitter and request named.
func TestCloseRequestClosesTheSubmittersWindow(t *testing.T) {
	r, dir := routeLongWindow(t)
	r.Deliver(by("alice", "a1", cmChange(watch.OpCreate, "shop", "settings", "v1")))
	require.NoError(t, r.RequestClose(CloseRequest{ID: "uid-1", Target: tenants, Username: "alice",
		Message: "Raise the limits\n\nBecause the shop grew.", Request: "shop/raise"}))
	// A second request with the same ID is not sent again.
	require.NoError(t, r.RequestClose(CloseRequest{ID: "uid-1", Target: tenants, Username: "alice", Message: "again"}))

	res := waitClose(t, r, "uid-1", CloseCommitted)
	require.Equal(t, "main", res.Branch)
	require.Equal(t, runGit(t, "", "--git-dir="+dir, "rev-parse", "refs/heads/main"), res.SHA)
	require.Equal(t, []string{"alice|alice@users.example.com|kubescribe"}, gitLog(t, dir, "main", "%an|%ae|%cn"))
	body := runGit(t, "", "--git-dir="+dir, "log", "-1", "--format=%B", "main")
	require.Equal(t, "Raise the limits\n\nBecause the shop grew.\n\n"+
		"create core/configmaps shop/settings resourceVersion=100 uid=uid-settings\n\n"+
		"Kubescribe-User: alice\n"+
		"Kubescribe-Audit-ID: a1\n"+
		"Kubescribe-Attribution: resolved\n"+
		"Kubescribe-Cluster: prod\n"+
		"Kubescribe-Submitter: alice\n"+
		"Kubescribe-Commit-Request: shop/raise", body)

	r.ForgetClose(tenants, "uid-1")
	_, known := r.CloseResult(tenants, "uid-1")
	require.False(t, known)
}

// TestCloseRequestAssertedAuthor: the asserted identity is the author, the committer stays
// kubescribe's, and the submitter is in a trailer.
func TestCloseRequestAssertedAuthor(t *testing.T) {
	r, dir := routeLongWindow(t)
	r.Deliver(by("portal", "p1", cmChange(watch.OpCreate, "shop", "settings", "v1")))
	require.NoError(t, r.RequestClose(CloseRequest{ID: "uid-2", Target: tenants, Username: "portal",
		Message: "Tenant onboarding", Author: &Signature{Name: "Jane Doe", Email: "jane@example.com"}, Request: "shop/onboard"}))
	waitClose(t, r, "uid-2", CloseCommitted)
	require.Equal(t, []string{"Jane Doe|jane@example.com|kubescribe|kubescribe@example.com"}, gitLog(t, dir, "main", "%an|%ae|%cn|%ce"))
	require.Contains(t, runGit(t, "", "--git-dir="+dir, "log", "-1", "--format=%B", "main"), "\nKubescribe-Submitter: portal\n")
}

// TestCloseRequestNeverClosesAnotherAuthorsWindow: with bob's window open, alice's request
// finds no window of hers and leaves bob's open; bob's own request closes it.
func TestCloseRequestNeverClosesAnotherAuthorsWindow(t *testing.T) {
	r, dir := routeLongWindow(t)
	r.Deliver(by("alice", "a1", cmChange(watch.OpCreate, "shop", "one", "1")))
	r.Deliver(by("bob", "b1", cmChange(watch.OpCreate, "shop", "two", "2"))) // closes alice's window
	require.NoError(t, r.RequestClose(CloseRequest{ID: "alice-req", Target: tenants, Username: "alice", Message: "alice's"}))
	waitClose(t, r, "alice-req", CloseNoOpenWindow)

	// alice's change went out with the generated message; bob's is still held.
	require.Eventually(t, func() bool { return r.TargetStatus(tenants).LastCommit != "" }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, r.TargetStatus(tenants).Pending)
	require.Equal(t, []string{"alice|create configmaps shop/one"}, gitLog(t, dir, "main", "%an|%s"))

	// A request for another target, or by nobody with a window, closes nothing either.
	require.Error(t, r.RequestClose(CloseRequest{ID: "other-target", Target: types.NamespacedName{Namespace: "kubescribe", Name: "unrouted"}, Username: "bob"}))
	require.NoError(t, r.RequestClose(CloseRequest{ID: "carol-req", Target: tenants, Username: "carol", Message: "carol's"}))
	waitClose(t, r, "carol-req", CloseNoOpenWindow)
	require.Equal(t, 1, r.TargetStatus(tenants).Pending)

	require.NoError(t, r.RequestClose(CloseRequest{ID: "bob-req", Target: tenants, Username: "bob", Message: "bob's"}))
	waitClose(t, r, "bob-req", CloseCommitted)
	require.Equal(t, []string{"bob|bob's", "alice|create configmaps shop/one"}, gitLog(t, dir, "main", "%an|%s"))
}

// TestCloseRequestUnroutedTarget: a target without a route refuses the request.
func TestCloseRequestUnroutedTarget(t *testing.T) {
	r := startRouter(t, RouterOptions{})
	err := r.RequestClose(CloseRequest{ID: "x", Target: tenants, Username: "alice", Message: "m"})
	require.ErrorContains(t, err, "not routed")
	_, known := r.CloseResult(tenants, "x")
	require.False(t, known)
}

// TestCloseRequestUnresolvedWindowIsNobodys: a window of unresolved changes is no submitter's.
func TestCloseRequestUnresolvedWindowIsNobodys(t *testing.T) {
	r, _ := routeLongWindow(t)
	r.Deliver(unresolved(cmChange(watch.OpCreate, "shop", "one", "1")))
	require.NoError(t, r.RequestClose(CloseRequest{ID: "u", Target: tenants, Username: attribution.UnresolvedUsername, Message: "m"}))
	waitClose(t, r, "u", CloseNoOpenWindow)
}

// TestCloseRequestSurvivesARestart: a window a request closed before the process stopped (its
// push failing: the remote is away) is committed with the request's message by the next
// process, once the target is routed; and a commit a stopping process pushed is reported by the
// next one, from Redis, without any route.
func TestCloseRequestSurvivesARestart(t *testing.T) {
	closes := NewCloseStore(redistest.Start(t), keyspace.MustParse("test:"))
	dir, url := newBareRemote(t)
	remote := testRemote(url)
	remote.CommitWindow = time.Hour
	dest := Destination{Remote: remote, Branch: "main", Path: "clusters/prod"}

	first := NewRouter(RouterOptions{Closes: closes, Logger: slog.New(slog.DiscardHandler)})
	first.Start(context.Background())
	require.NoError(t, first.Route(tenants, dest))
	first.Deliver(by("alice", "a0", cmChange(watch.OpCreate, "shop", "first", "v1")))
	require.NoError(t, first.RequestClose(CloseRequest{ID: "uid-0", Target: tenants, Username: "alice", Message: "First", Request: "shop/first"}))
	waitClose(t, first, "uid-0", CloseCommitted)
	// The remote goes away: the next push fails.
	require.NoError(t, os.Rename(dir, dir+".away"))
	first.Deliver(by("alice", "a1", cmChange(watch.OpCreate, "shop", "settings", "v1")))
	require.NoError(t, first.RequestClose(CloseRequest{ID: "uid-1", Target: tenants, Username: "alice",
		Message: "Raise the limits", Request: "shop/raise"}))
	require.Eventually(t, func() bool {
		_, found, err := closes.get(context.Background(), tenants, "uid-1")
		return err == nil && found
	}, 20*time.Second, 10*time.Millisecond, "the close is kept once the worker accepted it")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = first.Stop(ctx) // the final push fails: the remote is still away
	cancel()

	require.NoError(t, os.Rename(dir+".away", dir))
	second := startRouter(t, RouterOptions{Closes: closes})
	res, ok := second.CloseResult(tenants, "uid-1")
	require.True(t, ok)
	require.Equal(t, ClosePending, res.Outcome, "kept, not pushed: pending until the target is routed")
	require.NoError(t, second.Route(tenants, dest))
	res = waitClose(t, second, "uid-1", CloseCommitted)
	require.Equal(t, runGit(t, "", "--git-dir="+dir, "rev-parse", "refs/heads/main"), res.SHA)
	require.Equal(t, []string{"alice|Raise the limits", "alice|First"}, gitLog(t, dir, "main", "%an|%s"))

	// The push is recorded: a third process reports it without routing anything.
	third := startRouter(t, RouterOptions{Closes: closes})
	require.Eventually(t, func() bool {
		got, ok := third.CloseResult(tenants, "uid-1")
		return ok && got.Outcome == CloseCommitted && got.SHA == res.SHA && got.Branch == "main"
	}, 20*time.Second, 10*time.Millisecond)

	// Forgotten by the controller, it is gone for every process.
	third.ForgetClose(tenants, "uid-1")
	_, known := second.CloseResult(types.NamespacedName{Namespace: "other", Name: "target"}, "uid-1")
	require.True(t, known, "second still holds it in memory")
	_, known = startRouter(t, RouterOptions{Closes: closes}).CloseResult(tenants, "uid-1")
	require.False(t, known)
}

// TestKeptCloseOfAnotherDestinationIsLost: a kept close of a target that has since moved to
// another folder is not committed into the new one: it is forgotten, and ends as lost.
func TestKeptCloseOfAnotherDestinationIsLost(t *testing.T) {
	closes := NewCloseStore(redistest.Start(t), keyspace.MustParse("test:"))
	ctx := context.Background()
	change := by("alice", "a1", cmChange(watch.OpCreate, "shop", "settings", "v1"))
	rec := newCloseRecord(CloseRequest{ID: "uid-1", Target: tenants, Username: "alice", Message: "m"}, "prod old-destination", []attribution.AttributedChange{change}, time.Now())
	require.NoError(t, closes.put(ctx, tenants, rec))
	dir, url := newBareRemote(t)
	r := startRouter(t, RouterOptions{Closes: closes})
	require.NoError(t, r.Route(tenants, Destination{Remote: testRemote(url), Branch: "main", Path: "clusters/prod", Stream: "new-destination", Cluster: "prod"}))
	require.Eventually(t, func() bool { _, known := r.CloseResult(tenants, "uid-1"); return !known }, 20*time.Second, 10*time.Millisecond)
	require.Empty(t, runGit(t, "", "--git-dir="+dir, "for-each-ref"), "nothing is committed into the new destination")
}

// What became of a close cannot be read while Redis does not answer: the router says so
// (CloseUnknown), rather than claiming a pending close it knows nothing of.
func TestCloseResultUnknownWithoutRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	r := startRouter(t, RouterOptions{Closes: NewCloseStore(rdb, keyspace.MustParse("test:"))})
	res, handed := r.CloseResult(tenants, "uid-1")
	require.True(t, handed)
	require.Equal(t, CloseUnknown, res.Outcome)
	require.Equal(t, "unknown", res.Outcome.String())
}
