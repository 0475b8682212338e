package git

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

func TestFirstCommitIntoEmptyRemote(t *testing.T) {
	gitDir, url := newBareRemote(t)
	reg := prometheus.NewRegistry()
	opts := testOptions(url)
	opts.Metrics = NewMetrics(reg)
	opts.CommitWindow = 10 * time.Millisecond
	tw := startWorker(t, opts)

	tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app-config", "v1")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))

	lines := gitLog(t, gitDir, "main", "p:%P|%an|%ae|%aI|%cn|%ce|%cI|%s")
	require.Equal(t, []string{
		"p:|alice|alice@users.example.com|2026-03-04T05:06:07+00:00|kubescribe|kubescribe@example.com|2026-03-04T06:00:00+00:00|create configmaps demo/app-config",
	}, lines)
	require.Equal(t, []string{"clusters/prod/demo/core/configmaps/app-config.yaml"}, gitFiles(t, gitDir, "main"))
	require.Equal(t, strings.TrimSpace(string(manifest("ConfigMap", "demo", "app-config", "v1"))),
		gitShow(t, gitDir, "main", "clusters/prod/demo/core/configmaps/app-config.yaml"))

	body := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%B", "main")
	require.Equal(t, "create configmaps demo/app-config\n\n"+
		"create core/configmaps demo/app-config resourceVersion=100 uid=uid-app-config\n\n"+
		"Kubescribe-User: alice\n"+
		"Kubescribe-Audit-ID: a1\n"+
		"Kubescribe-Attribution: resolved\n"+
		"Kubescribe-Cluster: prod", body)

	pushed := tw.pushes.commits()
	require.Len(t, pushed, 1)
	require.Equal(t, gitLog(t, gitDir, "main", "%H")[0], pushed[0].SHA)
	require.Equal(t, tenants, pushed[0].Target)
	require.Len(t, pushed[0].Changes, 1)

	st := tw.Status()
	require.Equal(t, fixedNow, st.LastPush)
	require.NoError(t, st.LastError)
	require.Zero(t, st.Pending)

	require.InDelta(t, 1, testutil.ToFloat64(opts.Metrics.commits), 0)
	require.InDelta(t, 1, testutil.ToFloat64(opts.Metrics.pushes.WithLabelValues(pushResultSuccess)), 0)
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pushes.WithLabelValues(pushResultError)), 0)
	require.InDelta(t, 0, testutil.ToFloat64(opts.Metrics.pending), 0)
	require.Equal(t, 1, testutil.CollectAndCount(opts.Metrics.pushDuration))
}

func TestCommitWindow(t *testing.T) {
	a1 := by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1"))
	a2 := by("alice", "a2", cmChange(watch.OpUpdate, "demo", "two", "2"))
	b3 := by("bob", "b3", cmChange(watch.OpCreate, "demo", "three", "3"))
	otherTarget := by("alice", "a4", cmChange(watch.OpCreate, "demo", "four", "4"))
	otherTarget.Target = otherTgt

	tests := []struct {
		name string
		// batches are submitted one after the other; each batch is pushed before the next
		// when the window is short.
		batches     [][]attribution.AttributedChange
		window      time.Duration
		wantSubject []string // newest first
	}{
		{
			name:        "same author merges",
			batches:     [][]attribution.AttributedChange{{a1, a2}},
			window:      time.Hour,
			wantSubject: []string{"2 changes by alice"},
		},
		{
			name:        "other author closes the window",
			batches:     [][]attribution.AttributedChange{{a1, b3, a2}},
			window:      time.Hour,
			wantSubject: []string{"update configmaps demo/two", "create configmaps demo/three", "create configmaps demo/one"},
		},
		{
			name:        "other target closes the window",
			batches:     [][]attribution.AttributedChange{{a1, otherTarget, a2}},
			window:      time.Hour,
			wantSubject: []string{"update configmaps demo/two", "create configmaps demo/four", "create configmaps demo/one"},
		},
		{
			name:        "timer closes the window",
			batches:     [][]attribution.AttributedChange{{a1}, {a2}},
			window:      20 * time.Millisecond,
			wantSubject: []string{"update configmaps demo/two", "create configmaps demo/one"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gitDir, url := newBareRemote(t)
			opts := testOptions(url)
			opts.CommitWindow = tt.window
			tw := startWorker(t, opts)
			for i, batch := range tt.batches {
				if i > 0 {
					tw.waitPushed(t)
				}
				for _, c := range batch {
					tw.Submit("", c)
				}
			}
			require.NoError(t, tw.stop(t)) // flushes the open window
			require.Equal(t, tt.wantSubject, gitLog(t, gitDir, "main", "%s"))
			require.Len(t, tw.pushes.commits(), len(tt.wantSubject))
		})
	}
}

