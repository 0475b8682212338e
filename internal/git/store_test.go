package git

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/watch"
)

// The working store does not grow with the history: once pushed, it is pruned back to the
// tip's commit and trees, and commits built after a pruning still land correctly on the remote.
func TestWorkingStoreIsCompacted(t *testing.T) {
	gitDir, url := newBareRemote(t)
	seedRemote(t, url, "seed/file.txt", "seed\n") // not a manifest: the folder gate passes it
	opts := testOptions(url)
	opts.CommitWindow = time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	tw.compactEvery = 10
	tw.start(t)

	const commits = 30
	for i := range commits {
		user := []string{"alice", "bob"}[i%2] // alternating authors: one commit each
		tw.Submit("", by(user, fmt.Sprintf("a%d", i), cmChange(watch.OpUpdate, "demo", "cfg", fmt.Sprint(i))))
		waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == i+1 })
	}
	// The tip's commit and trees (root, seed, demo, core, configmaps), plus fewer than
	// compactEvery objects since the last compaction; 30 commits wrote 180.
	waitFor(t, "store compacted", func() bool {
		return testutil.ToFloat64(opts.Metrics.storeObjects) <= 1+5+10
	})
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.unpushed), 0)
	require.NoError(t, tw.stop(t))
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.storeObjects), 0, "a stopped worker holds nothing")

	require.Len(t, gitLog(t, gitDir, "main", "%s"), commits+1)
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg.yaml"), fmt.Sprintf("key: %d", commits-1))
	require.Equal(t, "seed", gitShow(t, gitDir, "main", "seed/file.txt"))
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
	require.Positive(t, compactionsOf(opts.Metrics, compactionPrune), "pruned in place")
}

// seedRemote pushes a first commit holding file to the main branch of url.
func seedRemote(t testing.TB, url, file, content string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "seed")
	runGit(t, "", "init", "-q", "-b", "main", dir)
	require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, file)), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644))
	runGit(t, dir, "add", file)
	runGit(t, dir, "-c", "user.name=seed", "-c", "user.email=seed@example.com", "commit", "-q", "-m", "seed")
	runGit(t, dir, "push", "-q", url, "main")
}

// A store that gained many bytes is compacted even when it gained few objects: one commit into
// a large directory writes a large tree.
func TestWorkingStoreIsCompactedByBytes(t *testing.T) {
	_, url := newBareRemote(t)
	tw, _ := compactingWorker(t, url)
	tw.start(t)
	for i := range 3 {
		user := []string{"alice", "bob"}[i%2]
		tw.Submit("", by(user, fmt.Sprintf("a%d", i), cmChange(watch.OpUpdate, "demo", "cfg", fmt.Sprint(i))))
		waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == i+1 })
	}
	waitFor(t, "store pruned", func() bool { return strings.Contains(tw.logs.String(), "working store pruned") })
}

// Compaction does not wait for everything to be pushed: while the remote refuses pushes, the
// store is compacted around the unpushed commits (their objects and the remote tip's trees
// stay), and the commits land whole once it accepts them again.
func TestWorkingStoreIsCompactedAroundUnpushedCommits(t *testing.T) {
	gitDir, url := newBareRemote(t)
	seedRemote(t, url, "seed/file.txt", "seed\n") // not a manifest: the folder gate passes it
	tw, opts := compactingWorker(t, url)
	var refuse atomic.Bool
	refuse.Store(true)
	tw.pushFn = func(ctx context.Context) error {
		if refuse.Load() {
			return errors.New("remote unavailable")
		}
		return tw.pushOnce(ctx)
	}
	tw.start(t)

	const commits = 6
	for i := range commits {
		user := []string{"alice", "bob"}[i%2] // alternating authors: one commit each
		tw.Submit("", by(user, fmt.Sprintf("a%d", i), cmChange(watch.OpUpdate, "demo", fmt.Sprintf("cfg-%d", i%3), fmt.Sprint(i))))
		n := i + 1
		waitFor(t, "committed and compacted", func() bool {
			return testutil.ToFloat64(opts.Metrics.unpushed) == float64(n) &&
				compactionsOf(opts.Metrics, compactionPrune)+compactionsOf(opts.Metrics, compactionFull) > i
		})
	}
	require.Empty(t, tw.pushes.commits())
	require.Positive(t, compactionsOf(opts.Metrics, compactionPrune), "pruned")

	refuse.Store(false)
	waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == commits })
	require.NoError(t, tw.stop(t))
	require.Len(t, gitLog(t, gitDir, "main", "%s"), commits+1)
	for i := commits - 3; i < commits; i++ {
		require.Contains(t, gitShow(t, gitDir, "main", fmt.Sprintf("demo/core/configmaps/cfg-%d.yaml", i%3)), fmt.Sprintf("key: %d", i))
	}
	require.Equal(t, "seed", gitShow(t, gitDir, "main", "seed/file.txt"))
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
}

