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
		if source := c.opts.Sources.Cluster(c.opts.Cluster); source != nil {
			source.Remove(owner)
		}
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
	source := c.opts.Sources.Cluster(c.opts.Cluster)
	// stop ends the rule's streams: it mirrors nothing while it is not Ready for this reason.
	stop := func(reason, msg string, recheck time.Duration) (bool, string, string, time.Duration) {
		if source != nil {
			source.Remove(owner)
		}
		r.Status.Resources = nil
		return false, reason, msg, recheck
	}
	if source == nil {
		return stop(v1alpha1.ReasonWatchFailed, fmt.Sprintf("source cluster %q is not registered", c.opts.Cluster), notReadyRecheck)
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

	res, err := source.Resolve(selectors(r.Spec.Rules), true)
	if err != nil {
		return false, v1alpha1.ReasonWatchFailed, err.Error(), notReadyRecheck
	}
	if len(res.Resources) == 0 {
		return stop(v1alpha1.ReasonNoResourcesMatched,
			"no namespaced resource the cluster serves matches the rules"+describeIgnored(res), notReadyRecheck)
	}
	specs := make([]watch.StreamSpec, 0, len(res.Resources))
	r.Status.Resources = r.Status.Resources[:0]
	for _, rr := range res.Resources {
		specs = append(specs, watch.StreamSpec{
			Target:     targetName,
			GVR:        rr.GVR,
			Namespace:  r.Namespace,
			Operations: rr.Operations,
		})
		r.Status.Resources = append(r.Status.Resources, v1alpha1.FormatResource(rr.GVR))
	}
	slices.Sort(r.Status.Resources)
	source.Set(owner, specs)

	synced, werr := source.Status(owner)
	switch {
	case werr != nil:
		return false, v1alpha1.ReasonWatchFailed, fmt.Sprintf("watching %s: %v", strings.Join(r.Status.Resources, ", "), werr), notReadyRecheck
	case !synced:
		return false, v1alpha1.ReasonProgressing, fmt.Sprintf("listing %s", strings.Join(r.Status.Resources, ", ")), progressRecheck
	}
	msg = fmt.Sprintf("watching %s in namespace %q", strings.Join(r.Status.Resources, ", "), r.Namespace) + describeIgnored(res)
	return true, v1alpha1.ReasonReady, msg, targetRecheck
}

// describeIgnored is the note a WatchRule's Ready message carries about resources its rules
// select that are not mirrored.
func describeIgnored(res watch.Resolution) string {
	var msg string
	if len(res.ClusterScoped) > 0 {
		msg += "; cluster-scoped resources are not mirrored by a WatchRule: " + formatResources(res.ClusterScoped)
	}
	if len(res.Secrets) > 0 {
		msg += "; Secrets are never mirrored, their data would reach Git unencrypted: " + formatResources(res.Secrets)
	}
	return msg
}

func formatResources(gvrs []schema.GroupVersionResource) string {
	out := make([]string, len(gvrs))
	for i, gvr := range gvrs {
		out[i] = v1alpha1.FormatResource(gvr)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// selectors turns a WatchRule's rules into watch selectors.
func selectors(rules []v1alpha1.ResourceRule) []watch.Selector {
	out := make([]watch.Selector, len(rules))
	for i := range rules {
		out[i] = watch.Selector{APIGroups: rules[i].APIGroups, Resources: rules[i].Resources, Operations: watchOps(rules[i].GetOperations())}
	}
	return out
}

// watchOps maps API operations to watch operations.
func watchOps(ops []v1alpha1.Operation) []watch.Op {
	out := make([]watch.Op, 0, len(ops))
	for _, o := range ops {
		switch o {
		case v1alpha1.OperationCreate:
			out = append(out, watch.OpCreate)
		case v1alpha1.OperationUpdate:
			out = append(out, watch.OpUpdate)
		case v1alpha1.OperationDelete:
			out = append(out, watch.OpDelete)
		}
	}
	return out
}
