package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// A folder with someone else's files is read once, when kubescribe adopts it. The GitTarget's
// status records the tree kubescribe's push left there, and after a restart the folder, still
// at that tree, is not read again.
func TestGateDoesNotReadItsOwnFolderAfterRestart(t *testing.T) {
	ns := "e2e-gate-restart"
	createNamespace(t, ns)
	createConfigMap(t, ns, "one", nil, nil, map[string]string{"k": "v"})

	local := t.TempDir()
	gitCLI(t, local, "init", "-q", "-b", "main")
	foreign := filepath.Join(local, "clusters", "r", ns, "core", "configmaps", "foreign.yaml")
	require.NoError(t, os.MkdirAll(filepath.Dir(foreign), 0o755))
	require.NoError(t, os.WriteFile(foreign, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: foreign\n  namespace: "+ns+"\n"), 0o644))
	gitCLI(t, local, "add", ".")
	gitCLI(t, local, "commit", "-q", "-m", "someone else's object")
	m := &mirror{ns: ns, repo: ns, path: "clusters/r"}
	var err error
	m.repoDir, err = env.Git.CreateRepo(m.repo)
	require.NoError(t, err)
	gitCLI(t, local, "push", "-q", m.repoDir, "main:main")
	url := env.Git.URL(m.repo)

	startGitTarget(t, m)
	// The snapshot writes one and sweeps foreign (no such object): the folder is kubescribe's.
	ok := poll(60*time.Second, func() bool {
		files := m.files(t)
		return len(files) == 1 && files[0] == objectFile(m, "", "configmaps", "one")
	})
	require.True(t, ok, "files: %v", m.files(t))
	tree := m.git(t, "rev-parse", "main:clusters/r")
	ok = poll(60*time.Second, func() bool { return targetStatusField(t, ns, "folderTree") == tree })
	require.True(t, ok, "status.folderTree %q, the folder's tree %q", targetStatusField(t, ns, "folderTree"), tree)
	require.Equal(t, 1, countLog(t, "folder checked: it may become a GitTarget's folder", url), "the foreign folder was read once")

	require.NoError(t, env.StopKubescribe())
	require.NoError(t, env.StartKubescribe(context.Background()))
	createConfigMap(t, ns, "two", nil, nil, map[string]string{"k": "v"})
	ok = poll(90*time.Second, func() bool { return len(m.files(t)) == 2 })
	require.True(t, ok, "files: %v", m.files(t))
	require.Equal(t, 1, countLog(t, "folder checked: it may become a GitTarget's folder", url), "not read again after the restart")
	require.GreaterOrEqual(t, countLog(t, "folder is as kubescribe's last push left it; not read again", url), 1)
}

// targetStatusField is a string field of the status of GitTarget "target" in ns.
func targetStatusField(t *testing.T, ns, field string) string {
	t.Helper()
	u, err := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(ns).Get(context.Background(), "target", metav1.GetOptions{})
	require.NoError(t, err)
	v, _, _ := unstructured.NestedString(u.Object, "status", field)
	return v
}

// countLog counts the lines of kubescribe's log (all its starts) with message msg from the
// worker of repository url.
func countLog(t *testing.T, msg, url string) int {
	t.Helper()
	f, err := os.Open(env.LogPath)
	require.NoError(t, err)
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == msg && line.URL == url {
			n++
		}
	}
	require.NoError(t, sc.Err())
	return n
}
