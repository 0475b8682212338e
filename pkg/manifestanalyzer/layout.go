package manifestanalyzer

import (
	"path"
	"strings"
)

// ClusterScopeDir is the folder that holds cluster-scoped objects in place of a namespace.
const ClusterScopeDir = "_cluster"

// CoreGroupDir is the folder of the core ("") API group.
const CoreGroupDir = "core"

// ExpectedPath is where kubescribe's writer keeps an object, relative to a GitTarget's folder:
//
//	<namespace|_cluster>/<group|core>/<resource>/<name>.yaml
//
// It is the layout of internal/git's ObjectPath; a test there holds the two together.
func ExpectedPath(namespace, group, resource, name string) string {
	if namespace == "" {
		namespace = ClusterScopeDir
	}
	if group == "" {
		group = CoreGroupDir
	}
	return strings.TrimPrefix(path.Join("/", namespace, group, resource, name+".yaml"), "/")
}

// irregular are the resources whose plural is not derived from their kind by the usual rule.
var irregular = map[string]string{
	"endpoints": "endpoints",
}

// GuessResource derives a resource name from a kind the way Kubernetes names most resources:
// lower case, plural ("Deployment" -> "deployments", "NetworkPolicy" -> "networkpolicies",
// "Ingress" -> "ingresses", "Endpoints" -> "endpoints"). A custom resource may choose another
// plural; Options.ResourceFor gives the real one.
func GuessResource(kind string) string {
	k := strings.ToLower(kind)
	if r, ok := irregular[k]; ok {
		return r
	}
	switch {
	case k == "":
		return ""
	case strings.HasSuffix(k, "s"), strings.HasSuffix(k, "x"), strings.HasSuffix(k, "ch"), strings.HasSuffix(k, "sh"):
		return k + "es"
	case strings.HasSuffix(k, "y") && len(k) > 1 && !strings.ContainsRune("aeiou", rune(k[len(k)-2])):
		return k[:len(k)-1] + "ies"
	}
	return k + "s"
}
