package e2e

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// kubescribe stopped (as SIGTERM does), then bob creates and patches, alice deletes; after the
// restart the folder equals the cluster object for object, each change made while nothing
// watched is authored by its real author, and no commit lists an unchanged object.
func TestRestartResumesAndAttributes(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-resume", "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)
	alice, bob := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns), clientFor(t, "bob").CoreV1().ConfigMaps(m.ns)
	for _, name := range []string{"keep", "patched", "doomed"} {
		_, err := alice.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	before := m.waitCommits(t, 1)
	require.True(t, poll(60*time.Second, func() bool { return len(m.files(t)) == 3 }), "files: %v", m.files(t))
	before = m.commits(t)

	require.NoError(t, env.StopKubescribe())
	_, err := bob.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "born"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = bob.Patch(ctx, "patched", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	require.NoError(t, alice.Delete(ctx, "doomed", metav1.DeleteOptions{}))
	require.NoError(t, env.StartKubescribe(ctx))

	want := []string{objectFile(m, "", "configmaps", "born"), objectFile(m, "", "configmaps", "keep"), objectFile(m, "", "configmaps", "patched")}
	patched := "main:" + objectFile(m, "", "configmaps", "patched")
	require.True(t, poll(90*time.Second, func() bool {
		return slices.Equal(m.files(t), want) && strings.Contains(m.git(t, "show", patched), "v2")
	}), "the folder must equal the cluster: %v", m.files(t))

	// Each change line of the commits made since: "<op> <group>/<resource> <ns>/<name> ...".
	byObject := map[string]string{}
	for _, c := range m.changeLines(t, len(before)) {
		author, line, _ := strings.Cut(c, "|")
		fields := strings.Fields(line)
		_, name, _ := strings.Cut(fields[2], "/")
		require.NotEqual(t, "keep", name, "a commit lists an unchanged object: %q", c)
		byObject[name] = author + " " + fields[0]
	}
	require.Equal(t, map[string]string{"born": "bob create", "patched": "bob update", "doomed": "alice delete"}, byObject,
		"a change made while nothing watched must be authored by who made it")
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
			if f := strings.Fields(l); len(f) >= 3 && strings.HasPrefix(f[len(f)-1], "resourceVersion=") {
				lines = append(lines, author+"|"+l)
			}
		}
	}
	return lines
}
