package git

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/memory"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubescribe/kubescribe/internal/watch"
	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

// The gate tests keep their own fixtures, apart from the worker tests' helpers.
var (
	gateConfigMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	gateSecrets    = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
)

func gateConfigMap(ns, name string) []byte {
	return []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\n  namespace: " + ns + "\ndata:\n  key: v\n")
}

// treeOf writes files (path -> content) into a fresh in-memory object store and returns the tree.
func treeOf(t *testing.T, files map[string][]byte) *object.Tree {
	t.Helper()
	st := memory.NewStorage()
	tb := treeBuilder{s: st}
	root := &editNode{children: map[string]*editNode{}}
	for p, content := range files {
		h, err := tb.writeBlob(content)
		require.NoError(t, err)
		root.add(p, &editNode{blob: h})
	}
	h, err := tb.apply(plumbing.ZeroHash, root)
	require.NoError(t, err)
	tree, err := object.GetTree(st, h)
	require.NoError(t, err)
	return tree
}

// The analyzer's layout is the writer's: every path ObjectPath makes is where the analyzer
// expects that object.
func TestObjectPathIsTheAnalyzersLayout(t *testing.T) {
	for _, c := range []watch.Change{
		{GVR: gateConfigMaps, Namespace: "demo", Name: "app-config"},
		{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Namespace: "demo", Name: "web"},
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Name: "demo"},
		{GVR: schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, Name: "view"},
	} {
		require.Equal(t, ObjectPath("", c), manifestanalyzer.ExpectedPath(c.Namespace, c.GVR.Group, c.GVR.Resource, c.Name))
		require.Equal(t, ObjectPath("clusters/prod", c), "clusters/prod/"+manifestanalyzer.ExpectedPath(c.Namespace, c.GVR.Group, c.GVR.Resource, c.Name))
	}
	require.Equal(t, ClusterScopeDir, manifestanalyzer.ClusterScopeDir)
	require.Equal(t, CoreGroupDir, manifestanalyzer.CoreGroupDir)
}

func TestCheckFolder(t *testing.T) {
	ctx := context.Background()
	cm := watch.Change{GVR: gateConfigMaps, Namespace: "demo", Name: "app"}
	secret := watch.Change{GVR: gateSecrets, Namespace: "demo", Name: "db"}
	tree := treeOf(t, map[string][]byte{
		ObjectPath("clusters/prod", cm):        gateConfigMap("demo", "app"),
		ObjectPath("clusters/staging", cm):     gateConfigMap("demo", "app"),
		ObjectPath("clusters/staging", secret): []byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: demo\ndata:\n  password: aHVudGVyMg==\n"),
		"clusters/README.md":                   []byte("two clusters\n"),
	})

	require.NoError(t, CheckFolder(ctx, tree, "clusters/prod"))
	require.NoError(t, CheckFolder(ctx, tree, "/clusters//prod/"), "the path is cleaned as ObjectPath cleans it")
	require.NoError(t, CheckFolder(ctx, tree, "clusters/new"), "a folder that does not exist yet")
	require.NoError(t, CheckFolder(ctx, nil, "anything"), "a branch without commits")

	err := CheckFolder(ctx, tree, "clusters/staging")
	var refused *FolderRefusedError
	require.True(t, errors.As(err, &refused), err)
	require.Equal(t, "clusters/staging", refused.Path)
	require.Equal(t, []manifestanalyzer.Code{manifestanalyzer.CodePlaintextSecret}, refused.Codes)
	require.Contains(t, err.Error(), `folder "clusters/staging" may not become a GitTarget: plaintext-secret (first: demo/core/secrets/db.yaml:6:`)

	// The repository root holds both clusters: every file is outside the layout.
	err = CheckFolder(ctx, tree, "")
	require.True(t, errors.As(err, &refused), err)
	require.Contains(t, refused.Codes, manifestanalyzer.CodeOutsideLayout)

	err = CheckFolder(ctx, tree, "clusters/README.md")
	require.ErrorContains(t, err, "is a file, not a folder")
}

// treeFS behaves as io/fs requires.
func TestTreeFS(t *testing.T) {
	tree := treeOf(t, map[string][]byte{
		"a/demo/core/configmaps/x.yaml": gateConfigMap("demo", "x"),
		"a/README.md":                   []byte("hi\n"),
		"b.txt":                         []byte("b\n"),
	})
	require.NoError(t, fstest.TestFS(treeFS{tree}, "a/demo/core/configmaps/x.yaml", "a/README.md", "b.txt"))
}