func TestMergedCommitMessage(t *testing.T) {
	gitDir, url := newBareRemote(t)
	tw := startWorker(t, testOptions(url))
	first := by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1"))
	second := by("alice", "a1", cmChange(watch.OpUpdate, "demo", "two", "2"))
	second.Observed = observedAt.Add(time.Minute)
	third := by("alice", "a2", cmChange(watch.OpCreate, "", "kube-public", "x"))
	third.GVR = namespaces
	for _, c := range []attribution.AttributedChange{first, second, third} {
		tw.Submit("", c)
	}
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"alice|alice@users.example.com|2026-03-04T05:07:07+00:00"},
		gitLog(t, gitDir, "main", "%an|%ae|%aI"), "author time is the newest change's")
	body := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%B", "main")
	require.Equal(t, "3 changes by alice\n\n"+
		"create core/configmaps demo/one resourceVersion=100 uid=uid-one\n"+
		"update core/configmaps demo/two resourceVersion=100 uid=uid-two\n"+
		"create core/namespaces kube-public resourceVersion=100 uid=uid-kube-public\n\n"+
		"Kubescribe-User: alice\n"+
		"Kubescribe-Audit-ID: a1\n"+
		"Kubescribe-Audit-ID: a2\n"+
		"Kubescribe-Attribution: resolved\n"+
		"Kubescribe-Cluster: prod", body)
	trailers := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%(trailers:key=Kubescribe-Audit-ID,valueonly,separator=%x2C)", "main")
	require.Equal(t, "a1,a2", trailers, "git parses the trailers")
	require.Equal(t, []string{
		"_cluster/core/namespaces/kube-public.yaml",
		"demo/core/configmaps/one.yaml",
		"demo/core/configmaps/two.yaml",
	}, gitFiles(t, gitDir, "main"))
}

func TestDeleteRemovesFileAndEmptyDirectories(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := startWorker(t, opts)
	dep := by("alice", "a1", cmChange(watch.OpCreate, "demo", "web", "x"))
	dep.GVR = deploys
	tw.Submit("t", dep)
	tw.Submit("t", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "y")))
	tw.Submit("t", by("alice", "a1", cmChange(watch.OpCreate, "other", "cfg", "z")))
	tw.waitPushed(t)
	require.Equal(t, []string{
		"t/demo/apps/deployments/web.yaml",
		"t/demo/core/configmaps/cfg.yaml",
		"t/other/core/configmaps/cfg.yaml",
	}, gitFiles(t, gitDir, "main"))

	del := by("bob", "b1", cmChange(watch.OpDelete, "other", "cfg", ""))
	tw.Submit("t", del)
	tw.waitPushed(t)
	require.Equal(t, []string{
		"t/demo/apps/deployments/web.yaml",
		"t/demo/core/configmaps/cfg.yaml",
	}, gitFiles(t, gitDir, "main"))
	require.Empty(t, runGit(t, "", "--git-dir="+gitDir, "ls-tree", "main:t", "other"), "empty directories vanish")

	depDel := by("bob", "b2", cmChange(watch.OpDelete, "demo", "web", ""))
	depDel.GVR = deploys
	tw.Submit("t", depDel)
	require.NoError(t, tw.stop(t))
	require.Equal(t, []string{"t/demo/core/configmaps/cfg.yaml"}, gitFiles(t, gitDir, "main"))
	require.Equal(t, []string{"delete deployments demo/web", "delete configmaps other/cfg", "3 changes by alice"},
		gitLog(t, gitDir, "main", "%s"))
}

