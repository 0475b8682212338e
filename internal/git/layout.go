package git

import (
	"fmt"
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
// slash and no ".." segment can climb above the root. It does not check its parts: a
// namespace, group, resource or name of ".." would climb out of targetPath, so checkParts
// (validChange) must accept them first.
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

// checkPart reports why one raw part of an object's path (a namespace, group, resource or
// name, before anything joins it) cannot be a path segment under the target's folder: empty,
// "." or "..", a '/' or '\' (a separator on some checkouts), a NUL, or a name Git or a Git
// host gives a meaning (".git", ".github", ".gitmodules", ... in any case). A conformant
// apiserver never serves such parts; a non-conformant remote could, to write elsewhere.
func checkPart(what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%s is empty", what)
	case v == "." || v == "..":
		return fmt.Errorf("%s %q is a relative path", what, v)
	case strings.ContainsAny(v, "/\\"):
		return fmt.Errorf("%s %q contains a path separator", what, v)
	case strings.ContainsRune(v, 0):
		return fmt.Errorf("%s %q contains a NUL", what, v)
	case len(v) >= 4 && strings.EqualFold(v[:4], ".git"):
		return fmt.Errorf("%s %q starts with \".git\"", what, v)
	}
	return nil
}

// checkParts checks the raw parts of a change's path; namespace "" is cluster scope, group ""
// the core group, and a sweep has no name.
func checkParts(c watch.Change, withName bool) error {
	if c.Namespace != "" {
		if err := checkPart("namespace", c.Namespace); err != nil {
			return err
		}
	}
	if c.GVR.Group != "" {
		if err := checkPart("group", c.GVR.Group); err != nil {
			return err
		}
	}
	if err := checkPart("resource", c.GVR.Resource); err != nil {
		return err
	}
	if withName {
		if err := checkPart("name", c.Name); err != nil {
			return err
		}
	}
	return nil
}

// checkTargetPath reports why a GitTarget's folder cannot hold objects: a segment that is
// ".git" (in any case) or holds a NUL. (The API refuses empty, "." and ".." segments.)
func checkTargetPath(targetPath string) error {
	for _, seg := range strings.Split(targetPath, "/") {
		if strings.EqualFold(seg, ".git") || strings.ContainsRune(seg, 0) {
			return fmt.Errorf("target folder %q cannot be stored in git", targetPath)
		}
	}
	return nil
}

// underFolder reports whether p, a clean relative path, lies inside the folder targetPath.
func underFolder(targetPath, p string) bool {
	base := strings.TrimPrefix(path.Join("/", targetPath), "/")
	if base == "" {
		return p != "" && p != ".." && !strings.HasPrefix(p, "../") && !strings.HasPrefix(p, "/")
	}
	return strings.HasPrefix(p, base+"/")
}
