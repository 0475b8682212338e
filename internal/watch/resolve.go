package watch

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// Selector selects resources of a cluster by API group and plural resource name ("*" matches
// any), with the operations mirrored on them (empty: all).
type Selector struct {
	APIGroups  []string
	Resources  []string
	Operations []Op
}

// Resource is one resource a set of selectors resolved to: the cluster's preferred version of
// it, and the union of the operations of the selectors that match it.
type Resource struct {
	GVR        schema.GroupVersionResource
	Namespaced bool
	Operations []Op
}

// Resolution is what selectors resolved to in a cluster's discovery catalog.
type Resolution struct {
	// Resources that are mirrored.
	Resources []Resource
	// ClusterScoped lists matching cluster-scoped resources left out because the caller asked
	// for namespaced ones only.
	ClusterScoped []schema.GroupVersionResource
	// Secrets lists matching Secret resources: never mirrored, their data would reach Git
	// unencrypted.
	Secrets []schema.GroupVersionResource
}

// IsSecret reports whether gvr is the core Secret resource, whose data must never reach Git
// in plaintext. Until kubescribe can encrypt it, Secrets are not mirrored at all.
func IsSecret(gvr schema.GroupVersionResource) bool {
	return gvr.Group == "" && gvr.Resource == "secrets"
}

// Resolve maps selectors to the resources the cluster serves with list and watch (its
// preferred version of each). With namespacedOnly, cluster-scoped matches are reported in
// ClusterScoped rather than resolved. When nothing matches, the discovery cache is invalidated
// so that a resource installed since (a new CRD) is found next time.
func (c *Cluster) Resolve(selectors []Selector, namespacedOnly bool) (Resolution, error) {
	res, err := Resolve(c.discovery, selectors, namespacedOnly)
	if err == nil && len(res.Resources) == 0 {
		if cd, ok := c.discovery.(discovery.CachedDiscoveryInterface); ok {
			cd.Invalidate()
		}
	}
	return res, err
}

// Resolve maps selectors to the resources dc serves with list and watch; see Cluster.Resolve.
func Resolve(dc discovery.DiscoveryInterface, selectors []Selector, namespacedOnly bool) (Resolution, error) {
	var out Resolution
	lists, err := dc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return out, fmt.Errorf("discovering the cluster's resources: %w", err)
	}
	// A group whose discovery failed (an aggregated API that is down) is skipped; the others
	// are still watched.
	byGVR := map[schema.GroupVersionResource]*Resource{}
	for _, list := range lists {
		gv, perr := schema.ParseGroupVersion(list.GroupVersion)
		if perr != nil {
			continue
		}
		for _, res := range list.APIResources {
			if strings.Contains(res.Name, "/") || !slices.Contains(res.Verbs, "list") || !slices.Contains(res.Verbs, "watch") {
				continue
			}
			for i := range selectors {
				sel := &selectors[i]
				if !matches(sel.APIGroups, gv.Group) || !matches(sel.Resources, res.Name) {
					continue
				}
				gvr := gv.WithResource(res.Name)
				var ignored *[]schema.GroupVersionResource
				switch {
				case IsSecret(gvr):
					ignored = &out.Secrets
				case namespacedOnly && !res.Namespaced:
					ignored = &out.ClusterScoped
				}
				if ignored != nil {
					if !slices.Contains(*ignored, gvr) {
						*ignored = append(*ignored, gvr)
					}
					continue
				}
				r, ok := byGVR[gvr]
				if !ok {
					r = &Resource{GVR: gvr, Namespaced: res.Namespaced, Operations: []Op{}}
					byGVR[gvr] = r
				}
				r.Operations = mergeOps(r.Operations, sel.Operations)
			}
		}
	}
	for _, r := range byGVR {
		if len(r.Operations) == 0 {
			r.Operations = nil // all
		}
		out.Resources = append(out.Resources, *r)
	}
	// Discovery's order is not stable; sorted lists keep a status from being rewritten.
	slices.SortFunc(out.Resources, func(a, b Resource) int { return compareGVR(a.GVR, b.GVR) })
	slices.SortFunc(out.ClusterScoped, compareGVR)
	slices.SortFunc(out.Secrets, compareGVR)
	return out, nil
}

func matches(patterns []string, s string) bool {
	return slices.Contains(patterns, "*") || slices.Contains(patterns, s)
}

// mergeOps adds a selector's operations to a resource's; a selector with none selects all,
// which absorbs the rest.
func mergeOps(ops, add []Op) []Op {
	if ops == nil {
		return nil // already all
	}
	if len(add) == 0 {
		return nil
	}
	for _, op := range add {
		if !slices.Contains(ops, op) {
			ops = append(ops, op)
		}
	}
	slices.Sort(ops)
	return ops
}

func compareGVR(a, b schema.GroupVersionResource) int {
	return strings.Compare(a.String(), b.String())
}