func TestNoCommitWithoutTreeChange(t *testing.T) {
	tests := []struct {
		name   string
		second attribution.AttributedChange
	}{
		{name: "byte-identical rewrite", second: by("bob", "b1", cmChange(watch.OpUpdate, "demo", "cfg", "same"))},
		{name: "delete of a missing object", second: by("bob", "b1", cmChange(watch.OpDelete, "demo", "missing", ""))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gitDir, url := newBareRemote(t)
			opts := testOptions(url)
			opts.CommitWindow = 10 * time.Millisecond
			tw := startWorker(t, opts)
			tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "same")))
			tw.waitPushed(t)

			tw.Submit("", tt.second)
			require.Eventually(t, func() bool { return tw.Status().Pending == 0 }, 10*time.Second, 10*time.Millisecond)
			require.NoError(t, tw.stop(t))
			require.Equal(t, 1, strings.Count(tw.logs.String(), "msg=committed "), "no local commit either")
			require.Len(t, gitLog(t, gitDir, "main", "%H"), 1)
			require.Len(t, tw.pushes.commits(), 1)
		})
	}
}

func TestUnresolvedAuthor(t *testing.T) {
	gitDir, url := newBareRemote(t)
	tw := startWorker(t, testOptions(url))
	tw.Submit("", unresolved(cmChange(watch.OpUpdate, "demo", "cfg", "1")))
	tw.Submit("", unresolved(cmChange(watch.OpUpdate, "demo", "cfg2", "1")))
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"unknown (attribution unresolved)|unknown@users.example.com|kubescribe|kubescribe@example.com"},
		gitLog(t, gitDir, "main", "%an|%ae|%cn|%ce"))
	body := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%B", "main")
	require.Contains(t, body, "2 changes by unknown (attribution unresolved)\n")
	require.Contains(t, body, "Kubescribe-User: unknown (attribution unresolved)\nKubescribe-Attribution: unresolved\n")
	require.NotContains(t, body, "Kubescribe-Audit-ID")
}

func TestSnapshotAuthoredByCommitter(t *testing.T) {
	gitDir, url := newBareRemote(t)
	tw := startWorker(t, testOptions(url))
	for _, name := range []string{"a", "b"} {
		c := unresolved(cmChange(watch.OpCreate, "demo", name, "1"))
		c.Snapshot = true
		tw.Submit("", c)
	}
	// A real change after the snapshot is its own commit.
	tw.Submit("", by("alice", "a1", cmChange(watch.OpUpdate, "demo", "a", "2")))
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{
		"alice|alice@users.example.com|update configmaps demo/a",
		"kubescribe|kubescribe@example.com|Snapshot of 2 objects",
	}, gitLog(t, gitDir, "main", "%an|%ae|%s"))
	body := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%B", "main~1")
	require.Contains(t, body, "Kubescribe-Attribution: snapshot\n")
	require.NotContains(t, body, "Kubescribe-User")
}

