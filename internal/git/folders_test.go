package git

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/gittest"
	"github.com/kubescribe/kubescribe/internal/watch"
	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

// pushFiles commits files (path -> content; "" removes the path) to branch main of url, from a
// clone, as a person would; an empty repository gets its first commit.
func pushFiles(t testing.TB, url string, files map[string]string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "clone")
	runGit(t, "", "clone", "-q", url, dir)
	if _, err := gittest.Output(dir, "rev-parse", "-q", "--verify", "origin/main"); err == nil {
		runGit(t, dir, "checkout", "-q", "-B", "main", "origin/main")
	} else {
		runGit(t, dir, "checkout", "-q", "--orphan", "main")
	}
	for p, content := range files {
		full := filepath.Join(dir, p)
		if content == "" {
			runGit(t, dir, "rm", "-q", "-r", p)
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(content), 0o644))
		runGit(t, dir, "add", p)
	}
	runGit(t, dir, "-c", "user.name=bob", "-c", "user.email=bob@example.com", "commit", "-q", "-m", "edit by hand")
	runGit(t, dir, "push", "-q", "origin", "main")
}

const adoptableConfigMap = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: existing\n  namespace: demo\ndata:\n  key: v\n"

func gateMetrics(m *Metrics, result string) float64 {
	return testutil.ToFloat64(m.folderChecks.WithLabelValues(result))
}

func gateFetches(m *Metrics, kind string) float64 {
	return testutil.ToFloat64(m.folderFetch.WithLabelValues(kind))
}

// A folder that may not become a GitTarget's folder gets no commit: the worker holds the
// target's changes and says why, with the analyzer's codes. Once someone fixes the folder, the
// held changes are committed, without a restart.
func TestRefusedFolderHoldsChangesUntilFixed(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		bad   string
		codes []manifestanalyzer.Code
		first string
	}{
		{
			name:  "helm chart",
			file:  "clusters/prod/chart/Chart.yaml",
			bad:   "apiVersion: v2\nname: web\nversion: 0.1.0\n",
			codes: []manifestanalyzer.Code{manifestanalyzer.CodeTemplatedContent},
			first: "chart/Chart.yaml: a Helm chart",
		},
		{
			name:  "unparseable yaml",
			file:  "clusters/prod/demo/core/configmaps/broken.yaml",
			bad:   "apiVersion: v1\nkind: ConfigMap\nmetadata: [name: broken\n",
			codes: []manifestanalyzer.Code{manifestanalyzer.CodeInvalidYAML},
			first: "demo/core/configmaps/broken.yaml:",
		},
		{
			name:  "plaintext secret",
			file:  "clusters/prod/demo/core/secrets/db.yaml",
			bad:   "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: demo\ndata:\n  password: aHVudGVyMg==\n",
			codes: []manifestanalyzer.Code{manifestanalyzer.CodePlaintextSecret},
			first: "demo/core/secrets/db.yaml:6:",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gitDir, url := newBareRemote(t)
			pushFiles(t, url, map[string]string{
				"clusters/prod/demo/core/configmaps/existing.yaml": adoptableConfigMap,
				tt.file: tt.bad,
			})
			opts := testOptions(url)
			opts.CommitWindow = 10 * time.Millisecond
			opts.Metrics = NewMetrics(prometheus.NewRegistry())
			var folders []string
			foldersCh := make(chan string, 10)
			opts.OnFolder = func(f string) { foldersCh <- f }
			tw := newTestWorker(t, opts)
			tw.gateRecheck = 20 * time.Millisecond
			tw.start(t)

			tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
			require.Eventually(t, func() bool { return tw.FolderRefusal("clusters/prod") != nil }, 20*time.Second, 10*time.Millisecond)
			refused := tw.FolderRefusal("/clusters/prod/")
			require.Equal(t, "clusters/prod", refused.Path)
			require.Equal(t, tt.codes, refused.Codes)
			require.Contains(t, refused.Error(), "folder \"clusters/prod\" may not become a GitTarget: "+string(tt.codes[0])+" (first: "+tt.first)
			require.Nil(t, tw.FolderRefusal("clusters/other"))
			folders = append(folders, <-foldersCh)
			require.Equal(t, []string{"clusters/prod"}, folders)
			require.Equal(t, 1, tw.Status().Pending, "the change is held")
			require.Len(t, gitLog(t, gitDir, "main", "%s"), 1, "no commit into a refused folder")
			// The worker's store has no blobs (the remote filters them): the folder's were
			// fetched by id, once; looking again at an unchanged branch fetches nothing more.
			require.InDelta(t, 1, gateFetches(opts.Metrics, folderFetchBlobs), 0)
			require.InDelta(t, 0, gateFetches(opts.Metrics, folderFetchFull), 0)
			require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckRefused), 0)
			require.Empty(t, tw.pushes.commits())
			if tt.name == "helm chart" {
				// Stopped now, the worker reports the held change as not pushed, and why.
				require.ErrorContains(t, tw.stop(t), `git: 1 changes not pushed to branch "main" (1 of them held: their folder did not pass the folder check): nothing else was left to push`)
				return
			}

			// Someone fixes the folder: the held change is committed.
			pushFiles(t, url, map[string]string{tt.file: ""})
			tw.waitPushed(t)
			require.Nil(t, tw.FolderRefusal("clusters/prod"))
			require.Equal(t, []string{"create configmaps demo/app", "edit by hand", "edit by hand"}, gitLog(t, gitDir, "main", "%s"))
			require.Contains(t, gitFiles(t, gitDir, "main"), "clusters/prod/demo/core/configmaps/app.yaml")
			require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckAdoptable), 0)
			require.InDelta(t, 2, gateFetches(opts.Metrics, folderFetchBlobs), 0)
			require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckRefused), 0, "an unchanged refused folder is not scanned again")
			require.NoError(t, tw.stop(t))
		})
	}
}

