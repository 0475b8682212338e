package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

// A GitTarget on a folder that holds a Helm chart gets no commit: it is Ready=False with reason
// FolderNotAdoptable and the analyzer's code and file in the message, and its changes wait.
// Once someone removes the chart with a push, the mirror starts, without a restart, with what
// changed while it waited.
func TestGateRefusesHelmChartUntilFixed(t *testing.T) {
	ns := "e2e-gate"
	createNamespace(t, ns)
	createConfigMap(t, ns, "before", nil, nil, map[string]string{"k": "v"})

	local := t.TempDir()
	gitCLI(t, local, "init", "-q", "-b", "main")
	files := map[string]string{
		"clusters/gate/web/Chart.yaml":                         "apiVersion: v2\nname: web\nversion: 0.1.0\n",
		"clusters/gate/web/templates/config.yaml":              "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n",
		"clusters/gate/README.md":                              "the gate e2e test\n",
		"clusters/gate/" + ns + "/core/configmaps/before.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: before\n  namespace: " + ns + "\ndata:\n  k: v\n",
		"clusters/other/" + ns + "/core/x/y.yaml":              "not: an object\n",
	}
	for p, content := range files {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(local, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(local, p), []byte(content), 0o644))
	}
	gitCLI(t, local, "add", ".")
	gitCLI(t, local, "commit", "-q", "-m", "a chart")

	// kubescribe scan says the same as the writer will.
	report, err := manifestanalyzer.ScanPath(context.Background(), filepath.Join(local, "clusters", "gate"), manifestanalyzer.Options{})
	require.NoError(t, err)
	require.False(t, report.Adoptable)
	require.Equal(t, []manifestanalyzer.Code{manifestanalyzer.CodeTemplatedContent}, report.Codes())

	m := &mirror{ns: ns, repo: ns, path: "clusters/gate"}
	m.repoDir, err = env.Git.CreateRepo(m.repo)
	require.NoError(t, err)
	gitCLI(t, local, "push", "-q", m.repoDir, "main:main")
	refused := metricValue(t, `kubescribe_git_folder_checks_total{result="refused"}`)
	fetches := metricValue(t, `kubescribe_git_folder_check_fetches_total{kind="blobs"}`)

	startGitTarget(t, m)
	cond := waitReady(t, v1alpha1.GitTargetsResource, ns, "target", metav1.ConditionFalse, v1alpha1.ReasonFolderNotAdoptable)
	require.Contains(t, cond.Message, `folder "clusters/gate" may not become a GitTarget: templated-content`)
	require.Contains(t, cond.Message, "web/Chart.yaml: a Helm chart")
	createConfigMap(t, ns, "while-refused", nil, nil, map[string]string{"k": "v"})
	require.Len(t, m.commits(t), 1, "nothing is committed into a refused folder")
	// The kubescribe clone has no blobs (the server filters them): the folder's were fetched by id.
	require.Greater(t, metricValue(t, `kubescribe_git_folder_checks_total{result="refused"}`), refused)
	require.Greater(t, metricValue(t, `kubescribe_git_folder_check_fetches_total{kind="blobs"}`), fetches)

	// Someone renders the chart away; the held snapshot and the later change are committed.
	gitCLI(t, local, "rm", "-q", "-r", "clusters/gate/web")
	gitCLI(t, local, "commit", "-q", "-m", "render the chart elsewhere")
	gitCLI(t, local, "push", "-q", m.repoDir, "main:main")
	waitReady(t, v1alpha1.GitTargetsResource, ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)
	m.waitCommits(t, 3)
	ok := poll(60*time.Second, func() bool {
		out := m.git(t, "ls-tree", "-r", "--name-only", "main", "clusters/gate")
		return strings.Contains(out, objectFile(m, "", "configmaps", "before")) &&
			strings.Contains(out, objectFile(m, "", "configmaps", "while-refused")) && strings.Contains(out, "clusters/gate/README.md")
	})
	require.True(t, ok, "the held changes were not committed: %s", m.git(t, "ls-tree", "-r", "--name-only", "main"))
	require.Equal(t, "not: an object", m.git(t, "show", "main:clusters/other/"+ns+"/core/x/y.yaml"), "another folder is never touched")
}
