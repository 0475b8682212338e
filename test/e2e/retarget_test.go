package e2e

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// cursorKeys lists the resume cursors kubescribe keeps in Redis for GitTarget "target" of
// namespace ns (the stack runs with the default key prefix).
func cursorKeys(t *testing.T, ns string) []string {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: env.RedisAddr})
	defer rdb.Close()
	var keys []string
	iter := rdb.Scan(context.Background(), 0, "kubescribe:cursor:*:"+ns+"/target:*", 500).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	require.NoError(t, iter.Err())
	slices.Sort(keys)
	return keys
}

// hasCursorAt reports whether one of keys is a cursor of destination "<branch>:<folder>".
func hasCursorAt(keys []string, ns, destination string) bool {
	return slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, ":"+ns+"/target:"+destination+":") })
}

// getTarget reads GitTarget "target" of ns.
func getTarget(t *testing.T, ns string) v1alpha1.GitTarget {
	t.Helper()
	u, err := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(ns).Get(context.Background(), "target", metav1.GetOptions{})
	require.NoError(t, err)
	var tg v1alpha1.GitTarget
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &tg))
	return tg
}

// waitRetargeted waits until GitTarget "target" of ns has settled a move to want, and returns
// it as it was then.
func waitRetargeted(t *testing.T, ns string, want v1alpha1.Destination) v1alpha1.GitTarget {
	t.Helper()
	var tg v1alpha1.GitTarget
	ok := poll(90*time.Second, func() bool {
		tg = getTarget(t, ns)
		c := meta.FindStatusCondition(tg.Status.Conditions, v1alpha1.ConditionRetargeting)
		return c != nil && c.Status == metav1.ConditionFalse && tg.Status.ObservedDestination != nil && *tg.Status.ObservedDestination == want
	})
	require.True(t, ok, "the move to %+v did not settle: %+v", want, tg.Status)
	return tg
}

// branchFiles lists the files of branch in the mirror's repository.
func (m *mirror) branchFiles(t *testing.T, branch string) []string {
	t.Helper()
	out := m.git(t, "ls-tree", "-r", "--name-only", branch)
	return strings.Split(out, "\n")
}

