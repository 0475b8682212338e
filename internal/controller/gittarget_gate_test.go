package controller

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/stretchr/testify/require"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// TestSyncTargetReportsRefusedFolder: a GitTarget whose folder holds a Helm chart gets no
// commit; it is Ready=False with reason FolderNotAdoptable, and the message names the analyzer's
// code and the file. It keeps its route, so its changes wait for the folder to be fixed. A
// target beside it writes, and its status records the tree its push left in its folder.
func TestSyncTargetReportsRefusedFolder(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{
			newProvider("git", bareRepo, func(p *v1alpha1.GitProvider) {
				p.Spec.CommitWindow = &metav1.Duration{Duration: 10 * time.Millisecond}
			}),
			newTarget("web", "git", "main", "apps"),
			newTarget("db", "git", "main", "data"),
		},
		secrets: []runtime.Object{credsSecret()},
	})
	work := filepath.Join(t.TempDir(), "work")
	runGit(t, "", "init", "-q", "-b", "main", work)
	require.NoError(t, os.MkdirAll(filepath.Join(work, "apps", "chart"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(work, "apps", "chart", "Chart.yaml"), []byte("apiVersion: v2\nname: web\nversion: 0.1.0\n"), 0o644))
	runGit(t, work, "add", ".")
	runGit(t, work, "-c", "user.name=bob", "-c", "user.email=bob@example.com", "commit", "-q", "-m", "chart")
	runGit(t, work, "push", "-q", "file://"+f.repoDir, "main")

	f.makeReady()
	require.NoError(t, f.syncTarget("db"))
	f.router.Deliver(attributed(configMapChange("web", "settings")))
	f.router.Deliver(attributed(configMapChange("db", "settings")))
	waitFor(t, 15*time.Second, "the folder check", func() bool {
		return f.router.TargetStatus(nn("web")).FolderRefused != nil && f.router.TargetStatus(nn("db")).LastCommit != ""
	})

	require.NoError(t, f.syncTarget("web"))
	got := f.target("web")
	requireReady(t, got.Status.Conditions, got.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonFolderNotAdoptable,
		`folder "apps" may not become a GitTarget: templated-content`, "chart/Chart.yaml: a Helm chart", "held until the folder is fixed")
	require.Empty(t, got.Status.LastCommit)
	_, routed := f.route("web")
	require.True(t, routed, "a target whose folder is refused keeps its route: its changes wait")
	require.Equal(t, []string{"apps/chart/Chart.yaml", "data/" + testNS + "/core/configmaps/settings.yaml"}, branchFiles(f.repoDir, "main"))

	require.NoError(t, f.syncTarget("db"))
	db := f.target("db")
	requireReady(t, db.Status.Conditions, db.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.Equal(t, runGit(t, "", "--git-dir="+f.repoDir, "rev-parse", "main:data"), db.Status.FolderTree)
}
