package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// A retarget moves a GitTarget whose spec.branch, spec.path or spec.sourceCluster changed.
// status.observedDestination says where the content is; while the spec asks for another
// destination the target is Retargeting=True and status.retargetingTo names the move's goal.
// The order:
//
//  1. tearDown: the old materialization goes first: the target is unrouted from its branch
//     worker, its rules' streams are stopped and the resume cursors of the destination it
//     leaves are dropped (so that a later move back starts with a full snapshot instead of
//     resuming from a folder nobody kept up to date in between);
//  2. routeTarget validates the new destination (provider, allowed branch, folder overlap) and
//     routes the target there; its rules, which follow the route, subscribe again, and the
//     streams hand the whole state over as a snapshot and sweep the new folder;
//  3. retargetProgress sets observedDestination once that snapshot is pushed (snapshotPushed).
//
// A spec change during a move starts it over from step 1 (retargetingTo follows). The old
// folder is never deleted: the Retargeting=False condition and a Retargeted event name it.

// tearDown stops what t has materialized so that it can move to its spec's destination.
func (c *Controller) tearDown(ctx context.Context, name types.NamespacedName, t *v1alpha1.GitTarget) error {
	c.opts.Router.Unroute(name, false)
	desired := t.Spec.Destination()
	for _, owner := range c.ownersOf(name) {
		c.removeOwner(owner)
	}
	for _, d := range []*v1alpha1.Destination{t.Status.ObservedDestination, t.Status.RetargetingTo} {
		if d == nil || *d == desired {
			continue
		}
		if err := c.dropCursors(ctx, name, *d); err != nil {
			return err
		}
	}
	c.log.Info("retargeting: the old destination is torn down", "target", name.String(),
		"from", describeDestination(t.Status.ObservedDestination), "to", describeDestination(&desired))
	return nil
}

// dropCursors removes the resume cursors of name's streams at d.
func (c *Controller) dropCursors(ctx context.Context, name types.NamespacedName, d v1alpha1.Destination) error {
	if c.opts.Cursors == nil {
		return nil
	}
	n, err := c.opts.Cursors.DropDestination(ctx, c.clusterOf(d), name, streamOf(d))
	if err != nil {
		return fmt.Errorf("retargeting GitTarget %s: removing the resume cursors of %s: %w", name, describeDestination(&d), err)
	}
	c.log.Debug("dropped the resume cursors of a destination left", "target", name.String(), "destination", describeDestination(&d), "cursors", n)
	return nil
}

// retargetProgress says how a move stands: the Ready condition (Unknown while the snapshot is
// on its way, or the reason the new destination cannot be written) and the Retargeting
// condition; once the snapshot is pushed it settles the move.
func (c *Controller) retargetProgress(ctx context.Context, name types.NamespacedName, t *v1alpha1.GitTarget, ready bool, reason, msg string) (metav1.ConditionStatus, string, string) {
	desired := t.Spec.Destination()
	old := t.Status.ObservedDestination
	from := describeDestination(old)
	to := describeDestination(&desired)
	if !ready {
		setRetargeting(t, metav1.ConditionTrue, v1alpha1.ReasonSnapshotPending,
			fmt.Sprintf("moving from %s to %s: the new destination cannot be written yet (%s: %s)", from, to, reason, msg))
		return metav1.ConditionFalse, reason, msg
	}
	if waiting := c.snapshotPending(name, desired); waiting != "" {
		setRetargeting(t, metav1.ConditionTrue, v1alpha1.ReasonSnapshotPending,
			fmt.Sprintf("moving from %s to %s: the old destination is torn down; waiting for %s", from, to, waiting))
		return metav1.ConditionUnknown, v1alpha1.ReasonProgressing, fmt.Sprintf("retargeting to %s: waiting for %s", to, waiting)
	}
	// The cursors were dropped when the move started; a push that was under way then may have
	// written some again.
	if old != nil && *old != desired {
		if err := c.dropCursors(ctx, name, *old); err != nil {
			c.log.Warn("retargeted, but the old destination's resume cursors could not be removed", "target", name.String(), "err", err)
		}
	}
	done := fmt.Sprintf("moved from %s to %s; the snapshot into %s is pushed. Nothing is written to %s any more, and its files were left in place: remove them with a commit of your own once nothing reads them", from, to, to, from)
	if old == nil || *old == desired {
		done = fmt.Sprintf("moved back to %s; its snapshot is pushed", to)
	}
	t.Status.ObservedDestination, t.Status.RetargetingTo = &desired, nil
	setRetargeting(t, metav1.ConditionFalse, v1alpha1.ReasonRetargeted, done)
	c.events.Event(t, corev1.EventTypeNormal, v1alpha1.ReasonRetargeted, done)
	c.log.Info("retargeted", "target", name.String(), "from", from, "to", to)
	return metav1.ConditionTrue, reason, msg
}