func TestNonFastForwardRebuildsPendingCommits(t *testing.T) {
	gitDir, url := newBareRemote(t)
	reg := prometheus.NewRegistry()
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(reg)
	tw := startWorker(t, opts)
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "cfg", "1")))
	tw.waitPushed(t)

	// Another writer pushes to the branch; the worker does not know.
	pushCommitFromClone(t, url, "main", "README.md", "hello\n")
	bobTip := gitLog(t, gitDir, "main", "%H")[0]

	tw.Submit("", by("carol", "c1", cmChange(watch.OpUpdate, "demo", "cfg", "2")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{
		"carol|update configmaps demo/cfg",
		"bob|manual edit",
		"alice|create configmaps demo/cfg",
	}, gitLog(t, gitDir, "main", "%an|%s"))
	require.Equal(t, bobTip, gitLog(t, gitDir, "main", "%P")[0], "rebuilt on the other writer's commit")
	require.Equal(t, []string{"README.md", "demo/core/configmaps/cfg.yaml"}, gitFiles(t, gitDir, "main"))
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg.yaml"), "key: 2")
	require.Contains(t, runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%B", "main"), "Kubescribe-Audit-ID: c1")

	pushed := tw.pushes.commits()
	require.Len(t, pushed, 2)
	require.Equal(t, gitLog(t, gitDir, "main", "%H")[0], pushed[1].SHA, "OnPushed reports the rebuilt commit")
	require.InDelta(t, 1, testutil.ToFloat64(opts.Metrics.pushes.WithLabelValues(pushResultRejected)), 0)
	require.InDelta(t, 2, testutil.ToFloat64(opts.Metrics.pushes.WithLabelValues(pushResultSuccess)), 0)
	require.InDelta(t, 2, testutil.ToFloat64(opts.Metrics.commits), 0)
}

func TestNonFastForwardWithSameContentDropsNothingButTheNoop(t *testing.T) {
	gitDir, url, tw := startPushed(t, "", nil, "cfg")

	// The other writer makes exactly our next change, and one more.
	pushCommitFromClone(t, url, "main", "demo/core/configmaps/cfg.yaml", string(manifest("ConfigMap", "demo", "cfg", "2")))
	tw.Submit("", by("carol", "c1", cmChange(watch.OpUpdate, "demo", "cfg", "2")))
	require.Eventually(t, func() bool { return tw.Status().Pending == 0 }, 10*time.Second, 10*time.Millisecond)
	tw.Submit("", by("carol", "c2", cmChange(watch.OpUpdate, "demo", "cfg", "3")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))

	require.Equal(t, []string{"carol|update configmaps demo/cfg", "bob|manual edit", "alice|create configmaps demo/cfg"},
		gitLog(t, gitDir, "main", "%an|%s"))
	require.Contains(t, gitShow(t, gitDir, "main", "demo/core/configmaps/cfg.yaml"), "key: 3")
}

// TestUnchangedChangeChecksTheBranchAsItIsNow: a stream that resumes hands over the objects
// its cursor says the folder holds (Unchanged). While the worker ran, another writer removed
// one of those files; the worker learns of it only when it looks at the remote, which it does
// before it decides that an unchanged object needs no commit: the file is written again, on top
// of the other writer's commit, as the committer's snapshot. An unchanged object whose file is
// there makes no commit.
func TestUnchangedChangeChecksTheBranchAsItIsNow(t *testing.T) {
	gitDir, url, tw := startPushed(t, "", nil, "kept", "lost")

	// Another writer removes one file; the worker does not know.
	removeFromClone(t, url, "main", "demo/core/configmaps/lost.yaml", "bob removes lost")
	bobTip := gitLog(t, gitDir, "main", "%H")[0]

	for _, name := range []string{"kept", "lost"} {
		tw.Submit("", unchangedObject(name, "1"))
	}
	require.Eventually(t, func() bool { return len(gitLog(t, gitDir, "main", "%H")) == 3 }, 20*time.Second, 10*time.Millisecond,
		"the lost file is written again: %v", gitLog(t, gitDir, "main", "%an|%s"))
	require.NoError(t, tw.stop(t))
	require.Equal(t, []string{
		"kubescribe|Snapshot of configmaps demo/lost",
		"bob|bob removes lost",
	}, gitLog(t, gitDir, "main", "%an|%s")[:2])
	require.Equal(t, bobTip, gitLog(t, gitDir, "main", "%P")[0], "on top of the other writer's commit")
	require.Equal(t, []string{"demo/core/configmaps/kept.yaml", "demo/core/configmaps/lost.yaml"}, gitFiles(t, gitDir, "main"))
	body := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%B", "main")
	require.Contains(t, body, "create core/configmaps demo/lost")
	require.NotContains(t, body, "demo/kept", "an unchanged object whose file is there is not listed")
	logs := tw.logs.String()
	require.Equal(t, 1, strings.Count(logs, `msg="restoring files the branch lost since they were pushed"`), "the restore is logged once: %s", logs)
	require.Contains(t, logs, "target=kubescribe/tenants files=1")
}

func TestRemoteUnavailable(t *testing.T) {
	tests := []struct {
		name string
		// pushFirst makes one successful push before the remote goes away.
		pushFirst bool
	}{
		{name: "unavailable at start"},
		{name: "unavailable after a push", pushFirst: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gitDir, url := newBareRemote(t)
			hidden := gitDir + ".away"
			opts := testOptions(url)
			opts.CommitWindow = 10 * time.Millisecond
			var tw *testWorker
			if tt.pushFirst {
				tw = startWorker(t, opts)
				tw.Submit("", by("alice", "a0", cmChange(watch.OpCreate, "demo", "zero", "0")))
				tw.waitPushed(t)
				require.NoError(t, os.Rename(gitDir, hidden))
			} else {
				require.NoError(t, os.Rename(gitDir, hidden))
				tw = startWorker(t, opts)
			}

			tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
			tw.Submit("", by("bob", "b1", cmChange(watch.OpCreate, "demo", "two", "2")))
			require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 10*time.Second, 10*time.Millisecond)
			time.Sleep(100 * time.Millisecond) // several failed attempts
			st := tw.Status()
			require.Equal(t, 2, st.Pending, "nothing is lost while the remote is away")
			require.Error(t, st.LastError)

			require.NoError(t, os.Rename(hidden, gitDir))
			tw.waitPushed(t)
			require.NoError(t, tw.stop(t))
			require.NoError(t, tw.Status().LastError)

			want := []string{"create configmaps demo/two", "create configmaps demo/one"}
			if tt.pushFirst {
				want = append(want, "create configmaps demo/zero")
			}
			require.Equal(t, want, gitLog(t, gitDir, "main", "%s"))
		})
	}
}