// An adoptable folder passes: its blobs are fetched once, by id, and the first commit goes on
// top of the foreign files, which stay as they are.
func TestAdoptableFolderPasses(t *testing.T) {
	gitDir, url := newBareRemote(t)
	pushFiles(t, url, map[string]string{
		"clusters/prod/demo/core/configmaps/existing.yaml": adoptableConfigMap,
		"clusters/prod/README.md":                          "managed by kubescribe\n",
		"clusters/staging/chart/Chart.yaml":                "apiVersion: v2\nname: web\nversion: 0.1.0\n",
	})
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))
	require.Equal(t, "create configmaps demo/app", gitLog(t, gitDir, "main", "%s")[0])
	require.Equal(t, adoptableConfigMap[:len(adoptableConfigMap)-1], gitShow(t, gitDir, "main", "clusters/prod/demo/core/configmaps/existing.yaml"))
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckAdoptable), 0)
	require.InDelta(t, 1, gateFetches(opts.Metrics, folderFetchBlobs), 0)
	require.InDelta(t, 0, gateMetrics(opts.Metrics, folderCheckRefused), 0)
}

// A folder that does not exist yet, or that holds exactly what kubescribe last pushed there, is
// not scanned: no blob is fetched, so a restart of a large mirror does not read its files.
func TestKnownFolderIsNotFetched(t *testing.T) {
	gitDir, url := newBareRemote(t)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))
	pushed := tw.pushes.commits()
	require.Len(t, pushed, 1)
	require.Equal(t, "clusters/prod", pushed[0].Path)
	require.Equal(t, runGit(t, "", "--git-dir="+gitDir, "rev-parse", "main:clusters/prod"), pushed[0].FolderTree)
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckKnown), 0, "an absent folder")

	// A new worker (a restart) told what the last push left there.
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	var asked []string
	opts.KnownFolder = func(folder string, tree plumbing.Hash) bool {
		asked = append(asked, folder)
		return tree == plumbing.NewHash(pushed[0].FolderTree)
	}
	tw = startWorker(t, opts)
	tw.Submit("clusters/prod/", by("alice", "a2", cmChange(watch.OpUpdate, "demo", "app", "v2")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))
	require.Equal(t, []string{"clusters/prod"}, asked)
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckKnown), 0)
	require.InDelta(t, 0, gateFetches(opts.Metrics, folderFetchBlobs)+gateFetches(opts.Metrics, folderFetchFull), 0, "nothing fetched for the check")

	// Once someone else changed the folder, it is scanned again.
	pushFiles(t, url, map[string]string{"clusters/prod/demo/core/configmaps/existing.yaml": adoptableConfigMap})
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw = startWorker(t, opts)
	tw.Submit("clusters/prod", by("alice", "a3", cmChange(watch.OpUpdate, "demo", "app", "v3")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckAdoptable), 0)
	require.InDelta(t, 1, gateFetches(opts.Metrics, folderFetchBlobs), 0)
}

