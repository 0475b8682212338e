package watch

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
)

// Selector selects resources of a cluster by API group, version and plural resource name ("*"
// matches any group or resource), with the operations mirrored on them (empty: all).
type Selector struct {
	APIGroups []string
	// APIVersions restricts the versions a resource may be watched in; each resource is watched
	// in the most preferred of them that serves it. Empty: the group's preferred version (or,
	// for a resource it does not serve, the most preferred version that serves it).
	APIVersions []string
	Resources   []string
	Operations  []Op
	// ExcludeFieldManagers and ExcludeUsers are the selector's write exclusions (see
	// StreamSpec).
	ExcludeFieldManagers []string
	ExcludeUsers         []string
	// AllowSecrets resolves Secrets like any resource: the caller seals them (StreamSpec.Seal)
	// before anything of them leaves the watch. Without it they are refused (SecretsRefused).
	AllowSecrets bool
}

// Resource is one resource a set of selectors resolved to: the version it is watched in, and
// the union of the operations of the selectors that match it.
type Resource struct {
	GVR        schema.GroupVersionResource
	Namespaced bool
	Operations []Op
	// ExcludeFieldManagers and ExcludeUsers are what every selector matching the resource
	// excludes: a selector that does not exclude a write wants it mirrored.
	ExcludeFieldManagers []string
	ExcludeUsers         []string
}

// UnresolvedReason says why a selector entry resolved to no resource.
type UnresolvedReason string

// Why an entry resolves to nothing, strongest first: when an entry matches several resources
// that all fail, the strongest reason is reported.
const (
	// UnresolvedSecret: the entry names Secrets, which are mirrored only for a GitTarget that
	// encrypts them (Selector.AllowSecrets).
	UnresolvedSecret UnresolvedReason = "SecretsRefused"
	// UnresolvedClusterScoped: the entry matches only cluster-scoped resources and the caller
	// asked for namespaced ones (a WatchRule).
	UnresolvedClusterScoped UnresolvedReason = "ClusterScoped"
	// UnresolvedNotListable: the resource is served but without the list and watch verbs.
	UnresolvedNotListable UnresolvedReason = "NotListable"
	// UnresolvedVersionNotServed: the resource is served, but in none of the entry's
	// apiVersions.
	UnresolvedVersionNotServed UnresolvedReason = "VersionNotServed"
	// UnresolvedNotServed: no matching group serves a matching resource (yet): a CRD that is not
	// installed or not established, or an aggregated API that is down.
	UnresolvedNotServed UnresolvedReason = "NotServed"
)

// rank orders reasons: a lower rank is stronger.
func (r UnresolvedReason) rank() int {
	return slices.Index([]UnresolvedReason{UnresolvedSecret, UnresolvedClusterScoped, UnresolvedNotListable, UnresolvedVersionNotServed, UnresolvedNotServed}, r)
}

// Unresolved is one entry of one selector that resolved to no resource: the selector's index,
// the resource pattern (a name or "*") and why.
type Unresolved struct {
	Selector int
	Resource string
	Reason   UnresolvedReason
}

// Resolution is what selectors resolved to in a cluster's discovery catalog.
type Resolution struct {
	// Resources that are mirrored.
	Resources []Resource
	// Unresolved lists, per selector and resource pattern, the entries that resolved to
	// nothing, ordered by selector and then as written.
	Unresolved []Unresolved
	// ClusterScoped lists matching cluster-scoped resources left out because the caller asked
	// for namespaced ones only.
	ClusterScoped []schema.GroupVersionResource
	// Secrets lists matching Secret resources left out: their selectors do not allow them
	// (their GitTarget encrypts nothing), and their data would reach Git unencrypted.
	Secrets []schema.GroupVersionResource
}

// IsSecret reports whether gvr is the core Secret resource, whose data must never reach Git
// in plaintext: it is mirrored only sealed (encrypted) for a GitTarget's recipients.
func IsSecret(gvr schema.GroupVersionResource) bool {
	return gvr.Group == "" && gvr.Resource == "secrets"
}

