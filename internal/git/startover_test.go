package git

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// deleteAndCollect deletes branch main of the bare repository gitDir and garbage-collects
// every object, as a server does some time after a branch is deleted.
func deleteAndCollect(t *testing.T, gitDir string) {
	t.Helper()
	runGit(t, "", "--git-dir="+gitDir, "update-ref", "-d", "refs/heads/main")
	runGit(t, "", "--git-dir="+gitDir, "reflog", "expire", "--expire=now", "--all")
	runGit(t, "", "--git-dir="+gitDir, "gc", "--quiet", "--prune=now")
	require.Contains(t, runGit(t, "", "--git-dir="+gitDir, "count-objects", "-v"), "in-pack: 0")
}

// replayed is c as a resumed stream hands it over: Unchanged when the folder held this version
// at the last push, otherwise Resumed with its author.
func replayed(c attribution.AttributedChange, unchanged bool) attribution.AttributedChange {
	c.Snapshot, c.Unchanged, c.Resumed = true, unchanged, !unchanged
	if unchanged {
		c.Author = attribution.Author{}
	}
	return c
}

// TestBranchLostOnTheServerStartsOver: the branch is deleted on the server and its objects
// collected. The worker's next push builds on the lost history and is refused; the worker gives
// up what it holds, reports the start-over with the dropped change, and holds back what comes
// next (bob's change) until the replay's snapshot commit is built. Then one push creates the
// branch with every file: the unchanged one written by the committer, the replayed change by
// its author, bob's by bob.
func TestBranchLostOnTheServerStartsOver(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := startWorker(t, opts)
	first := by("alice", "a1", cmChange(watch.OpCreate, "demo", "first", "1"))
	tw.Submit("", first)
	tw.waitPushed(t)
	deleteAndCollect(t, gitDir)

	second := by("alice", "a2", cmChange(watch.OpCreate, "demo", "second", "1"))
	tw.Submit("", second)
	require.Eventually(t, func() bool { return len(tw.replays()) == 1 }, 20*time.Second, 10*time.Millisecond,
		"no start-over: %s", tw.logs.String())
	so := tw.replays()[0]
	require.True(t, so.StartedOver)
	require.Len(t, so.Dropped, 1)
	require.Equal(t, "second", so.Dropped[0].Name)
	st := tw.Status()
	require.Zero(t, st.Pending, "a dropped change is not pending")
	require.ErrorContains(t, st.LastError, "started over")
	require.ErrorContains(t, st.LastError, errPushRefused, "the server's refusal, classified")
	require.Contains(t, RemoteDetail(st.LastError), "missing necessary objects", "what the server answered, for the log")

	// A change that comes before the replay is committed, not pushed.
	tw.Submit("", by("bob", "b1", cmChange(watch.OpCreate, "demo", "third", "1")))
	require.Eventually(t, func() bool { return strings.Count(tw.logs.String(), "msg=committed") == 3 }, 20*time.Second, 10*time.Millisecond)
	pushesBefore := len(tw.pushes.commits())

	tw.Submit("", replayed(first, true))
	tw.Submit("", replayed(second, false))
	tw.waitPushed(t)
	require.Eventually(t, func() bool { return tw.Status().LastError == nil }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, tw.stop(t))
	require.Equal(t, []string{"demo/core/configmaps/first.yaml", "demo/core/configmaps/second.yaml", "demo/core/configmaps/third.yaml"},
		gitFiles(t, gitDir, "main"))
	log := gitLog(t, gitDir, "main", "%an|%P")
	require.Len(t, log, 2, "bob's commit and the replay's, in one new history: %v", log)
	require.Equal(t, "bob", strings.Split(log[1], "|")[0])
	require.Empty(t, strings.Split(log[1], "|")[1], "the branch starts over: its first commit has no parent")
	body := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%an%n%B", "main")
	require.Contains(t, body, "create core/configmaps demo/first")
	require.Contains(t, body, "create core/configmaps demo/second")
	var after []PushResult
	tw.pushes.mu.Lock()
	for _, r := range tw.pushes.results {
		if len(r.Commits) > 0 {
			after = append(after, r)
		}
	}
	tw.pushes.mu.Unlock()
	require.Equal(t, 1, pushesBefore, "only the push before the loss")
	require.Len(t, after[len(after)-1].Commits, 2, "bob's commit waited for the replay and went with it")
	require.Contains(t, tw.logs.String(), "the server no longer holds the deleted branch's history")
}