func TestShutdownReportsUnpushedChanges(t *testing.T) {
	gitDir, url := newBareRemote(t)
	require.NoError(t, os.RemoveAll(gitDir))
	tw := startWorker(t, testOptions(url))
	tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
	err := tw.stop(t)
	require.ErrorContains(t, err, "git: 1 changes not pushed to branch \"main\"")
}

func TestBranches(t *testing.T) {
	tests := []struct {
		name string
		// existing is the branch another writer created before the worker starts.
		existing   string
		wantParent bool
	}{
		{name: "unrelated branch is untouched", existing: "other"},
		{name: "existing branch is continued", existing: "main", wantParent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gitDir, url := newBareRemote(t)
			seed := t.TempDir()
			runGit(t, seed, "init", "-q", "--initial-branch="+tt.existing)
			require.NoError(t, os.WriteFile(seed+"/README.md", []byte("seed\n"), 0o644))
			runGit(t, seed, "add", "README.md")
			runGit(t, seed, "-c", "user.name=seed", "-c", "user.email=seed@example.com", "commit", "-q", "-m", "seed")
			runGit(t, seed, "push", "-q", url, tt.existing)
			existingTip := gitLog(t, gitDir, tt.existing, "%H")[0]

			tw := startWorker(t, testOptions(url))
			tw.Submit("", by("alice", "a1", cmChange(watch.OpCreate, "demo", "one", "1")))
			require.NoError(t, tw.stop(t))

			parents := gitLog(t, gitDir, "main", "p:%P")
			if tt.wantParent {
				require.Equal(t, []string{"p:" + existingTip, "p:"}, parents)
				require.Equal(t, []string{"README.md", "demo/core/configmaps/one.yaml"}, gitFiles(t, gitDir, "main"))
				return
			}
			require.Equal(t, []string{"p:"}, parents, "the new branch starts without parent")
			require.Equal(t, []string{"demo/core/configmaps/one.yaml"}, gitFiles(t, gitDir, "main"))
			require.Equal(t, existingTip, gitLog(t, gitDir, tt.existing, "%H")[0])
			require.Len(t, gitLog(t, gitDir, tt.existing, "%H"), 1)
		})
	}
}

func TestInvalidChangeIsSkipped(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	tw.Submit("apps", by("alice", "a1", cmChange(watch.OpCreate, "demo", "a/b", "1")))
	// A non-conformant server's namespace "..": path.Join would make it .github/workflows/...
	escape := by("alice", "a2", cmChange(watch.OpCreate, "..", "evil", "1"))
	escape.GVR.Group, escape.GVR.Resource = ".github", "workflows"
	tw.Submit("apps", escape)
	tw.Submit("apps", by("alice", "a3", cmChange(watch.OpCreate, "demo", "ok", "1")))
	require.NoError(t, tw.stop(t))
	require.Equal(t, []string{"apps/demo/core/configmaps/ok.yaml"}, gitFiles(t, gitDir, "main"))
	require.Contains(t, tw.logs.String(), "change cannot be stored in git")
	require.Contains(t, tw.logs.String(), `namespace \"..\" is a relative path`)
	require.InDelta(t, 2, testutil.ToFloat64(opts.Metrics.invalid), 0)
}