// A server that filters blobs but refuses wants of objects it did not advertise is read with
// one depth-1 fetch of the tip, blobs included.
func TestFolderCheckFallsBackToAFullFetch(t *testing.T) {
	gitDir, url := newBareRemote(t)
	runGit(t, "", "--git-dir="+gitDir, "config", "uploadpack.allowAnySHA1InWant", "false")
	pushFiles(t, url, map[string]string{"clusters/prod/demo/core/configmaps/existing.yaml": adoptableConfigMap})
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckAdoptable), 0)
	require.InDelta(t, 0, gateFetches(opts.Metrics, folderFetchBlobs), 0)
	require.InDelta(t, 1, gateFetches(opts.Metrics, folderFetchFull), 0)
	require.Contains(t, tw.logs.String(), "the remote did not serve the folder's files by id")
}

// A GitTarget's folder that is a file on the branch is refused: writing into it would replace
// the file.
func TestFolderThatIsAFileIsRefused(t *testing.T) {
	_, url := newBareRemote(t)
	pushFiles(t, url, map[string]string{"clusters": "not a folder\n"})
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	tw := startWorker(t, opts)
	tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
	require.Eventually(t, func() bool { return tw.FolderRefusal("clusters/prod") != nil }, 20*time.Second, 10*time.Millisecond)
	require.EqualError(t, tw.FolderRefusal("clusters/prod"), `folder "clusters/prod" may not become a GitTarget: "clusters" is a file on the branch, not a folder`)
}

// A close request of a target whose changes are held waits behind them; when no GitTarget
// writes to the folder any more, the held changes are dropped (never committed) and the
// request reports that nothing was closed.
func TestForgottenFolderDropsHeldChanges(t *testing.T) {
	_, url := newBareRemote(t)
	pushFiles(t, url, map[string]string{"clusters/prod/kustomization.yaml": "resources: []\n"})
	opts := testOptions(url)
	closed := make(chan CloseOutcome, 1)
	opts.OnClosed = func(_ string, o CloseOutcome) { closed <- o }
	tw := startWorker(t, opts)
	tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
	require.Eventually(t, func() bool { return tw.FolderRefusal("clusters/prod") != nil }, 20*time.Second, 10*time.Millisecond)
	require.True(t, tw.RequestClose(CloseRequest{ID: "r1", Target: tenants, Username: "alice", Message: "m"}))
	require.Eventually(t, func() bool { return tw.Status().Pending == 1 }, 20*time.Second, 10*time.Millisecond)
	select {
	case o := <-closed:
		t.Fatalf("the close request ended (%s) while its target's changes were held", o)
	default:
	}
	tw.ForgetFolder("clusters/prod")
	require.Equal(t, CloseNoOpenWindow, <-closed)
	require.Eventually(t, func() bool { return tw.Status().Pending == 0 }, 20*time.Second, 10*time.Millisecond)
	require.Nil(t, tw.FolderRefusal("clusters/prod"))
	require.NoError(t, tw.stop(t))
}

