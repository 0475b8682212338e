package git

import (
	"path"
	"strings"

	"github.com/kubescribe/kubescribe/internal/watch"
)

// ClusterScopeDir is the directory that holds cluster-scoped objects in place of a namespace.
const ClusterScopeDir = "_cluster"

// CoreGroupDir is the directory of the core ("") API group.
const CoreGroupDir = "core"

// ObjectPath is where an object lives in the repository:
//
//	<targetPath>/<namespace|_cluster>/<group|core>/<resource>/<name>.yaml
//
// targetPath "" (or "/") is the repository root. The result is clean and relative: no leading
// slash and no ".." segment can climb above the root.
func ObjectPath(targetPath string, c watch.Change) string {
	ns := c.Namespace
	if ns == "" {
		ns = ClusterScopeDir
	}
	p := path.Join("/", targetPath, ns, groupDir(c.GVR.Group), c.GVR.Resource, c.Name+".yaml")
	return strings.TrimPrefix(p, "/")
}

func groupDir(group string) string {
	if group == "" {
		return CoreGroupDir
	}
	return group
}
