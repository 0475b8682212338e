package manifestanalyzer

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"

	"filippo.io/age"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubescribe/kubescribe/internal/declared"
	"github.com/kubescribe/kubescribe/internal/secretenc"
)

// Every code is shown by a fixture folder named after it, whose report holds that code.
func TestEveryCodeHasAFixture(t *testing.T) {
	for _, c := range Codes() {
		if c == CodeUnreadableFile {
			continue // a file root cannot be kept unreadable in Git: TestUnreadableFile
		}
		t.Run(string(c), func(t *testing.T) {
			r, err := ScanPath(context.Background(), filepath.Join("testdata", "folders", string(c)), Options{})
			require.NoError(t, err)
			require.Contains(t, codesOf(r), c)
			require.Equal(t, SeverityOf(c) == SeverityWarning, r.Adoptable,
				"a folder whose only findings are warnings is adoptable; one with an error is not")
		})
	}
}

func TestAdoptableFixture(t *testing.T) {
	r, err := ScanPath(context.Background(), filepath.Join("testdata", "folders", "adoptable"), Options{})
	require.NoError(t, err)
	require.True(t, r.Adoptable)
	require.Empty(t, r.Codes())
	require.Equal(t, 6, r.Objects, "a template action inside a ConfigMap's data is content, not a template")
}

func codesOf(r *Report) []Code {
	var out []Code
	for _, f := range r.Findings {
		out = append(out, f.Code)
	}
	return out
}

// failingFS is a MapFS (seen only through Open) whose files listed in fail cannot be opened.
type failingFS struct {
	MapFS fstest.MapFS
	fail  map[string]bool
}

func (f failingFS) Open(name string) (fs.File, error) {
	if f.fail[name] {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
	}
	return f.MapFS.Open(name)
}

func TestUnreadableFile(t *testing.T) {
	fsys := failingFS{MapFS: fstest.MapFS{
		"demo/core/configmaps/a.yaml": {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: demo\n")},
		"demo/core/configmaps/b.yaml": {Data: []byte("x")},
	}, fail: map[string]bool{"demo/core/configmaps/b.yaml": true}}
	r, err := ScanFolder(context.Background(), fsys, Options{})
	require.NoError(t, err)
	require.False(t, r.Adoptable)
	require.Len(t, r.Findings, 1)
	require.Equal(t, CodeUnreadableFile, r.Findings[0].Code)
	require.Equal(t, "demo/core/configmaps/b.yaml", r.Findings[0].File)
	require.Contains(t, r.Findings[0].Message, "demo/core/configmaps/b.yaml: cannot be read")
}

func TestBadInputIsAnError(t *testing.T) {
	ctx := context.Background()
	_, err := ScanPath(ctx, filepath.Join(t.TempDir(), "missing"), Options{})
	require.ErrorIs(t, err, fs.ErrNotExist)
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o644))
	_, err = ScanPath(ctx, f, Options{})
	require.ErrorContains(t, err, "is not a directory")
	_, err = ScanRepoPath(ctx, f, Options{})
	require.ErrorContains(t, err, "is not a directory")
	_, err = ScanFolder(ctx, failingFS{MapFS: fstest.MapFS{}, fail: map[string]bool{".": true}}, Options{})
	require.ErrorContains(t, err, "reading the folder")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = ScanPath(cancelled, filepath.Join("testdata", "folders", "adoptable"), Options{})
	require.True(t, errors.Is(err, context.Canceled), err)
}

func TestEmptyFolderIsAdoptable(t *testing.T) {
	r, err := ScanPath(context.Background(), t.TempDir(), Options{})
	require.NoError(t, err)
	require.True(t, r.Adoptable)
	require.NotNil(t, r.Findings)
	b, err := json.Marshal(r)
	require.NoError(t, err)
	require.Contains(t, string(b), `"findings":[]`)
}

