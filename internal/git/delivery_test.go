package git

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/watch"
)

// errLandedButFailed is what a push reports when it timed out after the server applied it.
var errLandedButFailed = errors.New("injected: push timed out after the server applied it")

// pushHold lets a test act while the worker goroutine is inside a push.
type pushHold struct {
	paused  chan struct{}
	resumed chan struct{}
}

func newPushHold() *pushHold {
	return &pushHold{paused: make(chan struct{}), resumed: make(chan struct{})}
}

// pause is called once, by the push seam on the worker goroutine: it tells the test and waits
// until the test resumes it (or ctx ends).
func (h *pushHold) pause(ctx context.Context) {
	close(h.paused)
	select {
	case <-h.resumed:
	case <-ctx.Done():
	}
}

func (h *pushHold) waitPaused(t testing.TB) {
	t.Helper()
	select {
	case <-h.paused:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not reach the push")
	}
}

func (h *pushHold) resume() { close(h.resumed) }

// pushSHA pushes the commit sha to the worker's branch: a push that delivers only the plans up
// to sha. It runs on the worker goroutine (from a push seam).
func (w *Worker) pushSHA(ctx context.Context, sha plumbing.Hash) error {
	for i, p := range w.plans {
		if p.sha == sha {
			return w.pushPlans(ctx, i+1)
		}
	}
	return fmt.Errorf("no unpushed commit %s", sha)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 10*time.Millisecond, what)
}

// The reviewer's scenario: a push lands but reports an error, and someone else pushes an edit of
// the same file on top before the worker fetches. The worker must recognise its commit in the
// remote history and not apply it again on top of the other edit.
func TestLandedPushThatWasBuiltOnIsNotPushedAgain(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	hold := newPushHold()
	var calls atomic.Int32
	tw.pushFn = func(ctx context.Context) error {
		err := tw.pushOnce(ctx)
		if calls.Add(1) == 2 && err == nil {
			hold.pause(ctx) // bob pushes on top now
			return errLandedButFailed
		}
		return err
	}
	tw.start(t)
	const cfgPath = "demo/core/configmaps/cfg.yaml"

	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
	tw.waitPushed(t)
	tw.Submit("", by("alice", "a2", cmChange(watch.OpUpdate, "demo", "cfg", "2")))
	hold.waitPaused(t)
	require.Contains(t, gitShow(t, gitDir, "main", cfgPath), "key: 2", "the push landed")
	pushCommitFromClone(t, url, "main", cfgPath, "bob's edit\n")
	hold.resume()
	waitFor(t, "the landed commit is reported delivered", func() bool {
		return tw.Status().Pending == 0 && len(tw.pushes.commits()) == 2
	})

	// The next change goes on top of bob's commit.
	tw.Submit("", by("alice", "a3", cmChange(watch.OpCreate, "demo", "other", "3")))
	waitFor(t, "the next change is pushed", func() bool { return len(tw.pushes.commits()) == 3 })
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{
		"alice|create configmaps demo/other",
		"bob|manual edit",
		"alice|update configmaps demo/cfg",
		"alice|create configmaps demo/cfg",
	}, gitLog(t, gitDir, "main", "%an|%s"), "alice's update appears once, under bob's edit")
	require.Equal(t, "bob's edit", gitShow(t, gitDir, "main", cfgPath), "bob's edit is kept")

	shas := gitLog(t, gitDir, "main", "%H")
	pushed := tw.pushes.commits()
	require.Equal(t, []string{shas[3], shas[2], shas[0]}, []string{pushed[0].SHA, pushed[1].SHA, pushed[2].SHA},
		"OnPushed reports the landed commit as delivered, with its SHA")
	require.Empty(t, tw.failures())
	require.NoError(t, tw.Status().LastError)
	require.Contains(t, tw.logs.String(), "an earlier push reached the remote although it reported an error")
	require.InDelta(t, 3, testutil.ToFloat64(opts.Metrics.commits), 0)
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pending), 0)
}

