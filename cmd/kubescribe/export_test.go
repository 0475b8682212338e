package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func export(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(append([]string{"export"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestExportFlags(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		err  string
	}{
		{name: "no folder", args: nil, err: "want exactly one folder"},
		{name: "bad concurrency", args: []string{"--concurrency", "0", dir}, err: "--concurrency must be at least 1"},
		{name: "subresource", args: []string{"--resources", "deployments/scale", dir}, err: "subresources are not exported"},
		{name: "empty resources", args: []string{"--resources", ",", dir}, err: "--resources selects nothing"},
		{name: "commit flags without --commit", args: []string{"--author", "A <a@example.com>", dir}, err: "need --commit"},
		{name: "bad progress", args: []string{"--progress", "maybe", dir}, err: `--progress "maybe"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := export(t, tt.args...)
			require.Equal(t, 2, code)
			require.Contains(t, errOut, tt.err)
		})
	}
}

func TestSplitList(t *testing.T) {
	require.Equal(t, []string{"*"}, splitList("*", true))
	require.Equal(t, []string{""}, splitList("", true), `--api-groups "" is the core group`)
	require.Equal(t, []string{"", "apps"}, splitList("core, apps,apps", true))
	require.Equal(t, []string{"", "apps"}, splitList(",apps", true))
	require.Nil(t, splitList("", false))
	require.Equal(t, []string{"a", "b"}, splitList("a,,b,a", false))
}

// Bad input gets a clear error before anything is listed.
func TestExportBadInput(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.kubeconfig")
	require.NoError(t, os.WriteFile(broken, []byte("this: is: not: a kubeconfig"), 0o600))
	unreachable := filepath.Join(dir, "unreachable.kubeconfig")
	require.NoError(t, os.WriteFile(unreachable, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: c
  context:
    cluster: c
    user: u
current-context: c
users:
- name: u
  user:
    token: t
`), 0o600))
	notEmpty := filepath.Join(dir, "not-empty")
	require.NoError(t, os.MkdirAll(notEmpty, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(notEmpty, "x.yaml"), nil, 0o644))

	tests := []struct {
		name string
		args []string
		err  string
	}{
		{name: "missing kubeconfig", args: []string{"--kubeconfig", filepath.Join(dir, "missing"), filepath.Join(dir, "a")}, err: "--kubeconfig: stat"},
		{name: "broken kubeconfig", args: []string{"--kubeconfig", broken, filepath.Join(dir, "b")}, err: "kubeconfig:"},
		{name: "unknown context", args: []string{"--kubeconfig", unreachable, "--context", "nope", filepath.Join(dir, "c")}, err: `context "nope" does not exist`},
		{name: "unreachable apiserver", args: []string{"--kubeconfig", unreachable, filepath.Join(dir, "d")}, err: "cannot discover the resources of https://127.0.0.1:1"},
		{name: "folder not empty", args: []string{"--kubeconfig", unreachable, notEmpty}, err: "is not empty"},
		{name: "commit outside a repository", args: []string{"--kubeconfig", unreachable, "--commit", filepath.Join(dir, "e")}, err: "is not inside a Git repository"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := export(t, tt.args...)
			require.Equal(t, 1, code, errOut)
			require.Contains(t, errOut, tt.err)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one clear line: %s", errOut)
		})
	}
}

// An age recipient that does not parse is a usage error, before anything is read.
func TestExportRefusesABadAgeRecipient(t *testing.T) {
	code, _, errOut := export(t, "--age-recipient", "age1nope", filepath.Join(t.TempDir(), "out"))
	require.Equal(t, 2, code, errOut)
	require.Contains(t, errOut, `--age-recipient: age recipient "age1nope"`)
}

func obj(labels, annotations map[string]string, managers ...string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
	u.SetNamespace("demo")
	u.SetName("x")
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	var mf []metav1.ManagedFieldsEntry
	for _, m := range managers {
		mf = append(mf, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationApply})
	}
	u.SetManagedFields(mf)
	return u
}

func TestArgoTracking(t *testing.T) {
	byAnnotation := obj(nil, map[string]string{argoTrackingAnnotation: "app:/ConfigMap:demo/x"})
	byCustomLabel := obj(map[string]string{"example.com/app": "app"}, nil)
	byBuiltinLabel := obj(map[string]string{argoBuiltinLabel: "app"}, nil)
	plain := obj(map[string]string{"app": "x"}, nil)
	tests := []struct {
		method, labelKey string
		tracked          []*unstructured.Unstructured
		untracked        []*unstructured.Unstructured
	}{
		{"annotation", "example.com/app", []*unstructured.Unstructured{byAnnotation}, []*unstructured.Unstructured{byCustomLabel, byBuiltinLabel, plain}},
		{"annotation+label", "example.com/app", []*unstructured.Unstructured{byAnnotation}, []*unstructured.Unstructured{byCustomLabel, plain}},
		{"label", "example.com/app", []*unstructured.Unstructured{byCustomLabel}, []*unstructured.Unstructured{byAnnotation, byBuiltinLabel, plain}},
		{"label", "", []*unstructured.Unstructured{byBuiltinLabel}, []*unstructured.Unstructured{byAnnotation, byCustomLabel, plain}},
		{"", "example.com/app", []*unstructured.Unstructured{byAnnotation, byCustomLabel}, []*unstructured.Unstructured{byBuiltinLabel, plain}},
		{"", "", []*unstructured.Unstructured{byAnnotation, byBuiltinLabel}, []*unstructured.Unstructured{byCustomLabel, plain}},
	}
	for _, tt := range tests {
		t.Run(tt.method+"/"+tt.labelKey, func(t *testing.T) {
			g := &gitOpsCheck{}
			g.configure(tt.method, tt.labelKey)
			for _, u := range tt.tracked {
				require.NotEmpty(t, g.argoTracked(u), "%v %v", u.GetLabels(), u.GetAnnotations())
			}
			for _, u := range tt.untracked {
				require.Empty(t, g.argoTracked(u), "%v %v", u.GetLabels(), u.GetAnnotations())
			}
		})
	}
	g := &gitOpsCheck{}
	g.configure("", "")
	require.Contains(t, g.argoTracked(byBuiltinLabel), "possibly", "the built-in label is also set by Helm and people")
	require.Empty(t, (&gitOpsCheck{}).argoTracked(byAnnotation), "no argocd-cm, no Argo CD")
}

func TestFluxManaged(t *testing.T) {
	require.Equal(t, "kustomize-controller", fluxManaged(obj(nil, nil, "kubectl", "kustomize-controller")))
	require.Equal(t, "helm-controller", fluxManaged(obj(nil, nil, "helm-controller")))
	require.Empty(t, fluxManaged(obj(nil, nil, "kubectl-client-side-apply")))

	g := &gitOpsCheck{}
	for range maxListed + 3 {
		g.check(obj(nil, nil, "kustomize-controller"))
	}
	var out bytes.Buffer
	g.report(&out)
	require.Contains(t, out.String(), "warning: Flux manages ConfigMap demo/x (field manager kustomize-controller)")
	require.Contains(t, out.String(), "... and 3 more objects managed by Flux")
}

func TestSignature(t *testing.T) {
	s, err := signature("--author", "Alice Example <alice@example.com>")
	require.NoError(t, err)
	require.Equal(t, "Alice Example", s.Name)
	require.Equal(t, "alice@example.com", s.Email)
	_, err = signature("--author", "alice@example.com")
	require.ErrorContains(t, err, `want "Name <email>"`)
	s, err = signature("--author", "")
	require.NoError(t, err)
	require.Nil(t, s)
}
