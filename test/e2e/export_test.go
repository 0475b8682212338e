package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/getsops/sops/v3/cmd/sops/formats"
	"github.com/getsops/sops/v3/decrypt"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/declared"
	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

var configMapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func createNamespace(t *testing.T, ns string) {
	t.Helper()
	_, err := clientFor(t, "admin").CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
}

func createConfigMap(t *testing.T, ns, name string, labels, annotations, data map[string]string) {
	t.Helper()
	_, err := clientFor(t, "admin").CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations}, Data: data,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// export runs `kubescribe export` as admin and requires it to succeed.
func exportAsAdmin(t *testing.T, args ...string) cliResult {
	t.Helper()
	r := runCLI(t, append([]string{"export", "--kubeconfig", kubeconfigFor(t, "admin")}, args...)...)
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	return r
}

// Export every object of the real apiserver, then scan the folder: it is adoptable, every file
// is the declared form the writer would write, and no Secret is in it.
func TestExportThenScanIsAdoptable(t *testing.T) {
	ctx := context.Background()
	ns := "e2e-export-all"
	createNamespace(t, ns)
	createConfigMap(t, ns, "app", map[string]string{"app": "web"},
		map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"},
		map[string]string{"greeting": "hello\nworld\n", "enabled": "true"})
	_, err := clientFor(t, "admin").CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db"}, StringData: map[string]string{"password": "hunter2"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "cluster")
	r := exportAsAdmin(t, dir)
	require.Contains(t, r.stdout, "exported ")
	require.Contains(t, r.stdout, " objects/s)")
	require.Contains(t, r.stderr, "Secrets are exported only encrypted (--age-recipient)")
	require.NotContains(t, r.stderr, "Argo CD", "no argocd-cm: not an Argo CD cluster, nothing said")

	// Byte for byte the writer's declared form, at the writer's path.
	live, err := dynamicFor(t, "admin").Resource(configMapsGVR).Namespace(ns).Get(ctx, "app", metav1.GetOptions{})
	require.NoError(t, err)
	want, err := declared.Manifest(live)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dir, ns, "core", "configmaps", "app.yaml"))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
	require.FileExists(t, filepath.Join(dir, "_cluster", "core", "namespaces", ns+".yaml"))
	require.FileExists(t, filepath.Join(dir, "_cluster", "apiextensions.k8s.io", "customresourcedefinitions", "gittargets.kubescribe.dev.yaml"))

	var secrets []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "secrets" {
			secrets = append(secrets, p)
		}
		return err
	}))
	require.Empty(t, secrets, "Secrets are exported only encrypted, with --age-recipient")

	report, err := manifestanalyzer.ScanPath(ctx, dir, manifestanalyzer.Options{})
	require.NoError(t, err)
	require.True(t, report.Adoptable, "%+v", report.Findings)
	for _, f := range report.Findings {
		require.NotEqual(t, manifestanalyzer.CodeRewriteExpected, f.Code, f.Message)
	}
	require.Greater(t, report.Objects, 50)

	s := runCLI(t, "scan", dir)
	require.Equal(t, 0, s.code, "stdout:\n%s\nstderr:\n%s", s.stdout, s.stderr)
	require.Contains(t, s.stdout, ": adoptable (")

	// With an age recipient, the Secrets are exported too, as SOPS documents the identity
	// decrypts to the cluster's data; scan accepts them.
	identity, err := age.GenerateX25519Identity()
	require.NoError(t, err)
	sealed := filepath.Join(t.TempDir(), "sealed")
	r = exportAsAdmin(t, "--namespaces", ns, "--age-recipient", identity.Recipient().String(), sealed)
	require.NotContains(t, r.stderr, "Secrets are exported only encrypted")
	enc, err := os.ReadFile(filepath.Join(sealed, ns, "core", "secrets", "db.yaml"))
	require.NoError(t, err)
	require.NotContains(t, string(enc), "hunter2")
	require.NotContains(t, string(enc), base64.StdEncoding.EncodeToString([]byte("hunter2")))
	plain := decryptWith(t, identity, enc)
	var gotSecret corev1.Secret
	require.NoError(t, yaml.Unmarshal(plain, &gotSecret))
	require.Equal(t, map[string][]byte{"password": []byte("hunter2")}, gotSecret.Data)
	report, err = manifestanalyzer.ScanPath(ctx, sealed, manifestanalyzer.Options{})
	require.NoError(t, err)
	require.True(t, report.Adoptable, "%+v", report.Findings)
	for _, f := range report.Findings {
		require.NotEqual(t, manifestanalyzer.CodeRewriteExpected, f.Code, f.Message)
	}
}

// decryptWith decrypts a SOPS document with identity, through the sops library.
func decryptWith(t *testing.T, identity *age.X25519Identity, enc []byte) []byte {
	t.Helper()
	t.Setenv("SOPS_AGE_KEY", identity.String())
	plain, err := decrypt.DataWithFormat(enc, formats.Yaml)
	require.NoError(t, err)
	return plain
}