// Of two pending commits only the first landed before someone else pushed on top: the first is
// delivered as it is, only the second is rebuilt on the new tip.
func TestLandedPushDeliversOnlyTheCommitsInTheRemoteHistory(t *testing.T) {
	gitDir, url := newBareRemote(t)
	tw := newTestWorker(t, testOptions(url)) // the window lasts an hour: only author changes close it
	// Queued before Run: the first drain closes the alice and carol windows; dave's stays open.
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
	tw.Submit("", by("carol", "c1", cmChange(watch.OpCreate, "demo", "two", "2")))
	tw.Submit("", by("dave", "d1", cmChange(watch.OpCreate, "demo", "three", "3")))
	hold := newPushHold()
	var calls atomic.Int32
	var firstSHA atomic.Value
	tw.pushFn = func(ctx context.Context) error {
		if calls.Add(1) > 1 {
			return tw.pushOnce(ctx)
		}
		if len(tw.plans) != 2 {
			return fmt.Errorf("want 2 pending commits, have %d", len(tw.plans))
		}
		firstSHA.Store(tw.plans[0].sha.String())
		if err := tw.pushSHA(ctx, tw.plans[0].sha); err != nil {
			return err
		}
		hold.pause(ctx)
		return errLandedButFailed
	}
	tw.start(t)
	hold.waitPaused(t)
	pushCommitFromClone(t, url, "main", "demo/core/configmaps/cfg.yaml", "bob's edit\n")
	hold.resume()
	waitFor(t, "both commits are delivered", func() bool { return len(tw.pushes.commits()) == 2 })
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{
		"dave|create configmaps demo/three",
		"carol|create configmaps demo/two",
		"bob|manual edit",
		"alice|create configmaps demo/cfg",
	}, gitLog(t, gitDir, "main", "%an|%s"))
	require.Equal(t, "bob's edit", gitShow(t, gitDir, "main", "demo/core/configmaps/cfg.yaml"))
	shas := gitLog(t, gitDir, "main", "%H")
	pushed := tw.pushes.commits()
	require.Len(t, pushed, 3)
	require.Equal(t, firstSHA.Load(), pushed[0].SHA, "the landed commit keeps its SHA")
	require.Equal(t, shas[3], pushed[0].SHA)
	require.Equal(t, shas[1], pushed[1].SHA, "the second commit was rebuilt on bob's")
	require.Equal(t, shas[2], gitLog(t, gitDir, "main", "%P")[1])
	require.Empty(t, tw.failures())
}

// Pushes that land although they report an error deliver commits without any rebuild; however
// many in a row, they are no "remote branch kept moving".
func TestLandedPushesAreNoRebaseRounds(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	authors := []string{"alice", "bob", "carol", "dave", "erin"}
	for i, a := range authors {
		tw.Submit("", by(a, a, cmChange(watch.OpCreate, "demo", a, fmt.Sprint(i))))
	}
	// Each push delivers only the oldest pending commit and reports an error.
	tw.pushFn = func(ctx context.Context) error {
		if err := tw.pushSHA(ctx, tw.plans[0].sha); err != nil {
			return err
		}
		return errLandedButFailed
	}
	tw.start(t)
	waitFor(t, "the four closed windows are delivered", func() bool { return len(tw.pushes.commits()) == 4 })
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"erin", "dave", "carol", "bob", "alice"}, gitLog(t, gitDir, "main", "%an"))
	require.Len(t, tw.pushes.commits(), 5)
	require.NotContains(t, tw.logs.String(), "kept moving")
	require.NotContains(t, tw.logs.String(), "rebuilding")
	require.Empty(t, tw.failures())
	require.NoError(t, tw.Status().LastError)
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pushes.WithLabelValues(pushResultRejected)), 0)
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pending), 0)
}

