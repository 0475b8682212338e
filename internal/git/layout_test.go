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
