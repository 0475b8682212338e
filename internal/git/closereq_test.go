package git

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
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
		res, ok = r.CloseResult(id)
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
		"create core/configmaps shop/settings resourceVersion=100\n\n"+
		"Kubescribe-User: alice\n"+
		"Kubescribe-Audit-ID: a1\n"+
		"Kubescribe-Attribution: resolved\n"+
		"Kubescribe-Cluster: prod\n"+
		"Kubescribe-Submitter: alice\n"+
		"Kubescribe-Commit-Request: shop/raise", body)

	r.ForgetClose("uid-1")
	_, known := r.CloseResult("uid-1")
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
	_, known := r.CloseResult("x")
	require.False(t, known)
}

// TestCloseRequestUnresolvedWindowIsNobodys: a window of unresolved changes is no submitter's.
func TestCloseRequestUnresolvedWindowIsNobodys(t *testing.T) {
	r, _ := routeLongWindow(t)
	r.Deliver(unresolved(cmChange(watch.OpCreate, "shop", "one", "1")))
	require.NoError(t, r.RequestClose(CloseRequest{ID: "u", Target: tenants, Username: attribution.UnresolvedUsername, Message: "m"}))
	waitClose(t, r, "u", CloseNoOpenWindow)
}