// The router reports a refused folder in the target's status, and a worker that replaces
// another (new provider settings) or that runs after a restart does not fetch the files of a
// folder the last push left as it is.
func TestRouterFolderGate(t *testing.T) {
	_, url := newBareRemote(t)
	pushFiles(t, url, map[string]string{
		"clusters/prod/demo/core/configmaps/existing.yaml": adoptableConfigMap,
		"clusters/staging/kustomization.yaml":              "resources: []\n",
	})
	m := NewMetrics(prometheus.NewRegistry())
	r := startRouter(t, RouterOptions{Metrics: m})
	remote := testRemote(url)
	require.NoError(t, r.Route(tenants, Destination{Remote: remote, Branch: "main", Path: "clusters/prod"}))
	require.NoError(t, r.Route(otherTgt, Destination{Remote: remote, Branch: "main", Path: "clusters/staging"}))
	r.Deliver(by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
	staged := cmChange(watch.OpCreate, "demo", "app", "v1")
	staged.Target = otherTgt
	r.Deliver(by("alice", "a2", staged))

	require.Eventually(t, func() bool {
		return r.TargetStatus(tenants).LastCommit != "" && r.TargetStatus(otherTgt).FolderRefused != nil
	}, 20*time.Second, 10*time.Millisecond)
	st := r.TargetStatus(otherTgt)
	require.Equal(t, []manifestanalyzer.Code{manifestanalyzer.CodeTemplatedContent}, st.FolderRefused.Codes)
	require.Equal(t, 1, st.Pending)
	require.Empty(t, st.LastCommit)
	prod := r.TargetStatus(tenants)
	require.Nil(t, prod.FolderRefused)
	require.NotEmpty(t, prod.FolderTree)
	require.InDelta(t, 1, gateFetches(m, folderFetchBlobs), 0, "one fetch for prod; the analyzer reads no file of staging (a kustomization is refused by its name)")

	// Leaving the refused folder drops what was held for it.
	r.Unroute(otherTgt, true)
	require.Eventually(t, func() bool { return r.TargetStatus(tenants).Pending == 0 }, 20*time.Second, 10*time.Millisecond)

	// A worker with other settings replaces the first; the folder is as the last push left it.
	remote.CommitWindow = 20 * time.Millisecond
	require.NoError(t, r.Route(tenants, Destination{Remote: remote, Branch: "main", Path: "clusters/prod"}))
	r.Deliver(by("alice", "a3", cmChange(watch.OpUpdate, "demo", "app", "v2")))
	require.Eventually(t, func() bool { return r.TargetStatus(tenants).LastCommit != prod.LastCommit }, 20*time.Second, 10*time.Millisecond)
	require.InDelta(t, 1, gateMetrics(m, folderCheckKnown), 0)
	require.InDelta(t, 1, gateFetches(m, folderFetchBlobs), 0, "nothing fetched for a folder kubescribe left as it is")

	// After a restart, the record comes back from the GitTarget's status.
	r2 := startRouter(t, RouterOptions{Metrics: m})
	last := r.TargetStatus(tenants)
	r.Unroute(tenants, false)
	r2.KnowFolder(tenants, FolderRecord{Provider: remote.Provider, Branch: "main", Path: "/clusters/prod", Tree: last.FolderTree})
	require.NoError(t, r2.Route(tenants, Destination{Remote: remote, Branch: "main", Path: "clusters/prod"}))
	r2.Deliver(by("alice", "a4", cmChange(watch.OpUpdate, "demo", "app", "v3")))
	require.Eventually(t, func() bool { return r2.TargetStatus(tenants).LastCommit != "" }, 20*time.Second, 10*time.Millisecond)
	require.InDelta(t, 2, gateMetrics(m, folderCheckKnown), 0)
	require.InDelta(t, 1, gateFetches(m, folderFetchBlobs), 0)
}

// A folder a GitTarget is routed to is checked before any change for it arrives, so the refusal
// shows at once; once fixed, the refusal clears.
func TestPreparedFolderIsCheckedBeforeChanges(t *testing.T) {
	_, url := newBareRemote(t)
	pushFiles(t, url, map[string]string{"clusters/prod/kustomization.yaml": "resources: []\n"})
	opts := testOptions(url)
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	tw.gateRecheck = 20 * time.Millisecond
	tw.start(t)
	tw.PrepareFolder("clusters/prod")
	require.Eventually(t, func() bool { return tw.FolderRefusal("clusters/prod") != nil }, 20*time.Second, 10*time.Millisecond)
	require.Zero(t, tw.Status().Pending)
	pushFiles(t, url, map[string]string{"clusters/prod/kustomization.yaml": ""})
	require.Eventually(t, func() bool { return tw.FolderRefusal("clusters/prod") == nil }, 20*time.Second, 10*time.Millisecond)
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckKnown), 0, "the folder is gone: nothing to read")
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckRefused), 0)
	require.NoError(t, tw.stop(t))
}