// Cancelling Run's context while a push is in flight is a normal shutdown: no OnFailed, no
// LastError, and the final push delivers the change.
func TestShutdownDuringPushIsNoFailure(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	inPush := make(chan struct{})
	var calls atomic.Int32
	tw.pushFn = func(ctx context.Context) error {
		if calls.Add(1) > 1 {
			return tw.pushOnce(ctx)
		}
		close(inPush)
		<-ctx.Done() // the push hangs until shutdown cuts it short
		return fmt.Errorf("push: %w", ctx.Err())
	}
	tw.start(t)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
	select {
	case <-inPush:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not push")
	}
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"alice|create configmaps demo/cfg"}, gitLog(t, gitDir, "main", "%an|%s"))
	require.Empty(t, tw.failures(), "OnFailed is not called for a shutdown")
	st := tw.Status()
	require.NoError(t, st.LastError)
	require.Zero(t, st.Pending)
	require.NotContains(t, tw.logs.String(), "operation failed")
	require.Contains(t, tw.logs.String(), "interrupted by shutdown")
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pushes.WithLabelValues(pushResultError)), 0)
	require.InDelta(t, 1, testutil.ToFloat64(opts.Metrics.pushes.WithLabelValues(pushResultSuccess)), 0)
}

func TestSubmitAfterRunReturned(t *testing.T) {
	_, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))

	tw.Submit("", by("bob", "b1", cmChange(watch.OpUpdate, "demo", "late-cm", "confidential-value")))
	require.InDelta(t, 1, testutil.ToFloat64(opts.Metrics.dropped), 0)
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pending), 0, "a dropped change is not pending")
	require.Zero(t, tw.Status().Pending)
	logs := tw.logs.String()
	require.Contains(t, logs, "change submitted to a stopped git worker")
	require.Contains(t, logs, "level=ERROR")
	for _, s := range []string{"resource=configmaps", "namespace=demo", "name=late-cm", "op=update"} {
		require.Contains(t, logs, s)
	}
	require.NotContains(t, logs, "confidential-value", "the content is never logged")
}

// A change submitted while the final push runs cannot be committed; it is logged, counted as
// dropped and reported among the changes not pushed, and the pending gauge goes back to zero.
func TestSubmitDuringFinalPush(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url) // the window lasts an hour: the change waits for shutdown
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	hold := newPushHold()
	tw.pushFn = func(ctx context.Context) error {
		if tw.final {
			hold.pause(ctx)
		}
		return tw.pushOnce(ctx)
	}
	tw.start(t)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
	tw.cancel()
	hold.waitPaused(t)
	tw.Submit("", by("bob", "b1", cmChange(watch.OpUpdate, "demo", "late-cm", "confidential-value")))
	hold.resume()
	err := tw.stop(t)

	require.EqualError(t, err, `git: 1 changes not pushed to branch "main" (1 of them submitted after shutdown began)`)
	require.Equal(t, []string{"alice|create configmaps demo/cfg"}, gitLog(t, gitDir, "main", "%an|%s"))
	require.Equal(t, 1, tw.Status().Pending)
	require.NoError(t, tw.Status().LastError)
	require.InDelta(t, 1, testutil.ToFloat64(opts.Metrics.dropped), 0)
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pending), 0)
	logs := tw.logs.String()
	require.Contains(t, logs, "change submitted to a stopping git worker")
	require.Contains(t, logs, "name=late-cm")
	require.NotContains(t, logs, "confidential-value")
}

func TestShutdownClearsPendingGauge(t *testing.T) {
	gitDir, url := newBareRemote(t)
	require.NoError(t, os.RemoveAll(gitDir))
	opts := testOptions(url)
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
	tw.Submit("", by("bob", "b1", cmChange(watch.OpCreate, "demo", "two", "2")))
	require.InDelta(t, 2, testutil.ToFloat64(opts.Metrics.pending), 0)
	err := tw.stop(t)
	require.ErrorContains(t, err, `git: 2 changes not pushed to branch "main": clone: `)
	require.Equal(t, 2, tw.Status().Pending, "Status still tells what was not pushed")
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pending), 0, "the shared gauge does not stay inflated")
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.dropped), 0)
}

