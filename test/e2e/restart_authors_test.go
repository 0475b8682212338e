package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/attribution"
)

// These tests run on the apiserver's default audit webhook retries (test/controlplane): a batch
// that failed while kubescribe was away is retried 10s, 15s, 22.5s and 33.75s later (each up to
// 20% more), then dropped.

// committer is the committer's name in the tests' repositories (stack.Start's GitProvider).
const committer = "kubescribe"

// requireNoCommitterChange fails when a change line of the commits of main after the first skip
// is authored by the committer: a change somebody made is never the committer's snapshot.
func requireNoCommitterChange(t *testing.T, m *mirror, skip int) {
	t.Helper()
	for _, c := range m.changeLines(t, skip) {
		author, line, _ := strings.Cut(c, "|")
		require.NotEqual(t, committer, author, "a person's change is credited to the committer: %s", line)
	}
}

// kubescribe killed (SIGKILL) one second into alice creating 40 ConfigMaps, started again two
// seconds later while she goes on: every ConfigMap is in Git, each created by alice. The creates
// whose audit batches failed while nothing listened wait for the apiserver's retries.
func TestKilledDuringCreatesKeepsEveryAuthor(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-kill40", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	asProcess(t, m.ns)

	alice := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns)
	created := make(chan struct{}, 40)
	done := make(chan error, 1)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond) // 40 creates over about four seconds
		defer tick.Stop()
		for i := range 40 {
			<-tick.C
			if _, err := alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%02d", i)},
				Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
				done <- err
				return
			}
			created <- struct{}{}
		}
		done <- nil
	}()
	require.True(t, poll(30*time.Second, func() bool { return len(created) >= 10 }), "the creates never began")
	require.NoError(t, env.KillKubescribe())
	// The scenario: two seconds down while alice goes on creating.
	time.Sleep(2 * time.Second)
	require.NoError(t, env.StartKubescribe(ctx))
	restarted := time.Now()
	require.NoError(t, <-done)

	var want []string
	for i := range 40 {
		want = append(want, objectFile(m, "", "configmaps", fmt.Sprintf("cm-%02d", i)))
	}
	require.True(t, poll(4*time.Minute, func() bool { return slices.Equal(m.files(t), want) && len(m.lastChanges(t, 0)) == 40 }),
		"the folder must hold the 40 ConfigMaps: %v", m.files(t))
	t.Logf("all 40 creates committed %s after the restart", time.Since(restarted).Round(time.Second))
	byObject := m.lastChanges(t, 0)
	require.Len(t, byObject, 40)
	for name, last := range byObject {
		require.Equal(t, "alice create", last, "the create of %s", name)
	}
	requireNoCommitterChange(t, m, 0)
	// The restarted process credited the creates made while nothing watched through the long
	// wait.
	require.Positive(t, metricValue(t, `kubescribe_attribution_resume_waits_total{outcome="resolved",reason="resumed"}`)+
		metricValue(t, `kubescribe_attribution_resume_waits_total{outcome="resolved",reason="replayed"}`))
}

