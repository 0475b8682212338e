package controller

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// TestSyncTargetReplaysWhenTheBranchStartedOver: the branch is deleted on the server and its
// objects collected; the worker's next push is refused and it starts the branch over. The
// router has the GitTarget's rule's stream hand the whole state over again, without waiting for
// a sync, so the branch comes back with every file; the next sync records a Warning event, and
// a later one does not report it again.
func TestSyncTargetReplaysWhenTheBranchStartedOver(t *testing.T) {
	f := newFixture(t, fixtureConfig{objects: retargetSeed("apps"), secrets: []runtime.Object{credsSecret()}})
	f.settledAt("main", "apps")
	runGit(t, "", "--git-dir="+f.repoDir, "update-ref", "-d", "refs/heads/main")
	runGit(t, "", "--git-dir="+f.repoDir, "reflog", "expire", "--expire=now", "--all")
	runGit(t, "", "--git-dir="+f.repoDir, "gc", "--quiet", "--prune=now")

	_, err := f.dyn.Resource(configMapsGVR).Namespace(testNS).Create(context.Background(), newConfigMap("second"), metav1.CreateOptions{})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the start-over", func() bool { return f.router.TargetStatus(nn("web")).StartOvers == 1 })
	want := []string{"apps/" + testNS + "/core/configmaps/second.yaml", "apps/" + testNS + "/core/configmaps/settings.yaml"}
	waitFor(t, 30*time.Second, "every file on the branch again", func() bool { return slices.Equal(branchFiles(f.repoDir, "main"), want) })
	require.NoError(t, f.syncTarget("web"))

	waitFor(t, 10*time.Second, "the BranchStartedOver event", func() bool {
		list, err := f.kube.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		for _, e := range list.Items {
			if e.Reason == v1alpha1.ReasonBranchStartedOver && e.InvolvedObject.Name == "web" && e.Type == corev1.EventTypeWarning {
				return strings.Contains(e.Message, `branch "main"`) && strings.Contains(e.Message, "streams replayed: 1")
			}
		}
		return false
	})
	require.NoError(t, f.syncTarget("web"))
	require.Equal(t, 1, strings.Count(f.logs.String(), "the branch was started over; the GitTarget's streams hand their state over again"),
		"one replay per start-over")
}

// TestSyncTargetReplaysAfterAForeignEdit: someone else's commit removes the GitTarget's file;
// once the worker learns of it (its next push is refused), the router has the target's stream
// hand the state over again, and the file is back; the next sync reports it with an info line,
// no event.
func TestSyncTargetReplaysAfterAForeignEdit(t *testing.T) {
	f := newFixture(t, fixtureConfig{objects: retargetSeed("apps"), secrets: []runtime.Object{credsSecret()}})
	f.settledAt("main", "apps")
	settings := "apps/" + testNS + "/core/configmaps/settings.yaml"
	clone := filepath.Join(t.TempDir(), "clone")
	runGit(t, "", "clone", "-q", "--branch", "main", "file://"+f.repoDir, clone)
	runGit(t, clone, "rm", "-q", settings)
	runGit(t, clone, "-c", "user.name=carol", "-c", "user.email=carol@example.com", "commit", "-q", "-m", "carol removes settings")
	runGit(t, clone, "push", "-q", "origin", "main")

	_, err := f.dyn.Resource(configMapsGVR).Namespace(testNS).Create(context.Background(), newConfigMap("second"), metav1.CreateOptions{})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the foreign edit found", func() bool { return f.router.TargetStatus(nn("web")).ForeignEdits == 1 })
	waitFor(t, 30*time.Second, "the removed file back", func() bool { return slices.Contains(branchFiles(f.repoDir, "main"), settings) })
	require.NoError(t, f.syncTarget("web"))
	require.NoError(t, f.syncTarget("web"))
	require.Equal(t, 1, strings.Count(f.logs.String(), "someone else's commits changed the GitTarget's folder; its streams hand their state over again"))
	list, err := f.kube.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	for _, e := range list.Items {
		require.NotEqual(t, v1alpha1.ReasonBranchStartedOver, e.Reason)
	}
}