// Export a namespace's ConfigMaps as one commit, push it, and put a GitTarget on that folder:
// kubescribe starts without rewriting any exported file; the only later change is the object
// created afterwards.
func TestExportIntoGitTargetRewritesNothing(t *testing.T) {
	ns := "e2e-export-target"
	createNamespace(t, ns)
	createConfigMap(t, ns, "one", map[string]string{"app": "one"}, nil, map[string]string{"k": "v", "multi": "a\nb\n"})
	createConfigMap(t, ns, "two", nil, map[string]string{"note": "0755"}, map[string]string{"n": "1", "yes": "yes"})

	local := t.TempDir()
	gitCLI(t, local, "init", "-q", "-b", "main")
	dir := filepath.Join(local, "clusters", "e2e")
	r := exportAsAdmin(t, "--namespaces", ns, "--api-groups", "", "--resources", "configmaps",
		"--commit", "--author", "Export Bot <export@example.com>", "--message", "Adopt "+ns, dir)
	require.Contains(t, r.stdout, "committed ")
	require.Contains(t, r.stdout, "exported 2 objects", "one and two (no controller-manager publishes kube-root-ca.crt here)")
	exported := gitCLI(t, local, "rev-parse", "HEAD")
	require.Equal(t, "Export Bot|export@example.com|Export Bot|Adopt "+ns, gitCLI(t, local, "log", "-1", "--format=%an|%ae|%cn|%s"))

	m := &mirror{ns: ns, repo: ns, path: "clusters/e2e"}
	var err error
	m.repoDir, err = env.Git.CreateRepo(m.repo)
	require.NoError(t, err)
	gitCLI(t, local, "push", "-q", m.repoDir, "main:main")

	report, err := manifestanalyzer.ScanPath(context.Background(), dir, manifestanalyzer.Options{})
	require.NoError(t, err)
	require.True(t, report.Adoptable, "%+v", report.Findings)
	require.Empty(t, report.Findings)

	startGitTarget(t, m)
	createConfigMap(t, ns, "marker", nil, nil, map[string]string{"k": "v"})
	commits := m.waitCommits(t, 2)
	require.Len(t, commits, 2, "the export, then the marker; nothing rewritten: %q", commits)
	require.Equal(t, "clusters/e2e/"+ns+"/core/configmaps/marker.yaml", m.git(t, "diff", "--name-only", exported, "main"))
}

// startGitTarget creates the GitProvider, GitTarget (folder m.path of branch main) and a
// WatchRule for ConfigMaps in namespace m.ns, and waits until the WatchRule is Ready.
func startGitTarget(t *testing.T, m *mirror) {
	t.Helper()
	_, err := clientFor(t, "admin").CoreV1().Secrets(m.ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "git-credentials"},
		Data: map[string][]byte{
			v1alpha1.SecretKeyUsername: []byte(env.Git.Username),
			v1alpha1.SecretKeyPassword: []byte(env.Git.Password),
			v1alpha1.SecretKeyCACert:   env.Git.CAData,
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	create(t, v1alpha1.GitProvidersResource, m.ns, &v1alpha1.GitProvider{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
		ObjectMeta: metav1.ObjectMeta{Name: "repo", Namespace: m.ns},
		Spec: v1alpha1.GitProviderSpec{
			URL:          env.Git.URL(m.repo),
			SecretRef:    &v1alpha1.LocalObjectReference{Name: "git-credentials"},
			CommitWindow: &metav1.Duration{Duration: time.Second},
		},
	})
	create(t, v1alpha1.GitTargetsResource, m.ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: m.ns},
		Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "repo"}, Branch: "main", Path: m.path},
	})
	create(t, v1alpha1.WatchRulesResource, m.ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "rule", Namespace: m.ns},
		Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"},
			Rules: []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}}}},
	})
	waitReady(t, v1alpha1.WatchRulesResource, m.ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady)
}

// gitCLI runs git in a working tree.
func gitCLI(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@example.com",
		"GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@example.com")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %s: %s", strings.Join(args, " "), out)
	return strings.TrimRight(string(out), "\n")
}

