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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// kubescribe stopped (as SIGTERM does) for five seconds while bob creates and patches and alice
// deletes; after the restart the folder equals the cluster object for object, each change made
// while nothing watched is authored by its real author (its audit batch, refused while nothing
// listened, comes with the apiserver's retries), none by the committer, and no commit lists an
// unchanged object.
func TestRestartResumesAndAttributes(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-resume", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "keep", "patched", "doomed")
	before := m.waitCommits(t, 1)
	require.True(t, poll(60*time.Second, func() bool { return len(m.files(t)) == 3 }), "files: %v", m.files(t))
	before = m.commits(t)

	require.NoError(t, env.StopKubescribe())
	stopped := time.Now()
	_, err := bob.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "born"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = bob.Patch(ctx, "patched", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.NoError(t, alice.Delete(ctx, "doomed", metav1.DeleteOptions{}))
	time.Sleep(time.Until(stopped.Add(5 * time.Second))) // the scenario: five seconds down
	require.NoError(t, env.StartKubescribe(ctx))
	restarted := time.Now()

	want := []string{objectFile(m, "", "configmaps", "born"), objectFile(m, "", "configmaps", "keep"), objectFile(m, "", "configmaps", "patched")}
	patched := "main:" + objectFile(m, "", "configmaps", "patched")
	require.True(t, poll(90*time.Second, func() bool {
		return slices.Equal(m.files(t), want) && strings.Contains(m.git(t, "show", patched), "v2")
	}), "the folder must equal the cluster: %v", m.files(t))
	require.True(t, poll(90*time.Second, func() bool { return len(m.lastChanges(t, len(before))) == 3 }))
	t.Logf("the three downtime changes committed %s after the restart", time.Since(restarted).Round(time.Second))

	byObject := m.lastChanges(t, len(before))
	require.NotContains(t, byObject, "keep", "a commit lists an unchanged object")
	require.Equal(t, map[string]string{"born": "bob create", "patched": "bob update", "doomed": "alice delete"}, byObject,
		"a change made while nothing watched must be authored by who made it")
	requireNoCommitterChange(t, m, len(before))
	require.GreaterOrEqual(t, metricValue(t, `kubescribe_attribution_resume_waits_total{outcome="resolved",reason="resumed"}`)+
		metricValue(t, `kubescribe_attribution_resume_waits_total{outcome="resolved",reason="replayed"}`), 3.0)
}

// asProcess runs kubescribe as a process of its own for the rest of the test, so that the test
// can kill it, and waits until that process reconciled the WatchRule "rule" of ns. At cleanup
// the in-process kubescribe the other tests use runs again.
func asProcess(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	server := binary(t, "./cmd/server", "kubescribe-server")
	require.NoError(t, env.StopKubescribe())
	require.NoError(t, env.StartKubescribeProcess(ctx, server))
	t.Cleanup(func() {
		if env.RunsProcess() {
			_ = env.KillKubescribe()
			require.NoError(t, env.StartKubescribe(ctx))
		}
	})
	// The process's own reconcile of the rule: a new generation it alone can make Ready.
	u, err := dynamicFor(t, "admin").Resource(v1alpha1.WatchRulesResource).Namespace(ns).Patch(ctx, "rule", types.MergePatchType,
		[]byte(`{"spec":{"rules":[{"apiGroups":[""],"resources":["configmaps"],"operations":["CREATE","UPDATE","DELETE"]}]}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	waitReady(t, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady, u.GetGeneration())
}

// files lists the files of main, sorted.
func (m *mirror) files(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "--git-dir", m.repoDir, "ls-tree", "-r", "--name-only", "main").CombinedOutput()
	if err != nil {
		return nil // no branch yet
	}
	s := strings.TrimRight(string(out), "\n")
	if s == "" {
		return nil
	}
	files := strings.Split(s, "\n")
	slices.Sort(files)
	return files
}

// changeLines returns, for each commit of main after the first skip, oldest first, one
// "<author>|<change line>" per change line of its message body.
func (m *mirror) changeLines(t *testing.T, skip int) []string {
	t.Helper()
	out := m.git(t, "log", "--reverse", "--format=%x00%an%n%b", "main")
	var lines []string
	for i, commit := range strings.Split(out, "\x00")[1:] {
		if i < skip {
			continue
		}
		author, body, _ := strings.Cut(commit, "\n")
		for _, l := range strings.Split(body, "\n") {
			if f := strings.Fields(l); len(f) >= 4 && strings.HasPrefix(f[3], "resourceVersion=") {
				lines = append(lines, author+"|"+l)
			}
		}
	}
	return lines
}

// lastChanges returns, for each object named by a change line of the commits of main after the
// first skip, "<author> <op>" of its last one (change lines read "<op> <group>/<resource>
// <ns>/<name> ...").
func (m *mirror) lastChanges(t *testing.T, skip int) map[string]string {
	t.Helper()
	byObject := map[string]string{}
	for _, c := range m.changeLines(t, skip) {
		author, line, _ := strings.Cut(c, "|")
		fields := strings.Fields(line)
		_, name, _ := strings.Cut(fields[2], "/")
		byObject[name] = author + " " + fields[0]
	}
	return byObject
}

// kubescribe killed (SIGKILL) in the middle of a stream of changes by two users, more changes
// while nothing runs, then restarted: the folder equals the cluster object for object, and the
// last change of each object is authored by who made it.
func TestKilledMidStreamLosesNothing(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-kill", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	asProcess(t, m.ns)

	clients := map[string]kubernetes.Interface{"alice": clientFor(t, "alice"), "bob": clientFor(t, "bob")}
	type state struct {
		value, writer string
		deleted       bool
	}
	cluster := map[string]*state{}
	step := 0
	write := func(user string) {
		t.Helper()
		step++
		cms := clients[user].CoreV1().ConfigMaps(m.ns)
		name := fmt.Sprintf("cm-%d", step%7)
		st, ok := cluster[name]
		value := fmt.Sprintf("v%d", step)
		switch {
		case !ok || st.deleted:
			_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": value}}, metav1.CreateOptions{})
			require.NoError(t, err)
			cluster[name] = &state{value: value, writer: user}
		case step%5 == 0:
			require.NoError(t, cms.Delete(ctx, name, metav1.DeleteOptions{}))
			st.deleted, st.writer = true, user
		default:
			_, err := cms.Patch(ctx, name, types.MergePatchType, []byte(`{"data":{"k":"`+value+`"}}`), metav1.PatchOptions{})
			require.NoError(t, err)
			st.value, st.writer = value, user
		}
	}
	users := []string{"alice", "bob"}
	for i := range 12 {
		write(users[i%2])
	}
	// Some of it is pushed; the stream goes on, and kubescribe dies in the middle of it.
	m.waitCommits(t, 2)
	for i := range 6 {
		write(users[i%2])
	}
	require.NoError(t, env.KillKubescribe())
	for i := range 6 {
		write(users[(i+1)%2])
	}
	require.NoError(t, env.StartKubescribe(ctx))

	var want []string
	for name, st := range cluster {
		if !st.deleted {
			want = append(want, objectFile(m, "", "configmaps", name))
		}
	}
	slices.Sort(want)
	equal := func() bool {
		if !slices.Equal(m.files(t), want) {
			return false
		}
		for name, st := range cluster {
			if !st.deleted && !strings.Contains(m.git(t, "show", "main:"+objectFile(m, "", "configmaps", name)), "k: "+st.value) {
				return false
			}
		}
		return true
	}
	require.True(t, poll(90*time.Second, equal), "the folder must equal the cluster: files %v, want %v", m.files(t), want)

	// The last change line of each object names its last writer.
	lastAuthor := map[string]string{}
	for _, c := range m.changeLines(t, 0) {
		author, line, _ := strings.Cut(c, "|")
		_, name, _ := strings.Cut(strings.Fields(line)[2], "/")
		lastAuthor[name] = author
	}
	for name, st := range cluster {
		if author, ok := lastAuthor[name]; ok || !st.deleted {
			// An object deleted before any commit held it needs no commit at all.
			require.Equal(t, st.writer, author, "the last change of %s", name)
		}
	}
	requireNoCommitterChange(t, m, 0)
}

// A commit pushed to the branch by someone else while changes flow: kubescribe's next push is
// refused, it rebuilds its commits on the new tip and pushes again. Nothing is lost, nothing is
// forced: the foreign commit stays in the history, and its file stays.
func TestForeignCommitMidStream(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-foreign", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)
	_, err := alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 1)

	rejected := func() float64 { return metricValue(t, `kubescribe_git_push_total{result="rejected"}`) }
	rejectedBefore := rejected()

	// Someone else commits README.md on main, straight into the server's repository.
	tip := m.git(t, "rev-parse", "main")
	blob := strings.TrimSpace(gitStdin(t, m.repoDir, "hello\n", "hash-object", "-w", "--stdin"))
	base := m.git(t, "ls-tree", "main")
	tree := strings.TrimSpace(gitStdin(t, m.repoDir, base+"\n100644 blob "+blob+"\tREADME.md\n", "mktree"))
	foreign := strings.TrimSpace(gitStdin(t, m.repoDir, "a foreign commit\n", "-c", "user.name=carol", "-c", "user.email=carol@example.com", "commit-tree", tree, "-p", tip))
	m.git(t, "update-ref", "refs/heads/main", foreign, tip)

	_, err = bob.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = alice.Patch(ctx, "a", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	want := []string{"README.md", objectFile(m, "", "configmaps", "a"), objectFile(m, "", "configmaps", "b")}
	slices.Sort(want)
	require.True(t, poll(60*time.Second, func() bool {
		return slices.Equal(m.files(t), want) && strings.Contains(m.git(t, "show", "main:"+objectFile(m, "", "configmaps", "a")), "v2")
	}), "files: %v", m.files(t))
	m.git(t, "merge-base", "--is-ancestor", foreign, "main") // fails the test unless the foreign commit is kept
	require.Greater(t, rejected(), rejectedBefore, "the push after the foreign commit was refused and retried")
	byObject := map[string]string{}
	for _, c := range m.changeLines(t, 0) {
		author, line, _ := strings.Cut(c, "|")
		f := strings.Fields(line)
		byObject[f[2]+" "+f[0]] = author
	}
	require.Equal(t, map[string]string{"e2e-foreign/a create": "alice", "e2e-foreign/b create": "bob", "e2e-foreign/a update": "alice"}, byObject)
}

// gitStdin runs git on a bare repository with stdin and returns its output.
func gitStdin(t *testing.T, gitDir, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"--git-dir", gitDir}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	require.NoError(t, err, "git %s", strings.Join(args, " "))
	return string(out)
}

// A GitTarget whose folder changes is handed the whole state again: existing objects appear in
// the new folder, and the old folder stays as it was.
func TestPathChangeSnapshotsIntoTheNewFolder(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-move", "old", []string{"alice"}, configMapWriters, watchConfigMaps)
	_, err := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "a"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	oldFile := objectFile(m, "", "configmaps", "a")
	require.True(t, poll(60*time.Second, func() bool { return slices.Contains(m.files(t), oldFile) }))

	_, err = dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(m.ns).Patch(ctx, "target", types.MergePatchType,
		[]byte(`{"spec":{"path":"new"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	newFile := "new/" + m.ns + "/core/configmaps/a.yaml"
	require.True(t, poll(60*time.Second, func() bool { return slices.Contains(m.files(t), newFile) }), "files: %v", m.files(t))
	require.Contains(t, m.files(t), oldFile, "the old folder is never deleted")
}

// While kubescribe is stopped, someone else edits its folder: a foreign commit removes one
// object's file and rewrites another's. At the restart the folder is made the cluster again
// (the cursor says what kubescribe pushed, not what the branch holds now): the two files are
// restored by a snapshot commit of the committer, on top of the foreign commit (nothing is
// forced), which lists only them; bob's create made meanwhile is his. Then the branch itself is
// deleted while kubescribe is stopped: the restart creates it again with every object's file.
func TestRestartRestoresWhatTheBranchLost(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-restore", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "keep", "edited", "removed")
	file := func(name string) string { return objectFile(m, "", "configmaps", name) }
	require.True(t, poll(60*time.Second, func() bool { return len(m.files(t)) == 3 }), "files: %v", m.files(t))
	committer := strings.Split(m.commits(t)[0], "|")[2]

	require.NoError(t, env.StopKubescribe())
	// carol removes one file and rewrites another, straight into the server's repository.
	tampered := strings.Replace(m.git(t, "show", "main:"+file("edited")), "k: v1", "k: tampered", 1) + "\n"
	foreign := m.carolCommits(t, "carol's cleanup", map[string]string{file("removed"): "", file("edited"): tampered})
	_, err := bob.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "born"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	before := m.commits(t)
	require.NoError(t, env.StartKubescribe(ctx))

	want := []string{file("born"), file("edited"), file("keep"), file("removed")}
	restored := func() bool {
		if !slices.Equal(m.files(t), want) {
			return false
		}
		for _, name := range []string{"born", "edited", "keep", "removed"} {
			if !strings.Contains(m.git(t, "show", "main:"+file(name)), "k: v1") {
				return false
			}
		}
		return true
	}
	require.True(t, poll(90*time.Second, restored), "the folder must equal the cluster: %v", m.files(t))
	m.git(t, "merge-base", "--is-ancestor", foreign, "main") // fails the test unless the foreign commit is kept
	require.Equal(t, map[string]string{"born": "bob create", "removed": committer + " create", "edited": committer + " update"}, m.lastChanges(t, len(before)),
		"only the files the branch lost are restored, by the committer; bob's create is his")

	// The branch deleted while nothing runs: the restart writes every object again.
	require.NoError(t, env.StopKubescribe())
	m.git(t, "update-ref", "-d", "refs/heads/main")
	require.NoError(t, env.StartKubescribe(ctx))
	require.True(t, poll(90*time.Second, restored), "the branch must be created again with every file: %v", m.files(t))
	commits := m.commits(t)
	require.Len(t, commits, 1, "one snapshot commit starts the branch again: %q", commits)
	require.Equal(t, committer, strings.Split(commits[0], "|")[0], "nobody changed the objects: the committer writes them again")
}

// While kubescribe runs, someone else edits its folder: a foreign commit removes one object's
// file and rewrites another's. kubescribe learns of it at its next push (bob's create), which
// the server refuses: the folder changed, so the target's stream hands its state over again and
// the two files are restored by the committer, on top of the foreign commit (nothing is
// forced), without a restart; bob's create is his. A foreign commit that leaves the folder as
// it was (a README next to it) restores nothing.
func TestForeignEditOfTheFolderIsUndone(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-undo", "mirror", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "keep", "edited", "removed")
	file := func(name string) string { return objectFile(m, "", "configmaps", name) }
	require.True(t, poll(60*time.Second, func() bool { return len(m.files(t)) == 3 }), "files: %v", m.files(t))
	committer := strings.Split(m.commits(t)[0], "|")[2]
	url := env.Git.URL(m.repo)
	const replayLog = "someone else's commits changed folders kubescribe writes; their GitTargets' streams hand their state over again"

	n0 := len(m.commits(t))
	readme := m.carolCommits(t, "carol's readme", map[string]string{"README.md": "hello\n"})
	_, err := bob.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "first"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.True(t, poll(60*time.Second, func() bool { return slices.Contains(m.files(t), file("first")) }), "files: %v", m.files(t))
	m.git(t, "merge-base", "--is-ancestor", readme, "main")
	require.Equal(t, map[string]string{"first": "bob create"}, m.lastChanges(t, n0))
	require.Zero(t, countLog(t, replayLog, url), "the README left the folder as it was")
	before := m.commits(t)

	tampered := strings.Replace(m.git(t, "show", "main:"+file("edited")), "k: v1", "k: tampered", 1) + "\n"
	foreign := m.carolCommits(t, "carol's cleanup", map[string]string{file("removed"): "", file("edited"): tampered})
	_, err = bob.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "second"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	want := []string{"README.md", file("edited"), file("first"), file("keep"), file("removed"), file("second")}
	require.True(t, poll(90*time.Second, func() bool {
		return slices.Equal(m.files(t), want) && strings.Contains(m.git(t, "show", "main:"+file("edited")), "k: v1")
	}), "the folder must equal the cluster again: %v", m.files(t))
	m.git(t, "merge-base", "--is-ancestor", foreign, "main") // fails the test unless the foreign commit is kept
	require.Equal(t, map[string]string{"second": "bob create", "removed": committer + " create", "edited": committer + " update"}, m.lastChanges(t, len(before)),
		"only the files carol changed are restored, by the committer; bob's create is his")
	require.Equal(t, 1, countLog(t, replayLog, url))
}

// With the GitProvider's fetchInterval, a branch kubescribe has nothing to push to is fetched
// by itself: carol's commit that removes one file of the folder and rewrites another is undone
// while nothing changes in the cluster. The apiserver refuses an interval below a second.
func TestIdleBranchIsCheckedForForeignEdits(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-drift", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	_, err := dynamicFor(t, "admin").Resource(v1alpha1.GitProvidersResource).Namespace(m.ns).Patch(ctx, "repo", types.MergePatchType,
		[]byte(`{"spec":{"fetchInterval":"500ms"}}`), metav1.PatchOptions{})
	require.True(t, apierrors.IsInvalid(err), "want Invalid, got %v", err)
	require.ErrorContains(t, err, "fetchInterval must be 0s, or at least 1s and at most 24h")
	m.setFetchInterval(t, "1s")

	createConfigMaps(t, clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), "kept", "edited", "removed")
	file := func(name string) string { return objectFile(m, "", "configmaps", name) }
	want := []string{file("edited"), file("kept"), file("removed")}
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(m.files(t), want) }), "files: %v", m.files(t))
	committer := strings.Split(m.commits(t)[0], "|")[2]
	before := len(m.commits(t))
	moved := metricValue(t, `kubescribe_git_branch_checks_total{result="moved"}`)

	tampered := strings.Replace(m.git(t, "show", "main:"+file("edited")), "k: v1", "k: tampered", 1) + "\n"
	foreign := m.carolCommits(t, "carol's cleanup", map[string]string{file("removed"): "", file("edited"): tampered})
	require.True(t, poll(60*time.Second, func() bool {
		return slices.Equal(m.files(t), want) && strings.Contains(m.git(t, "show", "main:"+file("edited")), "k: v1")
	}), "the folder must equal the cluster again with no change in it: %v", m.files(t))
	m.git(t, "merge-base", "--is-ancestor", foreign, "main") // fails the test unless carol's commit is kept
	require.Equal(t, map[string]string{"removed": committer + " create", "edited": committer + " update"}, m.lastChanges(t, before),
		"only the files carol changed are written again, by the committer")
	require.Greater(t, metricValue(t, `kubescribe_git_branch_checks_total{result="moved"}`), moved)
	waitReady(t, v1alpha1.GitTargetsResource, m.ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)

	// The branch deleted: it is created again at kubescribe's last commit, history included.
	history := m.git(t, "log", "--format=%H", "main")
	m.git(t, "update-ref", "-d", "refs/heads/main")
	require.True(t, poll(60*time.Second, func() bool {
		out, err := exec.Command("git", "--git-dir", m.repoDir, "log", "--format=%H", "main").Output()
		return err == nil && strings.TrimSpace(string(out)) == history
	}), "the deleted branch must come back as it was")
	require.Equal(t, 1, countLog(t, "the deleted branch is created again at kubescribe's last commit", env.Git.URL(m.repo)))
}