// compactionsOf is how often the workers of m cut their stores back in the way kind.
func compactionsOf(m *Metrics, kind string) int {
	return int(testutil.ToFloat64(m.compactions.WithLabelValues(kind)))
}

// After the worker rebuilt its commits on another writer's, its path counts describe a tip it
// left: the next compaction is a full one, and pruning resumes after it. Nothing is lost.
func TestWorkingStoreCompactedInFullAfterRebuild(t *testing.T) {
	gitDir, url := newBareRemote(t)
	tw, opts := compactingWorker(t, url)
	tw.start(t)
	kind := func(k string) int { return compactionsOf(opts.Metrics, k) }

	submit := func(i int) {
		tw.Submit("", by([]string{"alice", "bob"}[i%2], fmt.Sprintf("a%d", i), cmChange(watch.OpUpdate, "demo", fmt.Sprintf("cfg-%d", i%2), fmt.Sprint(i))))
		waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == i+1 })
	}
	submit(0)
	submit(1)
	waitFor(t, "pruned", func() bool { return kind(compactionPrune) > 0 })

	pushCommitFromClone(t, url, "main", "README.md", "hello\n")
	full := kind(compactionFull)
	submit(2) // rejected, rebuilt on the other writer's commit
	waitFor(t, "compacted in full", func() bool { return kind(compactionFull) > full })
	pruned := kind(compactionPrune)
	submit(3)
	waitFor(t, "pruned again", func() bool { return kind(compactionPrune) > pruned })
	require.NoError(t, tw.stop(t))

	require.Len(t, gitLog(t, gitDir, "main", "%s"), 5)
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg-0.yaml"), "key: 2")
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg-1.yaml"), "key: 3")
	require.Equal(t, "hello", gitShow(t, gitDir, "main", "README.md"))
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
}

// compactingWorker returns a worker on url, not started, that commits each change at once and
// cuts its store back after every sync (never for the count of its objects).
func compactingWorker(t *testing.T, url string) (*testWorker, Options) {
	opts := testOptions(url)
	opts.CommitWindow = time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	tw.compactEvery = 1 << 30
	tw.compactBytes = 1
	return tw, opts
}

// A worker with nothing to do for a while compacts its store back to the tip's trees and drops
// its parsed trees; a worker with work does not, and commits after the trim land correctly.
func TestIdleWorkerTrimsItsStore(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	tw.compactEvery = 1 << 30 // never by count
	tw.idleTrim = 300 * time.Millisecond
	tw.start(t)

	for i := range 4 {
		user := []string{"alice", "bob"}[i%2] // alternating authors: one commit each
		tw.Submit("", by(user, fmt.Sprintf("a%d", i), cmChange(watch.OpUpdate, "demo", fmt.Sprintf("cfg-%d", i), fmt.Sprint(i))))
		waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == i+1 })
	}
	// Four commits wrote four blobs, four configmaps trees and their parents; the trimmed store
	// keeps the tip's trees (root, demo, core, configmaps) and its commit object.
	waitFor(t, "store trimmed", func() bool { return strings.Contains(tw.logs.String(), "idle: working store trimmed") })
	require.Equal(t, 1, strings.Count(tw.logs.String(), "idle: working store trimmed"), "once per idle spell")
	require.InDelta(t, 4+1, testutil.ToFloat64(opts.Metrics.storeObjects), 0)

	tw.Submit("", by("carol", "a9", cmChange(watch.OpUpdate, "demo", "cfg-0", "after")))
	waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == 5 })
	waitFor(t, "trimmed again", func() bool { return strings.Count(tw.logs.String(), "idle: working store trimmed") == 2 })
	require.NoError(t, tw.stop(t))

	require.Len(t, gitLog(t, gitDir, "main", "%s"), 5)
	require.Len(t, gitFiles(t, gitDir, "main"), 4)
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg-0.yaml"), "key: after")
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg-3.yaml"), "key: 3")
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
}