func TestRunTwice(t *testing.T) {
	_, url := newBareRemote(t)
	tw := startWorker(t, testOptions(url))
	require.Eventually(t, tw.running.Load, 5*time.Second, time.Millisecond)
	require.ErrorContains(t, tw.Run(t.Context()), "only once")
}

// TestRebuildWithoutCommitReportsItsChanges: changes whose rebuild on the remote tip makes no
// commit (a replay or a restart handing over objects whose files the branch still holds, after
// the worker fetched) are reported as settled although nothing is pushed: the router counts
// them done, and the worker is idle again.
func TestRebuildWithoutCommitReportsItsChanges(t *testing.T) {
	_, url, tw := startPushed(t, "apps", nil, "kept")

	// Someone else's commit inside the folder that leaves the object's file as it is.
	pushCommitFromClone(t, url, "main", "apps/README.md", "hello")
	tw.Submit("apps", unchangedObject("kept", "1"))
	require.Eventually(t, func() bool { return len(tw.pushes.settled()) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the unchanged object is reported although it made no commit: %s", tw.logs.String())
	require.Equal(t, "kept", tw.pushes.settled()[0].Name)
	require.Len(t, tw.pushes.commits(), 1, "nothing is committed")
	require.Eventually(t, func() bool { return tw.Status().Pending == 0 }, 20*time.Second, 10*time.Millisecond)
}

// TestIfMissingRestoresOnlyALostFile: an IfMissing change (an object whose newest write the
// rule excludes) writes its current form where the branch has no file for it, and leaves a file
// that exists as it is, whatever it holds; within one window an earlier change that writes the
// object wins over it.
func TestIfMissingRestoresOnlyALostFile(t *testing.T) {
	gitDir, url, tw := startPushed(t, "", nil, "kept", "lost", "edited")
	removeFromClone(t, url, "main", "demo/core/configmaps/lost.yaml", "bob removes lost")

	ifMissing := func(name, data string) attribution.AttributedChange {
		c := unchangedObject(name, data)
		c.IfMissing = true
		return c
	}
	tw.Submit("", ifMissing("kept", "by-argo"))
	tw.Submit("", ifMissing("lost", "by-argo"))
	tw.Submit("", unchangedObject("edited", "2"))
	tw.Submit("", ifMissing("edited", "by-argo"))
	require.Eventually(t, func() bool { return len(gitLog(t, gitDir, "main", "%H")) == 3 && tw.Status().Pending == 0 }, 20*time.Second, 10*time.Millisecond,
		"%v", gitLog(t, gitDir, "main", "%an|%s"))
	require.Equal(t, "kubescribe|Snapshot of 2 objects", gitLog(t, gitDir, "main", "%an|%s")[0])
	body := runGit(t, "", "--git-dir="+gitDir, "log", "-1", "--format=%B", "main")
	require.Contains(t, body, "create core/configmaps demo/lost")
	require.Contains(t, body, "update core/configmaps demo/edited")
	require.NotContains(t, body, "demo/kept")
	show := func(name string) string {
		return runGit(t, "", "--git-dir="+gitDir, "show", "main:demo/core/configmaps/"+name+".yaml")
	}
	require.Contains(t, show("lost"), "by-argo", "the lost file gets the current form")
	require.NotContains(t, show("kept"), "by-argo", "an existing file is left as it is")
	require.Contains(t, show("edited"), "2", "the window's own write of the object wins")
	require.NotContains(t, show("edited"), "by-argo")
}

// unchangedObject is ConfigMap demo/name as a resumed stream hands over an object the folder
// held in this version at the last push: Unchanged, no author.
func unchangedObject(name, data string) attribution.AttributedChange {
	return replayed(unresolved(cmChange(watch.OpUpdate, "demo", name, data)), true)
}
