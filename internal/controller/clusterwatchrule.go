package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// namespacesResource is what a ClusterWatchRule's namespaceSelector is evaluated against.
var namespacesResource = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// clusterRuleOwner is a ClusterWatchRule's owner key on the watch side. A WatchRule's is
// "<namespace>/<name>", which never starts with an upper-case letter.
func clusterRuleOwner(name string) string { return "ClusterWatchRule/" + name }

// syncClusterRule resolves a ClusterWatchRule's rules to resources, cluster-wide or in its
// namespaces, and runs their streams.
func (c *Controller) syncClusterRule(ctx context.Context, name types.NamespacedName) error {
	owner := clusterRuleOwner(name.Name)
	var r v1alpha1.ClusterWatchRule
	exists, err := c.get(kindClusterRule, name, &r)
	if err != nil {
		return err
	}
	if !exists {
		c.removeOwner(owner)
		c.want(owner, nil)
		return nil
	}
	before := r.Status.DeepCopy()
	req := ruleRequest{
		owner:  owner,
		target: types.NamespacedName{Namespace: r.Spec.TargetRef.Namespace, Name: r.Spec.TargetRef.Name},
		rules:  r.Spec.Rules,
		scope:  "in every namespace",
	}
	switch {
	case r.Spec.NamespaceSelector != nil && len(r.Spec.Namespaces) > 0:
		req.invalid = "set at most one of namespaces and namespaceSelector"
	case r.Spec.NamespaceSelector != nil:
		sel, err := metav1.LabelSelectorAsSelector(r.Spec.NamespaceSelector)
		if err != nil {
			req.invalid = fmt.Sprintf("namespaceSelector: %v", err)
			break
		}
		if route, remote := c.remoteTarget(req.target); remote {
			// The Namespace informer watches the cluster kubescribe runs in: ask the remote.
			if req.namespaces, err = c.remoteNamespaces(route, sel); err != nil {
				req.failed = err.Error()
				break
			}
		} else {
			req.namespaces = c.selectNamespaces(sel)
		}
		req.scope = fmt.Sprintf("in the namespaces matching %q: [%s]", sel.String(), strings.Join(req.namespaces, ", "))
	case len(r.Spec.Namespaces) > 0:
		req.namespaces = slices.Sorted(slices.Values(r.Spec.Namespaces))
		req.namespaces = slices.Compact(req.namespaces)
		req.scope = fmt.Sprintf("in the namespaces [%s]", strings.Join(req.namespaces, ", "))
	}
	if !c.ownsTargetNamed(req.target) {
		c.removeOwner(owner) // the owner of its GitTarget's branch watches for it
		c.want(owner, c.resolveOnly(req))
		return nil
	}
	out := c.evaluate(req)
	out.apply(&r.Status.Conditions, r.Generation)
	r.Status.Resources = out.resources
	r.Status.Namespaces = nil
	if req.namespaces != nil && out.resources != nil {
		r.Status.Namespaces = req.namespaces
	}
	r.Status.ObservedGeneration = r.Generation
	if err := c.writeStatus(ctx, v1alpha1.ClusterWatchRulesResource, &r, before, &r.Status); err != nil {
		return err
	}
	if out.recheck > 0 {
		c.queue.AddAfter(key{kindClusterRule, name}, out.recheck)
	}
	return nil
}

// selectNamespaces lists the namespaces whose labels sel matches, sorted; never nil, so that a
// selector matching no namespace watches none rather than all.
func (c *Controller) selectNamespaces(sel labels.Selector) []string {
	return namespacesIn(c.informers[kindNamespace].GetStore(), sel)
}

// namespacesIn lists the names of the Namespaces in store whose labels sel matches, sorted;
// never nil.
func namespacesIn(store cache.Store, sel labels.Selector) []string {
	out := []string{}
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if ok && sel.Matches(labels.Set(u.GetLabels())) {
			out = append(out, u.GetName())
		}
	}
	slices.Sort(out)
	return out
}

// enqueueAll enqueues every object of kind k.
func (c *Controller) enqueueAll(k kind) {
	for _, key := range c.informers[k].GetStore().ListKeys() {
		ns, name, _ := strings.Cut(key, "/")
		if name == "" {
			ns, name = "", ns // a cluster-scoped key has no namespace part
		}
		c.enqueue(k, types.NamespacedName{Namespace: ns, Name: name})
	}
}

// enqueueClusterRulesFor enqueues the ClusterWatchRules whose targetRef names target.
func (c *Controller) enqueueClusterRulesFor(target types.NamespacedName) {
	for _, name := range c.clusterRulesFor(target) {
		c.enqueue(kindClusterRule, types.NamespacedName{Name: name})
	}
}

// clusterRulesFor returns the names of the ClusterWatchRules whose targetRef names target.
func (c *Controller) clusterRulesFor(target types.NamespacedName) []string {
	var out []string
	for _, obj := range c.informers[kindClusterRule].GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		ns, _, _ := unstructured.NestedString(u.Object, "spec", "targetRef", "namespace")
		name, _, _ := unstructured.NestedString(u.Object, "spec", "targetRef", "name")
		if ns == target.Namespace && name == target.Name {
			out = append(out, u.GetName())
		}
	}
	return out
}

// enqueueSelectingClusterRules enqueues the ClusterWatchRules that select namespaces by label:
// a namespace came, went or was relabelled.
func (c *Controller) enqueueSelectingClusterRules() {
	for _, obj := range c.informers[kindClusterRule].GetStore().List() {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			if _, found, _ := unstructured.NestedMap(u.Object, "spec", "namespaceSelector"); found {
				c.enqueue(kindClusterRule, types.NamespacedName{Name: u.GetName()})
			}
		}
	}
}