// A human rewinds the branch to an older commit: the worker must not push the dropped commits
// back as a fast-forward; it rebuilds its pending commit on the rewound tip.
func TestRewoundRemoteIsNotFastForwarded(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := startWorker(t, opts)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
	waitFor(t, "first push", func() bool { return len(tw.pushes.commits()) == 1 })
	tw.Submit("", by("alice", "a2", cmChange(watch.OpCreate, "demo", "two", "2")))
	waitFor(t, "second push", func() bool { return len(tw.pushes.commits()) == 2 })
	shas := gitLog(t, gitDir, "main", "%H")
	purged, kept := shas[0], shas[1]

	runGit(t, "", "--git-dir="+gitDir, "update-ref", "refs/heads/main", kept) // git push --force of an ancestor

	tw.Submit("", by("carol", "c1", cmChange(watch.OpCreate, "demo", "three", "3")))
	waitFor(t, "third push", func() bool { return len(tw.pushes.commits()) == 3 && tw.Status().Pending == 0 })
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"carol|create configmaps demo/three", "alice|create configmaps demo/one"},
		gitLog(t, gitDir, "main", "%an|%s"))
	require.Equal(t, kept, gitLog(t, gitDir, "main", "%P")[0], "rebuilt on the rewound tip")
	require.Equal(t, []string{"demo/core/configmaps/one.yaml", "demo/core/configmaps/three.yaml"}, gitFiles(t, gitDir, "main"))
	logs := tw.logs.String()
	require.Contains(t, logs, "remote branch was rewound to an older commit")
	require.Contains(t, logs, "old_tip="+purged)
	require.Contains(t, logs, "new_tip="+kept)
	require.Equal(t, gitLog(t, gitDir, "main", "%H")[0], tw.pushes.commits()[2].SHA)
}

// A rewind to a commit several pushes back, whose commit object and trees the working store
// pruned long ago: the worker knows it from the history's hashes, says it was rewound, fetches
// it again and rebuilds on it.
func TestRewoundPastPrunedCommits(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	tw.compactEvery = 1 // prune after every push
	tw.start(t)
	for i := range 6 {
		user := []string{"alice", "bob"}[i%2] // alternating authors: one commit each
		tw.Submit("", by(user, fmt.Sprintf("a%d", i), cmChange(watch.OpCreate, "demo", fmt.Sprintf("cm-%d", i), fmt.Sprint(i))))
		waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == i+1 })
	}
	waitFor(t, "pruned", func() bool { return compactionsOf(opts.Metrics, compactionPrune) > 0 })
	shas := gitLog(t, gitDir, "main", "%H") // newest first
	kept := shas[4]                         // after the second commit
	runGit(t, "", "--git-dir="+gitDir, "update-ref", "refs/heads/main", kept)

	tw.Submit("", by("carol", "c1", cmChange(watch.OpCreate, "demo", "late", "x")))
	waitFor(t, "pushed after the rewind", func() bool { return len(tw.pushes.commits()) == 7 && tw.Status().Pending == 0 })
	require.NoError(t, tw.stop(t))

	require.Equal(t, kept, gitLog(t, gitDir, "main", "%P")[0], "rebuilt on the rewound tip")
	require.Equal(t, []string{"demo/core/configmaps/cm-0.yaml", "demo/core/configmaps/cm-1.yaml", "demo/core/configmaps/late.yaml"},
		gitFiles(t, gitDir, "main"))
	logs := tw.logs.String()
	require.Contains(t, logs, "remote branch was rewound to an older commit")
	require.Contains(t, logs, "new_tip="+kept)
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
}

// A deleted remote branch is created again by the next push, with the worker's history.
func TestDeletedRemoteBranchIsCreatedAgain(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := startWorker(t, opts)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
	waitFor(t, "first push", func() bool { return len(tw.pushes.commits()) == 1 })
	runGit(t, "", "--git-dir="+gitDir, "update-ref", "-d", "refs/heads/main")

	tw.Submit("", by("alice", "a2", cmChange(watch.OpCreate, "demo", "two", "2")))
	waitFor(t, "second push", func() bool { return len(tw.pushes.commits()) == 2 && tw.Status().Pending == 0 })
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"create configmaps demo/two", "create configmaps demo/one"}, gitLog(t, gitDir, "main", "%s"))
	require.Contains(t, tw.logs.String(), "remote branch was deleted")
	require.Empty(t, tw.failures())
}