// setFetchInterval sets the fetchInterval of m's GitProvider and waits until the controller
// took the new generation.
func (m *mirror) setFetchInterval(t *testing.T, d string) {
	t.Helper()
	u, err := dynamicFor(t, "admin").Resource(v1alpha1.GitProvidersResource).Namespace(m.ns).Patch(context.Background(), "repo", types.MergePatchType,
		[]byte(`{"spec":{"fetchInterval":"`+d+`"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	waitReady(t, v1alpha1.GitProvidersResource, m.ns, "repo", metav1.ConditionTrue, v1alpha1.ReasonReady, u.GetGeneration())
}

// carolCommits commits onto main, straight into the server's repository as another writer
// would, the branch's files with edits: a path mapped to "" is removed, any other content is
// written there. It returns the new commit.
func (m *mirror) carolCommits(t *testing.T, message string, edits map[string]string) string {
	t.Helper()
	index := t.TempDir() + "/index"
	run := func(stdin string, args ...string) string {
		cmd := exec.Command("git", append([]string{"--git-dir", m.repoDir}, args...)...)
		cmd.Env = append(cmd.Environ(), "GIT_INDEX_FILE="+index)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %s: %s", strings.Join(args, " "), out)
		return strings.TrimSpace(string(out))
	}
	tip := m.git(t, "rev-parse", "main")
	var tree strings.Builder
	for _, l := range strings.Split(m.git(t, "ls-tree", "-r", "main"), "\n") {
		_, path, _ := strings.Cut(l, "\t")
		if _, edited := edits[path]; !edited {
			tree.WriteString(l + "\n")
		}
	}
	for path, content := range edits {
		if content != "" {
			fmt.Fprintf(&tree, "100644 blob %s\t%s\n", run(content, "hash-object", "-w", "--stdin"), path)
		}
	}
	run(tree.String(), "update-index", "--index-info")
	commit := run(message+"\n", "-c", "user.name=carol", "-c", "user.email=carol@example.com", "commit-tree", run("", "write-tree"), "-p", tip)
	m.git(t, "update-ref", "refs/heads/main", commit, tip)
	return commit
}

// The branch is deleted on the server and its objects garbage-collected while kubescribe runs:
// the worker's next push sends only its new objects, which no longer connect to anything the
// server holds, and is refused. The worker starts the branch over, the controller has the
// target's stream hand its whole state over again, and the branch comes back, without a
// restart, with the whole folder: the unchanged object written by the committer, the change
// that was refused by its author. The GitTarget gets a BranchStartedOver event, the metric
// counts the start-over, and the target is Ready again.
func TestGarbageCollectedBranchStartsOver(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-gcbranch", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	// No branch checks: one between the branch's deletion and the garbage collection would
	// create the branch again (TestIdleBranchIsCheckedForForeignEdits), and keep its objects.
	m.setFetchInterval(t, "0s")
	alice := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns)
	_, err := alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "first"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	file := func(name string) string { return objectFile(m, "", "configmaps", name) }
	require.True(t, poll(60*time.Second, func() bool { return slices.Equal(m.files(t), []string{file("first")}) }), "files: %v", m.files(t))
	committer := strings.Split(m.commits(t)[0], "|")[2]
	startOvers := metricValue(t, "kubescribe_git_branch_start_overs_total")

	m.git(t, "update-ref", "-d", "refs/heads/main")
	m.git(t, "reflog", "expire", "--expire=now", "--all")
	m.git(t, "gc", "--quiet", "--prune=now")
	objects := m.git(t, "count-objects", "-v")
	require.Contains(t, objects, "count: 0", "the server kept no object: %s", objects)
	require.Contains(t, objects, "in-pack: 0", "the server kept no object: %s", objects)
	_, err = alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "second"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	require.True(t, poll(90*time.Second, func() bool { return slices.Equal(m.files(t), []string{file("first"), file("second")}) }),
		"the branch must be created again with every file: %v", m.files(t))
	require.Equal(t, map[string]string{"first": committer + " create", "second": "alice create"}, m.lastChanges(t, 0))
	waitReady(t, v1alpha1.GitTargetsResource, m.ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.True(t, poll(30*time.Second, func() bool {
		return targetEventNaming(t, m.ns, corev1.EventTypeWarning, v1alpha1.ReasonBranchStartedOver, `branch "main"`)
	}), "a BranchStartedOver event")
	require.Equal(t, startOvers+1, metricValue(t, "kubescribe_git_branch_start_overs_total"))
}
