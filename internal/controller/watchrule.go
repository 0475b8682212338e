package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// syncRule resolves a WatchRule's rules to resources and runs their streams.
func (c *Controller) syncRule(ctx context.Context, name types.NamespacedName) error {
	owner := name.String()
	var r v1alpha1.WatchRule
	exists, err := c.get(kindRule, name, &r)
	if err != nil {
		return err
	}
	if !exists {
		c.watches.Remove(owner)
		return nil
	}
	before := r.Status.DeepCopy()
	ready, reason, msg, recheck := c.evaluateRule(&r)
	status := conditionStatus(ready)
	if reason == v1alpha1.ReasonProgressing {
		status = metav1.ConditionUnknown // the initial list has not finished: not known yet
	}
	setCondition(&r.Status.Conditions, r.Generation, status, reason, "%s", msg)
	r.Status.ObservedGeneration = r.Generation
	if err := c.writeStatus(ctx, v1alpha1.WatchRulesResource, &r, before, &r.Status); err != nil {
		return err
	}
	if recheck > 0 {
		c.queue.AddAfter(key{kindRule, name}, recheck)
	}
	return nil
}

// evaluateRule starts or stops the rule's streams and says how it stands. r.Status.Resources
// is filled in.
func (c *Controller) evaluateRule(r *v1alpha1.WatchRule) (ready bool, reason, msg string, recheck time.Duration) {
	owner := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}.String()
	// stop ends the rule's streams: it mirrors nothing while it is not Ready for this reason.
	stop := func(reason, msg string, recheck time.Duration) (bool, string, string, time.Duration) {
		c.watches.Remove(owner)
		r.Status.Resources = nil
		return false, reason, msg, recheck
	}
	for i := range r.Spec.Rules {
		if r.Spec.Rules[i].HasExclusions() {
			return stop(v1alpha1.ReasonInvalidSpec,
				fmt.Sprintf("rules[%d]: excludeFieldManagers and excludeUsers are not supported by this version of kubescribe; remove them", i), 0)
		}
	}
	targetName := types.NamespacedName{Namespace: r.Namespace, Name: r.Spec.TargetRef.Name}
	var t v1alpha1.GitTarget
	if exists, err := c.get(kindTarget, targetName, &t); err != nil || !exists {
		return stop(v1alpha1.ReasonTargetNotFound, fmt.Sprintf("GitTarget %q not found in namespace %q", targetName.Name, targetName.Namespace), 0)
	}
	if !c.opts.Router.Routed(targetName) {
		return stop(v1alpha1.ReasonTargetNotReady, fmt.Sprintf("GitTarget %q is not Ready", targetName.Name), 0)
	}

	resolved, ignored, err := resolveRules(c.opts.SourceDiscovery, r.Spec.Rules)
	if err != nil {
		return false, v1alpha1.ReasonWatchFailed, err.Error(), notReadyRecheck
	}
	if len(resolved) == 0 {
		// The resource may be a CRD installed since discovery was cached: look afresh next time.
		if cd, ok := c.opts.SourceDiscovery.(discovery.CachedDiscoveryInterface); ok {
			cd.Invalidate()
		}
		return stop(v1alpha1.ReasonNoResourcesMatched,
			"no namespaced resource the cluster serves matches the rules"+ignored.describe(), notReadyRecheck)
	}
	specs := make([]watch.StreamSpec, 0, len(resolved))
	r.Status.Resources = r.Status.Resources[:0]
	for _, res := range resolved {
		specs = append(specs, watch.StreamSpec{
			Cluster:    c.opts.Cluster,
			Target:     targetName,
			GVR:        res.gvr,
			Namespace:  r.Namespace,
			Operations: res.ops,
		})
		r.Status.Resources = append(r.Status.Resources, v1alpha1.FormatResource(res.gvr))
	}
	c.watches.Set(owner, specs)

	synced, werr := c.watches.Status(owner)
	switch {
	case werr != nil:
		return false, v1alpha1.ReasonWatchFailed, fmt.Sprintf("watching %s: %v", strings.Join(r.Status.Resources, ", "), werr), notReadyRecheck
	case !synced:
		return false, v1alpha1.ReasonProgressing, fmt.Sprintf("listing %s", strings.Join(r.Status.Resources, ", ")), progressRecheck
	}
	msg = fmt.Sprintf("watching %s in namespace %q", strings.Join(r.Status.Resources, ", "), r.Namespace) + ignored.describe()
	return true, v1alpha1.ReasonReady, msg, targetRecheck
}