// What the writer writes (declared.Manifest at ExpectedPath) is adoptable without a warning.
func TestWritersOutputIsAdoptable(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"configmap", "deployment", "service", "clusterrole", "namespace"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "internal", "declared", "testdata", name+".json"))
		require.NoError(t, err)
		obj := &unstructured.Unstructured{}
		require.NoError(t, obj.UnmarshalJSON(raw))
		b, err := declared.Manifest(obj)
		require.NoError(t, err)
		p := filepath.Join(dir, filepath.FromSlash(ExpectedPath(obj.GetNamespace(), obj.GroupVersionKind().Group, GuessResource(obj.GetKind()), obj.GetName())))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, b, 0o644))
	}
	r, err := ScanPath(context.Background(), dir, Options{})
	require.NoError(t, err)
	require.True(t, r.Adoptable)
	require.Empty(t, r.Findings)
	require.Equal(t, 5, r.Objects)
}

func TestResourceFor(t *testing.T) {
	dir := filepath.Join("testdata", "folders", "resource-unverified")
	served := func(plural string) Options {
		return Options{ResourceFor: func(group, kind string) (string, bool) {
			if group == "example.com" && kind == "Widget" {
				return plural, true
			}
			return "", false
		}}
	}
	r, err := ScanPath(context.Background(), dir, served("widgetz"))
	require.NoError(t, err)
	require.Empty(t, r.Findings, "the cluster confirms the folder")

	r, err = ScanPath(context.Background(), dir, served("widgets"))
	require.NoError(t, err)
	require.Equal(t, []Code{CodeLayoutMismatch}, r.Codes())
	require.Contains(t, r.Findings[0].Message, `resource folder "widgetz", want "widgets"`)

	r, err = ScanPath(context.Background(), dir, Options{ResourceFor: func(string, string) (string, bool) { return "", false }})
	require.NoError(t, err)
	require.Equal(t, []Code{CodeResourceUnverified}, codesOf(r))
}

func TestGuessResource(t *testing.T) {
	for kind, want := range map[string]string{
		"ConfigMap": "configmaps", "Deployment": "deployments", "NetworkPolicy": "networkpolicies",
		"Ingress": "ingresses", "Endpoints": "endpoints", "Gateway": "gateways", "IngressClass": "ingressclasses",
		"ComponentStatus": "componentstatuses", "": "",
	} {
		require.Equal(t, want, GuessResource(kind), kind)
	}
}

func TestExpectedPath(t *testing.T) {
	require.Equal(t, "demo/core/configmaps/a.yaml", ExpectedPath("demo", "", "configmaps", "a"))
	require.Equal(t, "_cluster/rbac.authorization.k8s.io/clusterroles/view.yaml", ExpectedPath("", "rbac.authorization.k8s.io", "clusterroles", "view"))
}

func TestRepoAdoptable(t *testing.T) {
	r, err := ScanRepoPath(context.Background(), filepath.Join("testdata", "repo"), Options{})
	require.NoError(t, err)
	require.Equal(t, []string{"clusters/prod"}, r.Adoptable())
	require.Equal(t, []Code{CodePlaintextSecret}, r.Folders[1].Codes())
}

// A Secret the writer sealed for a GitTarget's age recipients (a SOPS document) is adoptable
// without a finding: neither in the clear nor a form the writer would rewrite.
func TestSealedSecretIsAdoptable(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	require.NoError(t, err)
	enc, err := secretenc.NewEncrypter([]string{id.Recipient().String()})
	require.NoError(t, err)
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": "db", "namespace": "demo"}, "data": map[string]any{"password": "aHVudGVyMg=="}}}
	plain, err := declared.Manifest(obj)
	require.NoError(t, err)
	sealed, err := enc.Encrypt(plain)
	require.NoError(t, err)
	dir := t.TempDir()
	p := filepath.Join(dir, filepath.FromSlash(ExpectedPath("demo", "", "secrets", "db")))
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, sealed, 0o644))
	r, err := ScanPath(context.Background(), dir, Options{})
	require.NoError(t, err)
	require.True(t, r.Adoptable)
	require.Empty(t, r.Findings)
	require.Equal(t, 1, r.Objects)
}