// Catalog is a cluster's discovery catalog: every group, its versions (preferred first) and
// the resources each version serves. It is immutable once built.
type Catalog struct {
	groups []catalogGroup
	// fingerprint identifies the catalog's content, to tell whether a refresh changed it.
	fingerprint string
}

type catalogGroup struct {
	name     string
	versions []string // preferred first
	// resources per version, subresources left out.
	resources map[string][]metav1.APIResource
}

// discoveryWithContext is the part of discovery.DiscoveryInterfaceWithContext NewCatalog uses:
// a read that ends with its context.
type discoveryWithContext interface {
	ServerGroupsAndResourcesWithContext(ctx context.Context) ([]*metav1.APIGroup, []*metav1.APIResourceList, error)
}

// NewCatalog reads dc's groups and resources, within ctx when dc supports it. A group whose
// discovery failed (an aggregated API that is down) is left out; the others are kept.
func NewCatalog(ctx context.Context, dc discovery.DiscoveryInterface) (*Catalog, error) {
	var (
		groups []*metav1.APIGroup
		lists  []*metav1.APIResourceList
		err    error
	)
	if dcc, ok := dc.(discoveryWithContext); ok {
		groups, lists, err = dcc.ServerGroupsAndResourcesWithContext(ctx)
	} else {
		groups, lists, err = dc.ServerGroupsAndResources()
	}
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return nil, fmt.Errorf("discovering the cluster's resources: %w", err)
	}
	byGV := map[string]*metav1.APIResourceList{}
	for _, l := range lists {
		if l != nil {
			byGV[l.GroupVersion] = l
		}
	}
	c := &Catalog{}
	var fp strings.Builder
	for _, g := range groups {
		if g == nil {
			continue
		}
		cg := catalogGroup{name: g.Name, resources: map[string][]metav1.APIResource{}}
		versions := make([]string, 0, len(g.Versions))
		if g.PreferredVersion.Version != "" {
			versions = append(versions, g.PreferredVersion.Version)
		}
		for _, v := range g.Versions {
			if !slices.Contains(versions, v.Version) {
				versions = append(versions, v.Version)
			}
		}
		for _, v := range versions {
			list := byGV[schema.GroupVersion{Group: g.Name, Version: v}.String()]
			if list == nil {
				continue // its discovery failed
			}
			cg.versions = append(cg.versions, v)
			for _, r := range list.APIResources {
				if strings.Contains(r.Name, "/") {
					continue
				}
				cg.resources[v] = append(cg.resources[v], r)
				verbs := slices.Clone(r.Verbs)
				slices.Sort(verbs)
				fmt.Fprintf(&fp, "%s/%s/%s|%t|%s\n", g.Name, v, r.Name, r.Namespaced, strings.Join(verbs, ","))
			}
		}
		if len(cg.versions) > 0 {
			c.groups = append(c.groups, cg)
		}
	}
	lines := strings.Split(fp.String(), "\n")
	slices.Sort(lines)
	c.fingerprint = strings.Join(lines, "\n")
	return c, nil
}

// Serves reports whether the catalog serves gvr with list and watch.
func (c *Catalog) Serves(gvr schema.GroupVersionResource) bool {
	if c == nil {
		return false
	}
	for _, g := range c.groups {
		if g.name != gvr.Group {
			continue
		}
		for _, r := range g.resources[gvr.Version] {
			if r.Name == gvr.Resource {
				return listWatchable(r)
			}
		}
	}
	return false
}

func listWatchable(r metav1.APIResource) bool {
	return slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch")
}

// Resolve maps selectors to the resources dc serves with list and watch; see Catalog.Resolve.
func Resolve(dc discovery.DiscoveryInterface, selectors []Selector, namespacedOnly bool) (Resolution, error) {
	c, err := NewCatalog(context.Background(), dc)
	if err != nil {
		return Resolution{}, err
	}
	return c.Resolve(selectors, namespacedOnly), nil
}

