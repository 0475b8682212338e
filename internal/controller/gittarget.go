package controller

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/git"
)

// syncTarget routes a GitTarget's changes to the worker of its provider's branch.
func (c *Controller) syncTarget(ctx context.Context, name types.NamespacedName) error {
	var t v1alpha1.GitTarget
	exists, err := c.get(kindTarget, name, &t)
	if err != nil {
		return err
	}
	defer c.enqueueReferencing(kindRule, name.Namespace, "targetRef", name.Name)
	defer c.enqueueClusterRulesFor(name)
	if !exists {
		// A re-created target starts without its predecessor's history.
		c.opts.Router.Unroute(name, true)
		return nil
	}
	before := t.Status.DeepCopy()
	ready, reason, msg := c.routeTarget(name, &t)
	st := c.opts.Router.TargetStatus(name)
	if ready {
		t.Status.ObservedDestination = &v1alpha1.Destination{Branch: t.Spec.Branch, Path: t.Spec.Path}
		if st.LastError != nil {
			ready, reason = false, v1alpha1.ReasonPushFailed
			msg = fmt.Sprintf("pushing to %s branch %q failed (%d changes pending, retrying): %v", st.URL, st.Branch, st.Pending, st.LastError)
		} else if !c.isProviderReady(types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.ProviderRef.Name}) {
			ready, reason = false, v1alpha1.ReasonProviderNotReady
			msg = fmt.Sprintf("GitProvider %q is not Ready; changes are still written with its last settings that worked", t.Spec.ProviderRef.Name)
		}
	}
	if st.LastCommit != "" {
		t.Status.LastCommit = st.LastCommit
		pt := metav1.NewTime(st.LastPush.Truncate(time.Second))
		t.Status.LastPushTime = &pt
	}
	setReady(&t.Status.Conditions, t.Generation, ready, reason, "%s", msg)
	t.Status.ObservedGeneration = t.Generation
	if err := c.writeStatus(ctx, v1alpha1.GitTargetsResource, &t, before, &t.Status); err != nil {
		return err
	}
	recheck := targetRecheck
	if !ready {
		recheck = notReadyRecheck
	}
	c.queue.AddAfter(key{kindTarget, name}, recheck)
	return nil
}

// routeTarget routes the target to its branch when it can be written to, or unroutes it and
// says why.
func (c *Controller) routeTarget(name types.NamespacedName, t *v1alpha1.GitTarget) (ready bool, reason, msg string) {
	unroute := func(reason, msg string) (bool, string, string) {
		c.opts.Router.Unroute(name, false)
		return false, reason, msg
	}
	if t.Spec.SourceCluster != nil {
		return unroute(v1alpha1.ReasonSourceClusterUnsupported,
			"spec.sourceCluster is not supported by this version of kubescribe: remove it to mirror the cluster kubescribe runs in")
	}
	providerName := types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.ProviderRef.Name}
	var p v1alpha1.GitProvider
	if exists, err := c.get(kindProvider, providerName, &p); err != nil || !exists {
		return unroute(v1alpha1.ReasonProviderNotFound, fmt.Sprintf("GitProvider %q not found in namespace %q", providerName.Name, providerName.Namespace))
	}
	remote, ok := c.providerRemote(providerName)
	if !ok {
		return unroute(v1alpha1.ReasonProviderNotReady, fmt.Sprintf("GitProvider %q is not Ready", providerName.Name))
	}
	if err := c.opts.Router.Route(name, git.Destination{Remote: remote, Branch: t.Spec.Branch, Path: t.Spec.Path}); err != nil {
		return false, v1alpha1.ReasonInvalidSpec, err.Error()
	}
	where := "the repository root"
	if t.Spec.Path != "" {
		where = fmt.Sprintf("folder %q", t.Spec.Path)
	}
	return true, v1alpha1.ReasonReady, fmt.Sprintf("writing to %s branch %q, %s", remote.URL, t.Spec.Branch, where)
}

func (c *Controller) isProviderReady(name types.NamespacedName) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.providerReady[name]
}