// Export warns about objects Argo CD tracks, under each tracking method argocd-cm names, and
// about objects Flux applied (server-side apply with its field managers). A cluster without
// argocd-cm is not an Argo CD cluster: no Argo CD warning, no error.
func TestExportWarnsAboutArgoCDAndFlux(t *testing.T) {
	ctx := context.Background()
	ns := "e2e-export-gitops"
	createNamespace(t, ns)
	createConfigMap(t, ns, "by-annotation", nil, map[string]string{"argocd.argoproj.io/tracking-id": "shop:/ConfigMap:" + ns + "/by-annotation"}, nil)
	createConfigMap(t, ns, "by-custom-label", map[string]string{"example.com/argo-app": "shop"}, nil, nil)
	createConfigMap(t, ns, "by-builtin-label", map[string]string{"app.kubernetes.io/instance": "shop"}, nil, nil)
	createConfigMap(t, ns, "plain", map[string]string{"app": "shop"}, nil, nil)
	for name, manager := range map[string]string{"by-kustomize": "kustomize-controller", "by-helm": "helm-controller"} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"data":     map[string]any{"k": "v"},
		}}
		_, err := dynamicFor(t, "admin").Resource(configMapsGVR).Namespace(ns).Apply(ctx, name, u,
			metav1.ApplyOptions{FieldManager: manager, Force: true})
		require.NoError(t, err)
	}

	all := []string{"by-annotation", "by-custom-label", "by-builtin-label"}
	tests := []struct {
		name, method, labelKey string
		noArgoCD               bool
		tracked                []string
	}{
		{name: "annotation", method: "annotation", labelKey: "example.com/argo-app", tracked: []string{"by-annotation"}},
		{name: "annotation+label", method: "annotation+label", labelKey: "example.com/argo-app", tracked: []string{"by-annotation"}},
		{name: "label", method: "label", labelKey: "example.com/argo-app", tracked: []string{"by-custom-label"}},
		{name: "method unset", labelKey: "example.com/argo-app", tracked: []string{"by-annotation", "by-custom-label"}},
		{name: "method and label key unset", tracked: []string{"by-annotation", "by-builtin-label"}},
		{name: "no Argo CD", noArgoCD: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			argoNS := fmt.Sprintf("e2e-argocd-%d", i)
			if !tt.noArgoCD {
				createNamespace(t, argoNS)
				data := map[string]string{}
				if tt.method != "" {
					data["application.resourceTrackingMethod"] = tt.method
				}
				if tt.labelKey != "" {
					data["application.instanceLabelKey"] = tt.labelKey
				}
				createConfigMap(t, argoNS, "argocd-cm", nil, nil, data)
			}
			dir := filepath.Join(t.TempDir(), "out")
			r := exportAsAdmin(t, "--namespaces", ns, "--api-groups", "", "--resources", "configmaps", "--argocd-namespace", argoNS, dir)
			for _, name := range all {
				line := "warning: Argo CD tracks ConfigMap " + ns + "/" + name + " ("
				if contains(tt.tracked, name) {
					require.Contains(t, r.stderr, line)
				} else {
					require.NotContains(t, r.stderr, line)
				}
			}
			require.NotContains(t, r.stderr, "ConfigMap "+ns+"/plain")
			if tt.noArgoCD {
				require.NotContains(t, r.stderr, "Argo CD")
			} else {
				require.Contains(t, r.stderr, "Argo CD found (ConfigMap "+argoNS+"/argocd-cm)")
				require.Contains(t, r.stdout, fmt.Sprintf("%d tracked by Argo CD, 2 managed by Flux", len(tt.tracked)))
			}
			require.Contains(t, r.stderr, "warning: Flux manages ConfigMap "+ns+"/by-kustomize (field manager kustomize-controller)")
			require.Contains(t, r.stderr, "warning: Flux manages ConfigMap "+ns+"/by-helm (field manager helm-controller)")

			b, err := os.ReadFile(filepath.Join(dir, ns, "core", "configmaps", "by-annotation.yaml"))
			require.NoError(t, err)
			require.NotContains(t, string(b), "tracking-id", "the declared form drops Argo CD's stamp")
		})
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// Progress is drawn only on a terminal: through a pipe stderr holds warnings alone; forced on,
// it names each resource with its count.
func TestExportProgressOnlyOnATerminal(t *testing.T) {
	ns := "e2e-export-progress"
	createNamespace(t, ns)
	for i := range 3 {
		createConfigMap(t, ns, fmt.Sprintf("cm-%d", i), nil, nil, nil)
	}
	args := []string{"--namespaces", ns, "--api-groups", "", "--resources", "configmaps"}
	quiet := exportAsAdmin(t, append(args, filepath.Join(t.TempDir(), "quiet"))...)
	require.Empty(t, quiet.stderr, "not a terminal: nothing drawn")
	require.Contains(t, quiet.stdout, "exported 3 objects of 1 resource")

	shown := exportAsAdmin(t, append(args, "--progress", "always", filepath.Join(t.TempDir(), "shown"))...)
	require.Regexp(t, `core/configmaps +3\n`, shown.stderr)
}

// A user who may not list a selected resource gets a warning naming it, not a failed export;
// the resources they may list are exported.
func TestExportSkipsForbiddenResources(t *testing.T) {
	ns := "e2e-export-forbidden"
	createNamespace(t, ns)
	createConfigMap(t, ns, "visible", nil, nil, nil)
	_, err := clientFor(t, "admin").RbacV1().Roles(ns).Create(context.Background(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = clientFor(t, "admin").RbacV1().RoleBindings(ns).Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "carol-reads"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "read-configmaps"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "carol"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, "export", "--kubeconfig", kubeconfigFor(t, "carol"), "--namespaces", ns,
		"--api-groups", "", "--resources", "configmaps,serviceaccounts", dir)
	require.Equal(t, 0, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "warning: not exported, listing is forbidden: core/serviceaccounts in namespace "+ns)
	require.Contains(t, r.stdout, "exported 1 object of 2 resources")
	require.FileExists(t, filepath.Join(dir, ns, "core", "configmaps", "visible.yaml"))
	require.Contains(t, r.stderr, "cannot read ConfigMap argocd/argocd-cm", "carol may not read argocd-cm: said, and the export goes on")
}