// TestStartOverHoldEnds: when no snapshot follows a start-over (no stream replays, a target
// without rules), what the worker holds is pushed once the hold ends, and that is logged.
func TestStartOverHoldEnds(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := newTestWorker(t, opts)
	tw.replayHold = 50 * time.Millisecond
	tw.start(t)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "first", "1")))
	tw.waitPushed(t)
	deleteAndCollect(t, gitDir)
	tw.Submit("", by("alice", "a2", cmChange(watch.OpCreate, "demo", "second", "1")))
	require.Eventually(t, func() bool { return len(tw.replays()) == 1 }, 20*time.Second, 10*time.Millisecond)

	tw.Submit("", by("bob", "b1", cmChange(watch.OpCreate, "demo", "third", "1")))
	require.Eventually(t, func() bool { return tw.Status().LastError == nil && tw.Status().Pending == 0 }, 20*time.Second, 10*time.Millisecond,
		"bob's change is pushed once the hold ended: %s", tw.logs.String())
	require.Equal(t, []string{"demo/core/configmaps/third.yaml"}, gitFiles(t, gitDir, "main"))
	require.Contains(t, tw.logs.String(), "no snapshot arrived after the branch was started over")
}

// TestForeignEditOfAFolderAsksForItsReplay: the worker learns of someone else's commits when
// its push is refused. A commit that changes only what lies outside the worker's folder asks
// for nothing; one that edits a file in it asks for the folder's replay; a rewind of the branch
// to before the worker's commit too.
func TestForeignEditOfAFolderAsksForItsReplay(t *testing.T) {
	gitDir, url, tw := startPushed(t, "apps", nil, "first")
	first := gitLog(t, gitDir, "main", "%H")[0]
	pushed := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { return len(tw.pushes.commits()) == n }, 20*time.Second, 10*time.Millisecond, "%s", tw.logs.String())
	}
	foreign := func(file, content string) {
		t.Helper()
		pushCommitFromClone(t, url, "main", file, content)
	}

	foreign("README.md", "hello")
	tw.Submit("apps", by("alice", "a2", cmChange(watch.OpCreate, "demo", "second", "1")))
	pushed(2)
	require.Empty(t, tw.replays(), "nothing of the folder changed")

	foreign("apps/demo/core/configmaps/first.yaml", "tampered")
	tw.Submit("apps", by("alice", "a3", cmChange(watch.OpCreate, "demo", "third", "1")))
	pushed(3)
	require.Len(t, tw.replays(), 1)
	require.Equal(t, ReplayRequest{Folders: []string{"apps"}}, tw.replays()[0])

	runGit(t, "", "--git-dir="+gitDir, "update-ref", "refs/heads/main", first)
	tw.Submit("apps", by("alice", "a4", cmChange(watch.OpCreate, "demo", "fourth", "1")))
	pushed(4)
	require.Len(t, tw.replays(), 2, "a rewind took the folder back")
	require.Equal(t, []string{"apps"}, tw.replays()[1].Folders)
	require.Contains(t, tw.logs.String(), "someone else's commits changed folders kubescribe writes")
}