// kubescribe down for longer than the apiserver retries a batch (102s: the last of five attempts
// of a batch sent in the outage's first seconds comes at most 1s + 97.5s later; 2s of margin):
// the changes whose batches the apiserver dropped are unresolved, a change made near the end of
// the outage, whose batch is still retried after the restart, is its author's, and none is the
// committer's.
func TestOutageLongerThanTheRetryWindow(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-outage", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "keep", "patched", "doomed")
	require.True(t, poll(60*time.Second, func() bool { return len(m.files(t)) == 3 }), "files: %v", m.files(t))
	before := len(m.commits(t))

	require.NoError(t, env.StopKubescribe())
	stopped := time.Now()
	_, err := bob.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "early"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = bob.Patch(ctx, "patched", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.NoError(t, alice.Delete(ctx, "doomed", metav1.DeleteOptions{}))
	// The scenario: a write 90s into the outage, whose batch's retries outlast it.
	time.Sleep(time.Until(stopped.Add(90 * time.Second)))
	_, err = alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	time.Sleep(time.Until(stopped.Add(102 * time.Second)))
	require.NoError(t, env.StartKubescribe(ctx))
	restarted := time.Now()

	want := []string{objectFile(m, "", "configmaps", "early"), objectFile(m, "", "configmaps", "keep"),
		objectFile(m, "", "configmaps", "late"), objectFile(m, "", "configmaps", "patched")}
	// The dropped batches' changes wait the whole resume grace (130s) before they are
	// unresolved.
	require.True(t, poll(4*time.Minute, func() bool {
		return slices.Equal(m.files(t), want) && strings.Contains(m.git(t, "show", "main:"+objectFile(m, "", "configmaps", "patched")), "v2") &&
			len(m.lastChanges(t, before)) == 4
	}), "the folder must equal the cluster: %v", m.files(t))
	t.Logf("the four downtime changes committed %s after the restart", time.Since(restarted).Round(time.Second))
	unknown := attribution.UnresolvedUsername
	require.Equal(t, map[string]string{"early": unknown + " create", "patched": unknown + " update", "doomed": unknown + " delete", "late": "alice create"},
		m.lastChanges(t, before))
	requireNoCommitterChange(t, m, before)
	require.Contains(t, m.git(t, "log", "--format=%B", "main"), "Kubescribe-Attribution: unresolved")
	// Found by the replay of the events since the last recorded position (each waits as a
	// resumed change does), or by the comparison with the cursor.
	require.GreaterOrEqual(t, metricValue(t, `kubescribe_attribution_resume_waits_total{outcome="unresolved",reason="resumed"}`)+
		metricValue(t, `kubescribe_attribution_resume_waits_total{outcome="unresolved",reason="replayed"}`), 3.0)
}

// One ConfigMap name deleted and created again 200 times in a row, by alice and bob in turn:
// Git ends equal to the cluster, the file created by the last writer. Changes of one object
// path are committed in the order the watch saw them, whatever order their facts came in.
func TestRecreatedNameEndsAsTheCluster(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-recreate", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	users := []string{"alice", "bob"}
	clients := map[string]kubernetes.Interface{"alice": clientFor(t, "alice"), "bob": clientFor(t, "bob")}
	for i := range 200 {
		cms := clients[users[i%2]].CoreV1().ConfigMaps(m.ns)
		if err := cms.Delete(ctx, "again", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			require.NoError(t, err)
		}
		_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "again"}, Data: map[string]string{"k": fmt.Sprintf("v%d", i)}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	file := objectFile(m, "", "configmaps", "again")
	require.True(t, poll(3*time.Minute, func() bool {
		out, err := exec.Command("git", "--git-dir", m.repoDir, "show", "main:"+file).CombinedOutput()
		return err == nil && strings.Contains(string(out), "k: v199") && m.lastChanges(t, 0)["again"] == "bob create" &&
			metricValue(t, "kubescribe_git_pending_changes") == 0
	}), "Git must end with bob's create of v199: %s", m.lastChanges(t, 0)["again"])
	require.Equal(t, []string{file}, m.files(t))
	requireNoCommitterChange(t, m, 0)
	for _, c := range m.changeLines(t, 0) {
		author, _, _ := strings.Cut(c, "|")
		require.Contains(t, users, author)
	}
}

// closeWhileGitIsAway has user write ConfigMap cm and, with the Git server away until the test
// ends, create CommitRequest request with message: it returns once the request closed user's
// window and its commit is made, not pushed.
func closeWhileGitIsAway(t *testing.T, m *requestMirror, user, cm, request, message string) {
	t.Helper()
	writeConfigMap(t, m, user, cm)
	awaitOpenWindow(t, m, 0)
	env.Git.SetAvailable(false)
	t.Cleanup(func() { env.Git.SetAvailable(true) })
	// The request's own status says when its commit is made and its push failed: the
	// unpushed-commits gauge counts every worker's, and earlier tests' workers may add or
	// drop some meanwhile.
	require.NoError(t, submit(t, user, m.ns, request, requestSpec{target: "tenants", message: message}, false))
	var last *metav1.Condition
	require.True(t, poll(60*time.Second, func() bool {
		u, err := dynamicFor(t, "admin").Resource(v1alpha1.CommitRequestsResource).Namespace(m.ns).Get(context.Background(), request, metav1.GetOptions{})
		if err != nil {
			return false
		}
		var cr v1alpha1.CommitRequest
		require.NoError(t, fromUnstructured(u.Object, &cr))
		last = meta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionReady)
		return last != nil && last.Reason == v1alpha1.ReasonProgressing && strings.Contains(last.Message, "the commit is made")
	}), "the request never closed the window: Ready %+v", last)
}

// A CommitRequest whose window was closed (its commit made, the push failing: the Git server is
// away) when kubescribe is killed still gets its commit, with its message, after the restart.
func TestCommitRequestSurvivesAKill(t *testing.T) {
	ctx := context.Background()
	m := newRequestMirror(t, "e2e-cr-kill")
	asProcess(t, m.ns)
	closeWhileGitIsAway(t, m, "alice", "release-notes", "release", "Release 1.2\n\nThe notes.")
	require.NoError(t, env.KillKubescribe())
	env.Git.SetAvailable(true)
	require.NoError(t, env.StartKubescribe(ctx))

	cr := waitRequest(t, m.ns, "release")
	requireConditions(t, cr, metav1.ConditionTrue, v1alpha1.ReasonCommitted, metav1.ConditionTrue, v1alpha1.ReasonAttributedFromAdmission)
	require.Equal(t, m.git(t, "rev-parse", "main"), cr.Status.SHA)
	require.Equal(t, "alice|Release 1.2", m.git(t, "log", "-1", "--format=%an|%s", "main"))
	body := m.git(t, "log", "-1", "--format=%B", "main")
	require.Contains(t, body, "The notes.")
	require.Contains(t, body, "Kubescribe-Commit-Request: "+m.ns+"/release")
}

// A CommitRequest whose commit the stopping kubescribe pushes on its way out (SIGTERM; its
// controller stopped first) is reported committed by the next process: the push is recorded in
// Redis, not only in the stopped process's memory.
func TestCommitRequestPushedAtShutdownIsReported(t *testing.T) {
	ctx := context.Background()
	m := newRequestMirror(t, "e2e-cr-term")
	closeWhileGitIsAway(t, m, "bob", "late-fix", "fix", "Late fix")
	// The server is back; kubescribe is stopped at once and pushes on its way out (or just
	// before: either way the next process must report the commit).
	env.Git.SetAvailable(true)
	require.NoError(t, env.StopKubescribe())
	require.Len(t, m.commits(t), 1, "the commit must be pushed before kubescribe exits")
	require.NoError(t, env.StartKubescribe(ctx))
	cr := waitRequest(t, m.ns, "fix")
	requireConditions(t, cr, metav1.ConditionTrue, v1alpha1.ReasonCommitted, metav1.ConditionTrue, v1alpha1.ReasonAttributedFromAdmission)
	require.Equal(t, m.git(t, "rev-parse", "main"), cr.Status.SHA)
	require.Equal(t, "bob|Late fix", m.git(t, "log", "-1", "--format=%an|%s", "main"))
}