// TestRetargetPathAndBranch: changing a GitTarget's path, then its branch, moves it: existing
// objects appear at the new destination, observedDestination names it only once they are
// pushed there, the old folder stays, the Retargeting condition and a Retargeted event name
// it, and the old destination's resume cursors are gone from Redis. providerRef cannot change;
// deleting the target removes its cursors.
func TestRetargetPathAndBranch(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-retarget", "old", []string{"alice"}, configMapWriters, watchConfigMaps)
	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "a"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	oldFile := objectFile(m, "", "configmaps", "a")
	require.True(t, poll(60*time.Second, func() bool { return slices.Contains(m.files(t), oldFile) }), "files: %v", m.files(t))
	require.True(t, poll(30*time.Second, func() bool { return hasCursorAt(cursorKeys(t, m.ns), m.ns, "main:old") }), "keys: %v", cursorKeys(t, m.ns))
	require.Equal(t, &v1alpha1.Destination{Branch: "main", Path: "old"}, getTarget(t, m.ns).Status.ObservedDestination)

	targets := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(m.ns)
	seen := watchTargetStatus(t, m.ns)
	_, err = targets.Patch(ctx, "target", types.MergePatchType, []byte(`{"spec":{"path":"new"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	tg := waitRetargeted(t, m.ns, v1alpha1.Destination{Branch: "main", Path: "new"})
	// While the move was in progress, status said so and still named the old folder.
	require.True(t, slices.ContainsFunc(seen(), func(st v1alpha1.GitTargetStatus) bool {
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRetargeting)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonSnapshotPending &&
			st.RetargetingTo != nil && *st.RetargetingTo == v1alpha1.Destination{Branch: "main", Path: "new"} &&
			st.ObservedDestination != nil && *st.ObservedDestination == v1alpha1.Destination{Branch: "main", Path: "old"}
	}), "no status showed the move in progress: %+v", seen())
	newFile := "new/" + m.ns + "/core/configmaps/a.yaml"
	files := m.files(t)
	require.Contains(t, files, newFile, "observedDestination moves only once the snapshot is pushed")
	require.Contains(t, files, oldFile, "the old folder is never deleted")
	require.Nil(t, tg.Status.RetargetingTo)
	rc := meta.FindStatusCondition(tg.Status.Conditions, v1alpha1.ConditionRetargeting)
	require.Equal(t, v1alpha1.ReasonRetargeted, rc.Reason)
	require.Contains(t, rc.Message, `moved from folder "old" of branch "main" to folder "new" of branch "main"`)
	require.Contains(t, rc.Message, "left in place")
	require.Equal(t, metav1.ConditionTrue, meta.FindStatusCondition(tg.Status.Conditions, v1alpha1.ConditionReady).Status)
	require.True(t, poll(30*time.Second, func() bool { return retargetedEventNaming(t, m.ns, `folder "old"`) }), "no Retargeted event naming the old folder")
	keys := cursorKeys(t, m.ns)
	require.False(t, hasCursorAt(keys, m.ns, "main:old"), "the old destination's cursors are dropped: %v", keys)
	require.True(t, poll(30*time.Second, func() bool { return hasCursorAt(cursorKeys(t, m.ns), m.ns, "main:new") }), "keys: %v", cursorKeys(t, m.ns))

	// A later change lands in the new folder only, and the settled message survives it.
	_, err = clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Patch(ctx, "a", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool { return strings.Contains(m.git(t, "show", "main:"+newFile), "v2") }))
	require.Contains(t, m.git(t, "show", "main:"+oldFile), "v1", "nothing is written to the old folder any more")
	require.Equal(t, rc.Message, meta.FindStatusCondition(getTarget(t, m.ns).Status.Conditions, v1alpha1.ConditionRetargeting).Message)

	// The branch moves: the objects appear on the new branch, the old one keeps its files.
	_, err = targets.Patch(ctx, "target", types.MergePatchType, []byte(`{"spec":{"branch":"release"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	tg = waitRetargeted(t, m.ns, v1alpha1.Destination{Branch: "release", Path: "new"})
	require.Contains(t, m.branchFiles(t, "release"), newFile)
	require.Contains(t, m.git(t, "show", "release:"+newFile), "v2")
	require.Contains(t, m.branchFiles(t, "main"), newFile, "the old branch keeps its files")
	require.Contains(t, meta.FindStatusCondition(tg.Status.Conditions, v1alpha1.ConditionRetargeting).Message,
		`moved from folder "new" of branch "main" to folder "new" of branch "release"`)
	require.True(t, poll(30*time.Second, func() bool {
		return retargetedEventNaming(t, m.ns, `branch "main" to folder "new" of branch "release"`)
	}))
	keys = cursorKeys(t, m.ns)
	require.False(t, hasCursorAt(keys, m.ns, "main:new"), "keys: %v", keys)
	require.False(t, hasCursorAt(keys, m.ns, "main:old"), "keys: %v", keys)

	// providerRef is immutable, and the apiserver says what to do instead.
	_, err = targets.Patch(ctx, "target", types.MergePatchType, []byte(`{"spec":{"providerRef":{"name":"another"}}}`), metav1.PatchOptions{})
	require.Error(t, err)
	require.Contains(t, err.Error(), "providerRef is immutable")
	require.Contains(t, err.Error(), "create a new GitTarget")

	// A deleted target leaves no cursor behind.
	require.True(t, poll(30*time.Second, func() bool { return hasCursorAt(cursorKeys(t, m.ns), m.ns, "release:new") }), "keys: %v", cursorKeys(t, m.ns))
	require.NoError(t, targets.Delete(ctx, "target", metav1.DeleteOptions{}))
	require.True(t, poll(30*time.Second, func() bool { return len(cursorKeys(t, m.ns)) == 0 }), "keys: %v", cursorKeys(t, m.ns))
}

// retargetedEventNaming reports whether a Retargeted event about GitTarget "target" of ns
// carries want in its message.
func retargetedEventNaming(t *testing.T, ns, want string) bool {
	t.Helper()
	return targetEventNaming(t, ns, corev1.EventTypeNormal, v1alpha1.ReasonRetargeted, want)
}

// targetEventNaming reports whether an event of type and reason about GitTarget "target" of
// ns carries want in its message.
func targetEventNaming(t *testing.T, ns, eventType, reason, want string) bool {
	t.Helper()
	list, err := clientFor(t, "admin").CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	for _, e := range list.Items {
		if e.Reason == reason && e.InvolvedObject.Kind == "GitTarget" && e.InvolvedObject.Name == "target" &&
			e.Type == eventType && strings.Contains(e.Message, want) {
			return true
		}
	}
	return false
}

// watchTargetStatus watches GitTarget "target" of ns from now on; the function it returns lists
// every status the watch delivered so far.
func watchTargetStatus(t *testing.T, ns string) func() []v1alpha1.GitTargetStatus {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=target", ResourceVersion: getTargetRV(t, ns)})
	require.NoError(t, err)
	var mu sync.Mutex
	var seen []v1alpha1.GitTargetStatus
	go func() {
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			var tg v1alpha1.GitTarget
			if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &tg) == nil {
				mu.Lock()
				seen = append(seen, tg.Status)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return func() []v1alpha1.GitTargetStatus {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

func getTargetRV(t *testing.T, ns string) string {
	t.Helper()
	u, err := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(ns).Get(context.Background(), "target", metav1.GetOptions{})
	require.NoError(t, err)
	return u.GetResourceVersion()
}

// TestRetargetSourceCluster: setting spec.sourceCluster on a GitTarget that mirrors the
// cluster kubescribe runs in moves it to the remote cluster: its folder then mirrors the remote
// (the remote's object lands, the local object's file is swept), and observedDestination names
// the remote's route once that is pushed.
func TestRetargetSourceCluster(t *testing.T) {
	ctx := context.Background()
	r := remoteCluster(t)
	m := newMirror(t, "e2e-retarget-cluster", "mirror", []string{"alice"}, configMapWriters, watchConfigMaps)
	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "local-only"}, Data: map[string]string{"origin": "local"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	localFile := objectFile(m, "", "configmaps", "local-only")
	require.True(t, poll(60*time.Second, func() bool { return slices.Contains(m.files(t), localFile) }), "files: %v", m.files(t))

	remoteAdmin := remoteNamespace(t, r, m.ns)
	_, err = remoteAdmin.CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "remote-only"}, Data: map[string]string{"origin": "remote"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	kc, err := r.Kubeconfig("kubescribe")
	require.NoError(t, err)
	_, err = clientFor(t, "admin").CoreV1().Secrets(m.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "remote"}, Data: map[string][]byte{"value": kc}}, metav1.CreateOptions{})
	require.NoError(t, err)

	patch := `{"spec":{"sourceCluster":{"kubeConfigSecretRef":{"name":"remote"},"auditRoute":"` + remoteRoute + `"}}}`
	_, err = dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(m.ns).Patch(ctx, "target", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	require.NoError(t, err)
	tg := waitRetargeted(t, m.ns, v1alpha1.Destination{Branch: "main", Path: "mirror", SourceCluster: remoteRoute})
	remoteFile := objectFile(m, "", "configmaps", "remote-only")
	require.True(t, poll(30*time.Second, func() bool {
		files := m.files(t)
		return slices.Contains(files, remoteFile) && !slices.Contains(files, localFile)
	}), "the folder mirrors the remote cluster now: %v", m.files(t))
	require.Contains(t, m.git(t, "show", "main:"+remoteFile), "remote")
	require.Contains(t, meta.FindStatusCondition(tg.Status.Conditions, v1alpha1.ConditionRetargeting).Message, "left in place")
}

// TestRetargetBackSettlesAfterTheSweep: a GitTarget moves from folder "a" to "b", an object is
// deleted there, and the target moves back to "a", which still holds that object's file. The
// stream's sweep removes it, and the move settles only once that deletion is pushed: a reader
// who sees Retargeted finds the folder equal to the cluster.
func TestRetargetBackSettlesAfterTheSweep(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-moveback", "a", []string{"alice"}, configMapWriters, watchConfigMaps)
	cms := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, cms, "x", "y")
	in := func(folder, name string) string { return folder + "/" + m.ns + "/core/configmaps/" + name + ".yaml" }
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(m.files(t), []string{in("a", "x"), in("a", "y")}) }), "files: %v", m.files(t))
	targets := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(m.ns)
	move := func(folder string) {
		t.Helper()
		_, err := targets.Patch(ctx, "target", types.MergePatchType, []byte(`{"spec":{"path":"`+folder+`"}}`), metav1.PatchOptions{})
		require.NoError(t, err)
		waitRetargeted(t, m.ns, v1alpha1.Destination{Branch: "main", Path: folder})
	}
	move("b")
	require.NoError(t, cms.Delete(ctx, "y", metav1.DeleteOptions{}))
	require.True(t, poll(60*time.Second, func() bool { return !slices.Contains(m.files(t), in("b", "y")) }), "files: %v", m.files(t))
	require.Contains(t, m.files(t), in("a", "y"), "the folder left behind is not touched")

	move("a")
	require.Equal(t, []string{in("a", "x"), in("b", "x")}, m.files(t), "settled only once the sweep's deletion is pushed")
}
