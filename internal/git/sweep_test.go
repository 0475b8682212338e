package git

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func snapshotOf(c watch.Change) attribution.AttributedChange {
	c.Snapshot = true
	return attribution.AttributedChange{Change: c}
}

func sweepOf(scope string, keep ...string) attribution.AttributedChange {
	k := map[string]bool{}
	for _, name := range keep {
		k[name] = true
	}
	return snapshotOf(watch.Change{Cluster: "prod", Target: tenants, GVR: configMaps, Scope: scope, Op: watch.OpSweep, Keep: k})
}

// TestSweepRemovesOnlyTheGoneObjectsOfItsResourceAndFolder: a sweep deletes the files of its
// resource, in its target's folder and namespace scope, whose objects it does not keep. Other
// resources, other namespaces (for a namespaced sweep) and other folders stay. The commit lists
// only what it changes, and a later sweep that changes nothing makes no commit but still
// settles.
func TestSweepRemovesOnlyTheGoneObjectsOfItsResourceAndFolder(t *testing.T) {
	dir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := startWorker(t, opts)
	secretsLike := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	widget := cmChange(watch.OpCreate, "shop", "w1", "x")
	widget.GVR = secretsLike
	for _, c := range []watch.Change{
		cmChange(watch.OpCreate, "shop", "kept", "1"),
		cmChange(watch.OpCreate, "shop", "gone", "1"),
		cmChange(watch.OpCreate, "other", "elsewhere", "1"),
		widget,
	} {
		tw.Submit("prod", by("alice", "a1", c))
	}
	tw.Submit("staging", by("alice", "a1", cmChange(watch.OpCreate, "shop", "gone", "1")))
	require.Eventually(t, func() bool { return len(tw.pushes.commits()) == 2 }, 20*time.Second, 10*time.Millisecond)

	// The snapshot after a restart: "kept" unchanged, a new object, and the sweep of shop.
	tw.Submit("prod", snapshotOf(cmChange(watch.OpCreate, "shop", "kept", "1")))
	tw.Submit("prod", snapshotOf(cmChange(watch.OpCreate, "shop", "fresh", "1")))
	tw.Submit("prod", sweepOf("shop", "shop/kept", "shop/fresh"))
	require.Eventually(t, func() bool { return len(tw.pushes.commits()) == 3 }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{
		"prod/other/core/configmaps/elsewhere.yaml",
		"prod/shop/core/configmaps/fresh.yaml",
		"prod/shop/core/configmaps/kept.yaml",
		"prod/shop/example.com/widgets/w1.yaml",
		"staging/shop/core/configmaps/gone.yaml",
	}, gitFiles(t, dir, "main"))
	msg := runGit(t, "", "--git-dir="+dir, "log", "-1", "--format=%B", "main")
	require.True(t, strings.HasPrefix(msg, "Snapshot of 2 objects"), msg)
	require.Contains(t, msg, "create core/configmaps shop/fresh")
	require.Contains(t, msg, "delete core/configmaps shop/gone")
	require.NotContains(t, msg, "shop/kept", "an unchanged object is not listed")
	require.Contains(t, msg, "Kubescribe-Attribution: snapshot")
	last := tw.pushes.commits()[2]
	var covered []string
	for _, c := range last.Changes {
		covered = append(covered, string(c.Op)+" "+c.Namespace+"/"+c.Name)
	}
	require.ElementsMatch(t, []string{"create shop/kept", "create shop/fresh", "sweep /", "delete shop/gone"}, covered,
		"the commit covers every change, so the cursors advance past them all, and the sweep, so a retarget can wait for it")

	// A sweep of all namespaces keeping everything, and an unchanged object: no commit, settled.
	tw.Submit("prod", snapshotOf(cmChange(watch.OpCreate, "shop", "kept", "1")))
	tw.Submit("prod", sweepOf("", "shop/kept", "shop/fresh", "other/elsewhere"))
	require.Eventually(t, func() bool {
		tw.pushes.mu.Lock()
		defer tw.pushes.mu.Unlock()
		for _, r := range tw.pushes.results {
			if len(r.Commits) == 0 && len(r.Settled) == 2 && r.Settled[0].Name == "kept" && r.Settled[1].Op == watch.OpSweep {
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "the no-op change and the sweep are reported as settled")
	require.Len(t, tw.pushes.commits(), 3)

	// A sweep of all namespaces removes what it does not keep in every namespace.
	tw.Submit("prod", sweepOf("", "shop/kept"))
	require.Eventually(t, func() bool { return len(tw.pushes.commits()) == 4 }, 20*time.Second, 10*time.Millisecond)
	files := strings.Join(gitFiles(t, dir, "main"), " ")
	require.NotContains(t, files, "prod/other/core/configmaps/elsewhere.yaml")
	require.NotContains(t, files, "prod/shop/core/configmaps/fresh.yaml")
	require.Contains(t, files, "prod/shop/core/configmaps/kept.yaml")
	require.Contains(t, files, "prod/shop/example.com/widgets/w1.yaml", "another resource is not swept")
	require.Contains(t, files, "staging/shop/core/configmaps/gone.yaml", "another folder is not swept")
}

// TestCommitsAheadOfAPushAreBounded: under a stream of changes from alternating authors (each
// change its own commit), at most maxUnpushedCommits commits are built ahead of a push; the
// rest waits queued, and everything is delivered in order.
func TestCommitsAheadOfAPushAreBounded(t *testing.T) {
	dir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = time.Hour // only a change of author closes a window
	tw := newTestWorker(t, opts)
	var most int
	tw.pushFn = func(ctx context.Context) error {
		most = max(most, len(tw.plans)) // the worker goroutine runs pushFn
		return tw.pushOnce(ctx)
	}
	const n = 3*maxUnpushedCommits + 7
	for i := range n {
		user := []string{"alice", "bob"}[i%2]
		tw.Submit("", by(user, fmt.Sprintf("a%d", i), cmChange(watch.OpUpdate, "demo", "cfg", fmt.Sprint(i))))
	}
	tw.Submit("", by("carol", "last", cmChange(watch.OpUpdate, "demo", "cfg", "last"))) // closes bob's window
	tw.start(t)
	require.Eventually(t, func() bool { return len(tw.pushes.commits()) == n }, 60*time.Second, 10*time.Millisecond)
	require.LessOrEqual(t, most, maxUnpushedCommits)
	require.Contains(t, gitShow(t, dir, "main", "demo/core/configmaps/cfg.yaml"), fmt.Sprint(n-1))
}
