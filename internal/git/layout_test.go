package git

import (
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kubescribe/kubescribe/internal/watch"
)

func TestObjectPath(t *testing.T) {
	tests := []struct {
		name       string
		targetPath string
		change     watch.Change
		want       string
	}{
		{
			name:   "namespaced core object at the root",
			change: watch.Change{GVR: configMaps, Namespace: "demo", Name: "app-config"},
			want:   "demo/core/configmaps/app-config.yaml",
		},
		{
			name:       "namespaced object of a group under a folder",
			targetPath: "clusters/prod",
			change:     watch.Change{GVR: deploys, Namespace: "demo", Name: "web"},
			want:       "clusters/prod/demo/apps/deployments/web.yaml",
		},
		{
			name:       "cluster-scoped core object",
			targetPath: "prod",
			change:     watch.Change{GVR: namespaces, Name: "demo"},
			want:       "prod/_cluster/core/namespaces/demo.yaml",
		},
		{
			name:   "cluster-scoped object of a group",
			change: watch.Change{GVR: schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, Name: "view"},
			want:   "_cluster/rbac.authorization.k8s.io/clusterroles/view.yaml",
		},
		{
			name:       "target path is cleaned",
			targetPath: "/a//b/./c/",
			change:     watch.Change{GVR: configMaps, Namespace: "demo", Name: "x"},
			want:       "a/b/c/demo/core/configmaps/x.yaml",
		},
		{
			name:       "target path cannot climb above the root",
			targetPath: "../../etc",
			change:     watch.Change{GVR: configMaps, Namespace: "demo", Name: "x"},
			want:       "etc/demo/core/configmaps/x.yaml",
		},
		{
			name:       "root given as slash",
			targetPath: "/",
			change:     watch.Change{GVR: configMaps, Namespace: "demo", Name: "x"},
			want:       "demo/core/configmaps/x.yaml",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, ObjectPath(tt.targetPath, tt.change))
		})
	}
}

// TestValidChangeRefusesHostileParts: each raw part of an object's path is checked before it
// is joined, so no namespace, group, resource or name a non-conformant server sends can place
// a file outside the target's folder, inside .git, or where a Git host gives it a meaning.
func TestValidChangeRefusesHostileParts(t *testing.T) {
	manifest := []byte("kind: ConfigMap\n")
	change := func(ns, group, resource, name string) watch.Change {
		return watch.Change{Op: watch.OpCreate, Manifest: manifest, Namespace: ns, Name: name,
			GVR: schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}}
	}
	tests := []struct {
		name   string
		target string
		change watch.Change
		err    string // "" : valid
	}{
		{"plain", "apps", change("demo", "", "configmaps", "web"), ""},
		{"group", "apps", change("demo", "apps", "deployments", "web"), ""},
		{"cluster scope", "", change("", "rbac.authorization.k8s.io", "clusterroles", "view"), ""},
		{"dots inside a name", "apps", change("demo", "", "configmaps", "a..b"), ""},
		{"a name starting with git", "apps", change("demo", "", "configmaps", "git-config"), ""},
		{"namespace ..", "apps", change("..", "", "configmaps", "web"), `namespace ".." is a relative path`},
		{"namespace .", "apps", change(".", "", "configmaps", "web"), `namespace "." is a relative path`},
		{"namespace ../..", "apps", change("../..", "", "configmaps", "web"), `namespace "../.." contains a path separator`},
		{"group ..", "apps", change("demo", "..", "configmaps", "web"), `group ".." is a relative path`},
		{"group .github", "apps", change("..", ".github", "workflows", "evil"), `namespace ".."`},
		{"group .github alone", "", change("x", ".github", "workflows", "evil"), `group ".github" starts with ".git"`},
		{"resource ..", "apps", change("demo", "", "..", "web"), `resource ".." is a relative path`},
		{"resource empty", "apps", change("demo", "", "", "web"), `resource is empty`},
		{"name ..", "apps", change("demo", "", "configmaps", ".."), `name ".." is a relative path`},
		{"name empty", "apps", change("demo", "", "configmaps", ""), `name is empty`},
		{"name with slash", "apps", change("demo", "", "configmaps", "a/b"), `name "a/b" contains a path separator`},
		{"name with backslash", "apps", change("demo", "", "configmaps", `..\..\x`), `contains a path separator`},
		{"name with NUL", "apps", change("demo", "", "configmaps", "a\x00b"), `contains a NUL`},
		{"namespace .git", "", change(".git", "", "configmaps", "hooks"), `namespace ".git" starts with ".git"`},
		{"namespace .GIT", "", change(".GIT", "", "configmaps", "x"), `starts with ".git"`},
		{"name .gitmodules", "", change("demo", "", "configmaps", ".gitmodules"), `starts with ".git"`},
		{"target folder .git", ".git/hooks", change("demo", "", "configmaps", "x"), `target folder ".git/hooks"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := validChange(tt.target, tt.change)
			if tt.err == "" {
				require.NoError(t, err)
				p := ObjectPath(tt.target, tt.change)
				require.True(t, underFolder(tt.target, p), "%q under %q", p, tt.target)
				return
			}
			require.ErrorContains(t, err, tt.err)
		})
	}
}

// TestValidChangeChecksASweepsScope: a sweep removes files in its namespace scope: a scope of
// ".." would remove files outside the folder.
func TestValidChangeChecksASweepsScope(t *testing.T) {
	sweep := watch.Change{Op: watch.OpSweep, GVR: configMaps, Scope: "demo"}
	require.NoError(t, validChange("apps", sweep))
	sweep.Scope = ""
	require.NoError(t, validChange("apps", sweep))
	for _, scope := range []string{"..", ".", "a/b", ".git"} {
		sweep.Scope = scope
		require.Error(t, validChange("apps", sweep), scope)
	}
	sweep.Scope, sweep.GVR.Resource = "demo", ".."
	require.Error(t, validChange("apps", sweep))
}

func TestUnderFolder(t *testing.T) {
	require.True(t, underFolder("apps", "apps/demo/core/configmaps/x.yaml"))
	require.True(t, underFolder("", "demo/core/configmaps/x.yaml"))
	require.True(t, underFolder("/a//b/", "a/b/x.yaml"))
	require.False(t, underFolder("apps", "apps"))
	require.False(t, underFolder("apps", "apps2/x.yaml"))
	require.False(t, underFolder("apps", ".github/workflows/evil.yaml"))
	require.False(t, underFolder("", ""))
	require.False(t, underFolder("", "../x"))
}
