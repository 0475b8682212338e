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

// The working store does not grow with the history: once pushed, it is compacted back to the
// tip's trees (and the commit objects of recent history), and commits built after a compaction
// still land correctly on the remote.
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
	// The tip's trees (root, seed, demo, core, configmaps) and the history's commit objects,
	// plus fewer than compactEvery objects since the last compaction; 30 commits wrote 180.
	waitFor(t, "store compacted", func() bool {
		return testutil.ToFloat64(opts.Metrics.storeObjects) <= 5+commits+1+10
	})
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.unpushed), 0)
	require.NoError(t, tw.stop(t))
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.storeObjects), 0, "a stopped worker holds nothing")

	require.Len(t, gitLog(t, gitDir, "main", "%s"), commits+1)
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg.yaml"), fmt.Sprintf("key: %d", commits-1))
	require.Equal(t, "seed", gitShow(t, gitDir, "main", "seed/file.txt"))
	runGit(t, "", "--git-dir="+gitDir, "fsck", "--strict")
	require.Contains(t, tw.logs.String(), "working store compacted")
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
	opts := testOptions(url)
	opts.CommitWindow = time.Millisecond
	tw := newTestWorker(t, opts)
	tw.compactEvery = 1 << 30 // never by count
	tw.compactBytes = 1       // after every push
	tw.start(t)
	for i := range 3 {
		user := []string{"alice", "bob"}[i%2]
		tw.Submit("", by(user, fmt.Sprintf("a%d", i), cmChange(watch.OpUpdate, "demo", "cfg", fmt.Sprint(i))))
		waitFor(t, "pushed", func() bool { return len(tw.pushes.commits()) == i+1 })
	}
	waitFor(t, "store compacted", func() bool { return strings.Contains(tw.logs.String(), "working store compacted") })
}

// Compaction does not wait for everything to be pushed: while the remote refuses pushes, the
// store is compacted around the unpushed commits (their objects and the remote tip's trees
// stay), and the commits land whole once it accepts them again.
func TestWorkingStoreIsCompactedAroundUnpushedCommits(t *testing.T) {
	gitDir, url := newBareRemote(t)
	seedRemote(t, url, "seed/file.txt", "seed\n") // not a manifest: the folder gate passes it
	opts := testOptions(url)
	opts.CommitWindow = time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	tw.compactEvery = 1 << 30 // never by count
	tw.compactBytes = 1       // after every sync
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
				strings.Count(tw.logs.String(), "working store compacted") > i
		})
	}
	require.Empty(t, tw.pushes.commits())

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