// Resolve maps selectors to the resources the catalog serves with list and watch. With
// namespacedOnly, cluster-scoped matches are reported in ClusterScoped rather than resolved.
// Every selector entry (a resource name, or "*") that resolves to nothing is reported in
// Unresolved with the reason.
func (c *Catalog) Resolve(selectors []Selector, namespacedOnly bool) Resolution {
	var out Resolution
	byGVR := map[schema.GroupVersionResource]*Resource{}
	for i := range selectors {
		sel := &selectors[i]
		// outcome per resource pattern: "" resolved, else the strongest reason seen.
		outcome := map[string]UnresolvedReason{}
		note := func(pattern string, reason UnresolvedReason) {
			prev, seen := outcome[pattern]
			switch {
			case seen && prev == "":
			case reason == "" || !seen || reason.rank() < prev.rank():
				outcome[pattern] = reason
			}
		}
		for _, g := range c.groups {
			if !matches(sel.APIGroups, g.name) {
				continue
			}
			// The versions a resource may be watched in, most preferred first.
			versions := g.versions
			if len(sel.APIVersions) > 0 {
				versions = slices.DeleteFunc(slices.Clone(g.versions), func(v string) bool { return !slices.Contains(sel.APIVersions, v) })
			}
			// Each resource name once: in the first allowed version that serves it.
			picked := map[string]bool{}
			for _, v := range versions {
				for _, res := range g.resources[v] {
					if picked[res.Name] {
						continue
					}
					pattern, ok := matchPattern(sel.Resources, res.Name)
					if !ok {
						continue
					}
					picked[res.Name] = true
					gvr := schema.GroupVersionResource{Group: g.name, Version: v, Resource: res.Name}
					switch {
					case !listWatchable(res):
						note(pattern, UnresolvedNotListable)
						continue
					case IsSecret(gvr) && !sel.AllowSecrets:
						addOnce(&out.Secrets, gvr)
						note(pattern, UnresolvedSecret)
						continue
					case namespacedOnly && !res.Namespaced:
						addOnce(&out.ClusterScoped, gvr)
						note(pattern, UnresolvedClusterScoped)
						continue
					}
					note(pattern, "")
					r, ok := byGVR[gvr]
					if !ok {
						r = &Resource{GVR: gvr, Namespaced: res.Namespaced, Operations: []Op{},
							ExcludeFieldManagers: slices.Clone(sel.ExcludeFieldManagers), ExcludeUsers: slices.Clone(sel.ExcludeUsers)}
						byGVR[gvr] = r
					} else {
						r.ExcludeFieldManagers = intersect(r.ExcludeFieldManagers, sel.ExcludeFieldManagers)
						r.ExcludeUsers = intersect(r.ExcludeUsers, sel.ExcludeUsers)
					}
					r.Operations = mergeOps(r.Operations, sel.Operations)
				}
			}
			// A resource the group serves only in versions the selector does not allow.
			if len(sel.APIVersions) > 0 {
				for _, v := range g.versions {
					for _, res := range g.resources[v] {
						if pattern, ok := matchPattern(sel.Resources, res.Name); ok && !picked[res.Name] {
							note(pattern, UnresolvedVersionNotServed)
						}
					}
				}
			}
		}
		for _, pattern := range sel.Resources {
			reason, seen := outcome[pattern]
			if !seen {
				reason = UnresolvedNotServed
			}
			if reason != "" {
				out.Unresolved = append(out.Unresolved, Unresolved{Selector: i, Resource: pattern, Reason: reason})
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
	return out
}

// matchPattern returns the pattern of patterns that selects name: the name itself before "*",
// so that an entry naming a resource is credited rather than a wildcard beside it.
func matchPattern(patterns []string, name string) (string, bool) {
	if slices.Contains(patterns, name) {
		return name, true
	}
	if slices.Contains(patterns, "*") {
		return "*", true
	}
	return "", false
}

func addOnce(list *[]schema.GroupVersionResource, gvr schema.GroupVersionResource) {
	if !slices.Contains(*list, gvr) {
		*list = append(*list, gvr)
	}
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