// A large folder is read a batch of blobs at a time, in the order the analyzer reads its files;
// files the analyzer does not read (README.md, a kustomization) are not fetched at all.
func TestFolderCheckFetchesInBatches(t *testing.T) {
	gitDir, url := newBareRemote(t)
	files := map[string]string{"clusters/prod/README.md": "hello\n"}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		files["clusters/prod/demo/core/configmaps/"+name+".yaml"] = strings.ReplaceAll(adoptableConfigMap, "existing", name)
	}
	pushFiles(t, url, files)
	opts := testOptions(url)
	opts.CommitWindow = 10 * time.Millisecond
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := newTestWorker(t, opts)
	tw.gateBatch = 2
	tw.start(t)
	tw.Submit("clusters/prod", by("alice", "a1", cmChange(watch.OpCreate, "demo", "app", "v1")))
	tw.waitPushed(t)
	require.NoError(t, tw.stop(t))
	require.InDelta(t, 1, gateMetrics(opts.Metrics, folderCheckAdoptable), 0)
	require.InDelta(t, 3, gateFetches(opts.Metrics, folderFetchBlobs), 0, "5 manifests in batches of 2; README.md is not read")
	require.Len(t, gitLog(t, gitDir, "main", "%s"), 2)
}

// A folder whose files cannot be fetched (the remote went away after the clone) is not refused:
// the check fails, is reported as the worker's error, and is retried until it can decide.
func TestFolderCheckFailureIsNoRefusal(t *testing.T) {
	gitDir, url := newBareRemote(t)
	pushFiles(t, url, map[string]string{"clusters/prod/demo/core/configmaps/existing.yaml": adoptableConfigMap})
	opts := testOptions(url)
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	tw := startWorker(t, opts)
	require.Eventually(t, func() bool { return strings.Contains(tw.logs.String(), "msg=cloned") }, 20*time.Second, 10*time.Millisecond, "cloned")

	gone := gitDir + ".away"
	require.NoError(t, os.Rename(gitDir, gone))
	tw.PrepareFolder("clusters/prod")
	require.Eventually(t, func() bool { return tw.Status().LastError != nil }, 20*time.Second, 10*time.Millisecond)
	require.ErrorContains(t, tw.Status().LastError, "check folder")
	require.Nil(t, tw.FolderRefusal("clusters/prod"))
	require.InDelta(t, 0, gateMetrics(opts.Metrics, folderCheckRefused), 0)

	require.NoError(t, os.Rename(gone, gitDir))
	require.Eventually(t, func() bool { return gateMetrics(opts.Metrics, folderCheckAdoptable) == 1 }, 20*time.Second, 10*time.Millisecond)
	require.Nil(t, tw.FolderRefusal("clusters/prod"))
	require.Eventually(t, func() bool { return tw.Status().LastError == nil }, 20*time.Second, 10*time.Millisecond, "the check could decide: its failure is over")
	require.GreaterOrEqual(t, gateMetrics(opts.Metrics, folderCheckError), 1.0)
	require.NoError(t, tw.stop(t))
}