func setRetargeting(t *v1alpha1.GitTarget, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&t.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionRetargeting, Status: status, ObservedGeneration: t.Generation, Reason: reason, Message: msg,
	})
}

// snapshotPending says what the snapshot of name into d still waits for; "" once it is pushed:
// the target is routed to d, every rule of the target subscribed to d after that and its
// streams handed over their whole initial state, none of it is left in the attribution join,
// and the router holds none of it unpushed.
func (c *Controller) snapshotPending(name types.NamespacedName, d v1alpha1.Destination) string {
	stream := streamOf(d)
	if route, ok := c.opts.Router.RouteOf(name); !ok || route.Stream != stream || route.Cluster != c.clusterOf(d) {
		return "the route to the new destination"
	}
	source := c.opts.Sources.Cluster(c.clusterOf(d))
	if source == nil {
		return fmt.Sprintf("source cluster %q", c.clusterOf(d))
	}
	for _, owner := range c.ownersOf(name) {
		if following, _ := source.Following(owner); following != stream {
			return fmt.Sprintf("rule %s to subscribe to the new destination", owner)
		}
		if synced, _ := source.Status(owner); !synced {
			return fmt.Sprintf("the streams of rule %s to list their objects", owner)
		}
	}
	if c.opts.InFlight != nil {
		if n := c.opts.InFlight(name); n > 0 {
			return fmt.Sprintf("%d changes to be attributed", n)
		}
	}
	if n := c.opts.Router.TargetStatus(name).Unpushed; n > 0 {
		return fmt.Sprintf("%d changes to be pushed", n)
	}
	return ""
}

// ownersOf lists the watch-side owner keys of the WatchRules and ClusterWatchRules whose
// targetRef names target.
func (c *Controller) ownersOf(target types.NamespacedName) []string {
	var owners []string
	c.list(kindRule, target.Namespace, func(u *unstructured.Unstructured) {
		if ref, _, _ := unstructured.NestedString(u.Object, "spec", "targetRef", "name"); ref == target.Name {
			owners = append(owners, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}.String())
		}
	})
	for _, name := range c.clusterRulesFor(target) {
		owners = append(owners, clusterRuleOwner(name))
	}
	return owners
}

// clusterOf is the source-registry entry a destination reads from: its sourceCluster (the
// audit route of a remote cluster), or the cluster kubescribe runs in.
func (c *Controller) clusterOf(d v1alpha1.Destination) string {
	if d.SourceCluster != "" {
		return d.SourceCluster
	}
	return c.opts.Cluster
}

// describeDestination names a destination in messages.
func describeDestination(d *v1alpha1.Destination) string {
	if d == nil {
		return "nowhere"
	}
	where := "the repository root"
	if p := cleanPath(d.Path); p != "" {
		where = fmt.Sprintf("folder %q", p)
	}
	s := fmt.Sprintf("%s of branch %q", where, d.Branch)
	if d.SourceCluster != "" {
		s += fmt.Sprintf(" (source cluster %q)", d.SourceCluster)
	}
	return s
}