type resolvedResource struct {
	gvr schema.GroupVersionResource
	ops []watch.Op
}

// ignoredResources are resources rules select that are not mirrored.
type ignoredResources struct {
	// clusterScoped resources are not mirrored by a WatchRule.
	clusterScoped []string
	// secrets are never mirrored: their data would reach Git unencrypted.
	secrets []string
}

// describe is the note a WatchRule's Ready message carries about ignored resources.
func (i ignoredResources) describe() string {
	var msg string
	if len(i.clusterScoped) > 0 {
		msg += "; cluster-scoped resources are not mirrored by a WatchRule: " + strings.Join(i.clusterScoped, ", ")
	}
	if len(i.secrets) > 0 {
		msg += "; Secrets are never mirrored, their data would reach Git unencrypted: " + strings.Join(i.secrets, ", ")
	}
	return msg
}

// isSecret reports whether gvr is the core Secret resource, whose data must never reach Git in
// plaintext. Until kubescribe can encrypt it, Secrets are not mirrored at all.
func isSecret(gvr schema.GroupVersionResource) bool {
	return gvr.Group == "" && gvr.Resource == "secrets"
}

// resolveRules maps rules to the namespaced resources the cluster serves (its preferred
// version of each), with the union of operations of the rules that select it. Cluster-scoped
// and Secret matches are returned in ignored.
func resolveRules(dc discovery.DiscoveryInterface, rules []v1alpha1.ResourceRule) (resolved []resolvedResource, ignored ignoredResources, err error) {
	lists, err := dc.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return nil, ignored, fmt.Errorf("discovering the cluster's resources: %w", err)
	}
	// A group whose discovery failed (an aggregated API that is down) is skipped; the others
	// are still watched.
	byGVR := map[schema.GroupVersionResource]*resolvedResource{}
	var order []schema.GroupVersionResource
	for _, list := range lists {
		gv, perr := schema.ParseGroupVersion(list.GroupVersion)
		if perr != nil {
			continue
		}
		for _, res := range list.APIResources {
			if strings.Contains(res.Name, "/") || !slices.Contains(res.Verbs, "list") || !slices.Contains(res.Verbs, "watch") {
				continue
			}
			for i := range rules {
				rule := &rules[i]
				if !matches(rule.APIGroups, gv.Group) || !matches(rule.Resources, res.Name) {
					continue
				}
				gvr := gv.WithResource(res.Name)
				if list := ignoredList(&ignored, gvr, res.Namespaced); list != nil {
					if s := v1alpha1.FormatResource(gvr); !slices.Contains(*list, s) {
						*list = append(*list, s)
					}
					continue
				}
				rr, ok := byGVR[gvr]
				if !ok {
					rr = &resolvedResource{gvr: gvr, ops: []watch.Op{}}
					byGVR[gvr] = rr
					order = append(order, gvr)
				}
				rr.ops = mergeOps(rr.ops, rule.GetOperations())
			}
		}
	}
	for _, gvr := range order {
		resolved = append(resolved, *byGVR[gvr])
	}
	// Discovery's order is not stable; a sorted list keeps the status from being rewritten.
	slices.SortFunc(resolved, func(a, b resolvedResource) int {
		return strings.Compare(v1alpha1.FormatResource(a.gvr), v1alpha1.FormatResource(b.gvr))
	})
	slices.Sort(ignored.clusterScoped)
	slices.Sort(ignored.secrets)
	return resolved, ignored, nil
}

// ignoredList is the list of ignored a resource belongs to, or nil when it is mirrored.
func ignoredList(ignored *ignoredResources, gvr schema.GroupVersionResource, namespaced bool) *[]string {
	switch {
	case isSecret(gvr):
		return &ignored.secrets
	case !namespaced:
		return &ignored.clusterScoped
	}
	return nil
}

func matches(patterns []string, s string) bool {
	return slices.Contains(patterns, "*") || slices.Contains(patterns, s)
}

// mergeOps adds the API operations to a set of watch operations.
func mergeOps(ops []watch.Op, add []v1alpha1.Operation) []watch.Op {
	for _, o := range add {
		var op watch.Op
		switch o {
		case v1alpha1.OperationCreate:
			op = watch.OpCreate
		case v1alpha1.OperationUpdate:
			op = watch.OpUpdate
		case v1alpha1.OperationDelete:
			op = watch.OpDelete
		default:
			continue
		}
		if !slices.Contains(ops, op) {
			ops = append(ops, op)
		}
	}
	slices.Sort(ops)
	return ops
}