// TestIdleWorkerFetchesForForeignEdits: with a fetch interval, a worker with nothing to push
// fetches its branch by itself. Someone else's commit outside its folder asks for nothing; one
// that edits a file in it asks for the folder's replay, with no change submitted. A branch that
// cannot be fetched is the worker's error until it can be fetched again.
func TestIdleWorkerFetchesForForeignEdits(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.FetchInterval = 20 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	checks := func(result string) float64 {
		return testutil.ToFloat64(opts.Metrics.branchChecks.WithLabelValues(result))
	}
	tw := startWorker(t, opts)
	tw.Submit("apps", by("alice", "a1", cmChange(watch.OpCreate, "demo", "first", "1")))
	tw.waitPushed(t)
	require.Eventually(t, func() bool { return checks(branchCheckUnchanged) >= 2 }, 20*time.Second, 10*time.Millisecond,
		"an idle worker checks its branch: %s", tw.logs.String())

	pushCommitFromClone(t, url, "main", "README.md", "hello")
	require.Eventually(t, func() bool { return checks(branchCheckMoved) == 1 }, 20*time.Second, 10*time.Millisecond)
	pushCommitFromClone(t, url, "main", "apps/demo/core/configmaps/first.yaml", "tampered")
	require.Eventually(t, func() bool { return len(tw.replays()) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the edit in the folder is found without a push: %s", tw.logs.String())
	require.Equal(t, ReplayRequest{Folders: []string{"apps"}}, tw.replays()[0], "the README asked for nothing")
	require.Equal(t, 1, len(tw.pushes.commits()), "a check pushes nothing")

	moved := gitDir + ".away"
	require.NoError(t, os.Rename(gitDir, moved))
	// The worker sets its error before it calls OnFailed, and clears it before it logs: wait for
	// all of each.
	require.Eventually(t, func() bool {
		return tw.Status().LastError != nil && checks(branchCheckError) >= 1 && len(tw.failures()) > 0
	}, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Rename(moved, gitDir))
	require.Eventually(t, func() bool {
		return tw.Status().LastError == nil && strings.Contains(tw.logs.String(), "the branch can be fetched again")
	}, 20*time.Second, 10*time.Millisecond, "a check that works again clears the error: %s", tw.logs.String())
}

// checkEvery20ms has a worker check its branch every 20ms.
func checkEvery20ms(o *Options) { o.FetchInterval = 20 * time.Millisecond }

// TestIdleWorkerRestoresADeletedBranch: a check that finds the branch deleted creates it again
// at the worker's last commit, history included, while the server still holds it. Once the
// server garbage-collected it, the push is refused and the worker starts the branch over.
func TestIdleWorkerRestoresADeletedBranch(t *testing.T) {
	gitDir, _, tw := startPushed(t, "", checkEvery20ms, "first")
	tw.Submit("", by("alice", "a2", cmChange(watch.OpCreate, "demo", "second", "1")))
	require.Eventually(t, func() bool { return len(tw.pushes.commits()) == 2 }, 20*time.Second, 10*time.Millisecond)
	history := gitLog(t, gitDir, "main", "%H")

	runGit(t, "", "--git-dir="+gitDir, "update-ref", "-d", "refs/heads/main")
	require.Eventually(t, func() bool {
		return strings.Contains(tw.logs.String(), "the deleted branch is created again at kubescribe's last commit")
	}, 20*time.Second, 10*time.Millisecond, "%s", tw.logs.String())
	require.Equal(t, history, gitLog(t, gitDir, "main", "%H"), "the branch is back with its history")
	require.Empty(t, tw.replays())
	require.Nil(t, tw.Status().LastError)

	// The worker must not see the branch between its deletion and the collection, or its check
	// creates it again at once and the collection keeps the history: the server is out of reach
	// meanwhile.
	away := gitDir + ".away"
	require.NoError(t, os.Rename(gitDir, away))
	deleteAndCollect(t, away)
	require.NoError(t, os.Rename(away, gitDir))
	require.Eventually(t, func() bool { return len(tw.replays()) == 1 }, 20*time.Second, 10*time.Millisecond, "%s", tw.logs.String())
	require.True(t, tw.replays()[0].StartedOver, "the server no longer holds the history: the branch starts over")
}

// TestRefusedRestoreIsRetriedNotStartedOver: the server refuses to create the deleted branch
// again for a reason of its own (here a pre-receive hook), while it still holds the history.
// That is an ordinary failure, retried at the next check: the worker does not give the branch
// up, and once the server accepts, the branch is back with its history.
func TestRefusedRestoreIsRetriedNotStartedOver(t *testing.T) {
	gitDir, _, tw := startPushed(t, "", checkEvery20ms, "first")
	history := gitLog(t, gitDir, "main", "%H")

	hook := filepath.Join(gitDir, "hooks", "pre-receive")
	require.NoError(t, os.MkdirAll(filepath.Dir(hook), 0o755))
	require.NoError(t, os.WriteFile(hook, []byte("#!/bin/sh\necho 'branch creation is frozen' >&2\nexit 1\n"), 0o755))
	runGit(t, "", "--git-dir="+gitDir, "update-ref", "-d", "refs/heads/main")
	require.Eventually(t, func() bool {
		err := tw.Status().LastError
		return err != nil && strings.Contains(err.Error(), errPushRefused) && strings.Contains(RemoteDetail(err), "pre-receive hook declined")
	}, 20*time.Second, 10*time.Millisecond, "%s", tw.logs.String())
	require.Empty(t, tw.replays(), "a refusal that is not about missing objects does not start the branch over")

	require.NoError(t, os.Remove(hook))
	require.Eventually(t, func() bool {
		out, err := exec.Command("git", "--git-dir="+gitDir, "log", "--format=%H", "main").Output()
		return err == nil && strings.Fields(string(out))[0] == history[0]
	}, 20*time.Second, 10*time.Millisecond, "the branch comes back once the server accepts: %s", tw.logs.String())
	require.Equal(t, history, gitLog(t, gitDir, "main", "%H"))
	require.Eventually(t, func() bool { return tw.Status().LastError == nil }, 20*time.Second, 10*time.Millisecond)
	require.Empty(t, tw.replays())
}

// TestHistoryLostAtShutdownIsReported: when it is the final push at shutdown that finds the
// deleted branch's history gone, the worker does not start over (no replay can follow): Run
// reports the change as not pushed, with the server's answer, and nothing is dropped silently.
func TestHistoryLostAtShutdownIsReported(t *testing.T) {
	gitDir, url, first := startPushed(t, "", nil, "first")
	require.NoError(t, first.stop(t))

	tw := startWorker(t, testOptions(url)) // a one-hour window: only the shutdown pushes
	tw.Submit("", by("alice", "a2", cmChange(watch.OpCreate, "demo", "second", "1")))
	require.Eventually(t, func() bool { return strings.Contains(tw.logs.String(), "folder checked: it may become") }, 20*time.Second, 10*time.Millisecond,
		"%s", tw.logs.String())
	deleteAndCollect(t, gitDir)
	err := tw.stop(t)
	require.ErrorContains(t, err, "1 changes not pushed")
	require.ErrorContains(t, err, errPushRefused)
	require.Contains(t, RemoteDetail(err), "missing necessary objects")
	require.Empty(t, tw.replays(), "no start-over at shutdown")
}
