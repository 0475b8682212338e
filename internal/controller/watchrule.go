package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
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
		c.removeOwner(owner)
		c.want(owner, nil)
		return nil
	}
	req := ruleRequest{
		owner:          owner,
		target:         types.NamespacedName{Namespace: r.Namespace, Name: r.Spec.TargetRef.Name},
		rules:          r.Spec.Rules,
		namespacedOnly: true,
		namespaces:     []string{r.Namespace},
		scope:          fmt.Sprintf("in namespace %q", r.Namespace),
	}
	if !c.ownsTargetNamed(req.target) {
		c.removeOwner(owner) // the owner of its GitTarget's branch watches for it
		c.want(owner, c.resolveOnly(req))
		return nil
	}
	before := r.Status.DeepCopy()
	out := c.evaluate(req)
	out.apply(&r.Status.Conditions, r.Generation)
	r.Status.Resources = out.resources
	r.Status.ObservedGeneration = r.Generation
	if err := c.writeStatus(ctx, v1alpha1.WatchRulesResource, &r, before, &r.Status); err != nil {
		return err
	}
	if out.recheck > 0 {
		c.queue.AddAfter(key{kindRule, name}, out.recheck)
	}
	return nil
}

// removeOwner removes owner's streams from every source cluster but keep (when set).
func (c *Controller) removeOwner(owner string, keep ...string) {
	for _, name := range c.opts.Sources.Names() {
		if slices.Contains(keep, name) {
			continue
		}
		if source := c.opts.Sources.Cluster(name); source != nil {
			source.Remove(owner)
		}
	}
}

// ruleRequest is what a WatchRule or ClusterWatchRule asks of the watch side.
type ruleRequest struct {
	owner  string
	target types.NamespacedName
	rules  []v1alpha1.ResourceRule
	// namespacedOnly leaves cluster-scoped resources out (a WatchRule).
	namespacedOnly bool
	// namespaces namespaced resources are watched in; nil: every namespace.
	namespaces []string
	// scope describes where namespaced resources are watched, for messages.
	scope string
	// invalid, when set, is why the request cannot be served (an InvalidSpec message).
	invalid string
	// failed, when set, is why the request cannot be served now (a WatchFailed message).
	failed string
}

// ruleOutcome is how a rule stands: its Ready condition, its ResourcesResolved condition (nil
// when the rules were not resolved) and the resources it resolved to.
type ruleOutcome struct {
	ready     metav1.ConditionStatus
	reason    string
	msg       string
	resolved  *metav1.Condition
	resources []string
	recheck   time.Duration
}

// apply writes the outcome's conditions.
func (o ruleOutcome) apply(conds *[]metav1.Condition, generation int64) {
	setCondition(conds, generation, o.ready, o.reason, "%s", o.msg)
	if o.resolved == nil {
		meta.RemoveStatusCondition(conds, v1alpha1.ConditionResourcesResolved)
		return
	}
	cond := *o.resolved
	cond.ObservedGeneration = generation
	meta.SetStatusCondition(conds, cond)
}

// evaluate starts or stops the streams req asks for and says how the rule stands.
func (c *Controller) evaluate(req ruleRequest) ruleOutcome {
	// The streams follow the target's route, not its spec: during a retarget the rule
	// subscribes to the new destination only once the target was routed there. They run in
	// the cluster that route mirrors, and nowhere else.
	route, routed := c.opts.Router.RouteOf(req.target)
	var t v1alpha1.GitTarget
	exists, err := c.get(kindTarget, req.target, &t)
	targetFound := err == nil && exists
	cluster := c.opts.Cluster
	switch {
	case routed && route.Cluster != "":
		cluster = route.Cluster
	case targetFound:
		cluster = c.clusterOf(t.Spec.Destination())
	}
	c.removeOwner(req.owner, cluster)
	source := c.opts.Sources.Cluster(cluster)
	if source != nil {
		// Every path below declares the route's destination to source (Set), streams or none.
		// A retarget waits for every rule of its target to follow the new destination
		// (snapshotPending): it is told when one did.
		before, known := source.Following(req.owner)
		defer func() {
			if !known || before != route.Stream {
				c.enqueue(kindTarget, req.target)
			}
		}()
	}
	// where names a remote cluster in messages; the local one goes unnamed.
	where := ""
	if cluster != c.opts.Cluster {
		where = fmt.Sprintf(" in cluster %q", cluster)
	}
	// stop ends the rule's streams: it mirrors nothing while it is not Ready for this reason.
	stop := func(reason, msg string, recheck time.Duration) ruleOutcome {
		if source != nil {
			source.Set(req.owner, route.Stream, nil)
		}
		c.want(req.owner, nil)
		return ruleOutcome{ready: metav1.ConditionFalse, reason: reason, msg: msg, recheck: recheck}
	}
	if req.invalid != "" {
		return stop(v1alpha1.ReasonInvalidSpec, req.invalid, 0)
	}
	if !targetFound {
		return stop(v1alpha1.ReasonTargetNotFound, fmt.Sprintf("GitTarget %q not found in namespace %q", req.target.Name, req.target.Namespace), 0)
	}
	if !routed {
		return stop(v1alpha1.ReasonTargetNotReady, fmt.Sprintf("GitTarget %q is not Ready", req.target.Name), 0)
	}
	if req.failed != "" {
		return stop(v1alpha1.ReasonWatchFailed, req.failed, notReadyRecheck)
	}
	if source == nil {
		return stop(v1alpha1.ReasonWatchFailed, fmt.Sprintf("source cluster %q is not registered", cluster), notReadyRecheck)
	}

	// Secrets are resolved only for a target that seals them (spec.encryption): their streams
	// encrypt each one before it leaves the watch.
	seal := targetSealer(&t)
	res, err := source.Resolve(selectors(req.rules, seal != nil), req.namespacedOnly)
	if err != nil {
		if where != "" {
			// A remote server's words are not quoted (remoteError); its discovery error is
			// logged by the registry.
			return stop(v1alpha1.ReasonWatchFailed, fmt.Sprintf("reading API discovery%s: %s", where, remoteError(err)), notReadyRecheck)
		}
		return stop(v1alpha1.ReasonWatchFailed, err.Error(), notReadyRecheck)
	}
	unresolved := describeUnresolved(req.rules, res.Unresolved)
	if len(res.Resources) == 0 {
		what := "resource"
		if req.namespacedOnly {
			what = "namespaced resource"
		}
		msg := "no " + what + " the cluster serves matches the rules"
		if where != "" {
			msg = fmt.Sprintf("no %s cluster %q serves matches the rules", what, cluster)
		}
		if unresolved != "" {
			msg += ": " + unresolved
		}
		msg += describeIgnored(res)
		out := stop(v1alpha1.ReasonNoResourcesMatched, msg, notReadyRecheck)
		out.resolved = &metav1.Condition{Type: v1alpha1.ConditionResourcesResolved, Status: metav1.ConditionFalse,
			Reason: v1alpha1.ReasonNoResourcesMatched, Message: msg}
		return out
	}

	specs, resources := streamSpecs(req, res, seal)
	source.Set(req.owner, route.Stream, specs)
	if cluster == c.opts.Cluster {
		c.want(req.owner, specs)
	} else {
		c.want(req.owner, nil)
	}

	out := ruleOutcome{resources: resources}
	list := strings.Join(resources, ", ")
	if unresolved == "" {
		out.resolved = &metav1.Condition{Type: v1alpha1.ConditionResourcesResolved, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonResolved, Message: "resolved" + where + " to " + list + describeIgnored(res)}
	} else {
		out.resolved = &metav1.Condition{Type: v1alpha1.ConditionResourcesResolved, Status: metav1.ConditionFalse,
			Reason: v1alpha1.ReasonPartiallyResolved, Message: fmt.Sprintf("resolved%s to %s; unresolved: %s", where, list, unresolved)}
	}
	synced, werr := source.Status(req.owner)
	switch {
	case werr != nil:
		detail := werr.Error()
		if where != "" {
			detail = remoteError(werr) + where // client-go logs the watch error itself
		}
		out.ready, out.reason, out.msg, out.recheck = metav1.ConditionFalse, v1alpha1.ReasonWatchFailed, fmt.Sprintf("watching %s: %s", list, detail), notReadyRecheck
	case !synced:
		// The initial list has not finished: not known yet.
		out.ready, out.reason, out.msg, out.recheck = metav1.ConditionUnknown, v1alpha1.ReasonProgressing, fmt.Sprintf("listing %s", list), progressFallback
	case unresolved != "":
		out.ready, out.reason, out.recheck = metav1.ConditionFalse, v1alpha1.ReasonPartiallyResolved, notReadyRecheck
		out.msg = fmt.Sprintf("watching %s %s%s, but some entries resolve to nothing: %s", list, req.scope, where, unresolved)
	default:
		out.ready, out.reason, out.recheck = metav1.ConditionTrue, v1alpha1.ReasonReady, targetRecheck
		out.msg = fmt.Sprintf("watching %s %s%s", list, req.scope, where) + describeIgnored(res)
	}
	return out
}

// streamSpecs are the streams req's resolution res asks for, and the resources they watch,
// formatted and sorted.
func streamSpecs(req ruleRequest, res watch.Resolution, seal watch.Sealer) ([]watch.StreamSpec, []string) {
	namespaces := req.namespaces
	if namespaces == nil {
		namespaces = []string{""}
	}
	specs := make([]watch.StreamSpec, 0, len(res.Resources))
	var resources []string
	for _, rr := range res.Resources {
		scopes := []string{""}
		if rr.Namespaced {
			scopes = namespaces
		}
		for _, ns := range scopes {
			spec := watch.StreamSpec{Target: req.target, GVR: rr.GVR, Namespace: ns, Operations: rr.Operations,
				ExcludeFieldManagers: rr.ExcludeFieldManagers, ExcludeUsers: rr.ExcludeUsers}
			if watch.IsSecret(rr.GVR) {
				spec.Seal = seal // resolved only with one
			}
			specs = append(specs, spec)
		}
		resources = append(resources, v1alpha1.FormatResource(rr.GVR))
	}
	slices.Sort(resources)
	return specs, resources
}

// resolveOnly resolves, without watching anything, the streams of the local cluster req would
// ask for if this replica owned its GitTarget: what the attribution webhook configuration,
// which the leader writes for every replica, must cover. Nil when the rule asks for nothing
// there (invalid, its target missing or on a remote cluster, nothing resolved).
func (c *Controller) resolveOnly(req ruleRequest) []watch.StreamSpec {
	if c.opts.AttributionWebhook == nil || req.invalid != "" || req.failed != "" {
		return nil
	}
	var t v1alpha1.GitTarget
	if exists, err := c.get(kindTarget, req.target, &t); err != nil || !exists || c.clusterOf(t.Spec.Destination()) != c.opts.Cluster {
		return nil
	}
	source := c.opts.Sources.Cluster(c.opts.Cluster)
	if source == nil {
		return nil
	}
	// Secrets only where the target encrypts them and the webhook keeps keyed digests.
	seal := targetSealer(&t)
	if !c.webhookCoversSecrets() {
		seal = nil
	}
	res, err := source.Resolve(selectors(req.rules, seal != nil), req.namespacedOnly)
	if err != nil {
		return nil
	}
	specs, _ := streamSpecs(req, res, seal)
	return specs
}

// webhookCoversSecrets says whether the attribution webhook is sent the writes of the Secrets
// GitTargets encrypt (AttributionWebhookOptions.Secrets).
func (c *Controller) webhookCoversSecrets() bool {
	return c.opts.AttributionWebhook != nil && c.opts.AttributionWebhook.Secrets
}

// want records the streams of the local cluster a rule asks for, whichever replica runs them
// (nil: none), for the attribution webhook configuration: Secrets left out unless the webhook
// keeps keyed digests of their writes.
func (c *Controller) want(owner string, specs []watch.StreamSpec) {
	if !c.webhookCoversSecrets() {
		specs = slices.DeleteFunc(slices.Clone(specs), func(s watch.StreamSpec) bool { return watch.IsSecret(s.GVR) })
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(specs) == 0 {
		delete(c.wanted, owner)
		return
	}
	c.wanted[owner] = specs
}

// wantedStreams are the streams of the local cluster every rule asks for, whichever replica
// runs them.
func (c *Controller) wantedStreams() []watch.StreamSpec {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []watch.StreamSpec
	for _, specs := range c.wanted {
		out = append(out, specs...)
	}
	return out
}

// describeUnresolved names each rules[i] entry that resolved to nothing and why, in a form a
// user can act on.
func describeUnresolved(rules []v1alpha1.ResourceRule, unresolved []watch.Unresolved) string {
	parts := make([]string, 0, len(unresolved))
	for _, u := range unresolved {
		var why string
		switch u.Reason {
		case watch.UnresolvedNotServed:
			why = "not served by the cluster (yet): install its CRD and wait until it is established, or check that its aggregated API is available"
		case watch.UnresolvedVersionNotServed:
			why = fmt.Sprintf("served, but in none of apiVersions %v", rules[u.Selector].APIVersions)
		case watch.UnresolvedNotListable:
			why = "served without the list and watch verbs, so it cannot be mirrored"
		case watch.UnresolvedSecret:
			why = "Secrets are mirrored only encrypted: set spec.encryption.age on the GitTarget"
		case watch.UnresolvedClusterScoped:
			why = "cluster-scoped, and a WatchRule mirrors only its own namespace: use a ClusterWatchRule"
		default:
			why = string(u.Reason)
		}
		parts = append(parts, fmt.Sprintf("rules[%d] %q in apiGroups %s: %s (%s)", u.Selector, u.Resource, formatGroups(rules[u.Selector].APIGroups), why, u.Reason))
	}
	return strings.Join(parts, "; ")
}

func formatGroups(groups []string) string {
	quoted := make([]string, len(groups))
	for i, g := range groups {
		quoted[i] = fmt.Sprintf("%q", g)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// describeIgnored is the note a rule's messages carry about resources its wildcards select
// that are not mirrored.
func describeIgnored(res watch.Resolution) string {
	var msg string
	if len(res.ClusterScoped) > 0 {
		msg += "; cluster-scoped resources are not mirrored by a WatchRule: " + formatResources(res.ClusterScoped)
	}
	if len(res.Secrets) > 0 {
		msg += "; Secrets are mirrored only encrypted, and the GitTarget sets no spec.encryption.age: " + formatResources(res.Secrets)
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

// selectors turns rules into watch selectors.
func selectors(rules []v1alpha1.ResourceRule, allowSecrets bool) []watch.Selector {
	out := make([]watch.Selector, len(rules))
	for i := range rules {
		out[i] = watch.Selector{
			AllowSecrets: allowSecrets,
			APIGroups:    rules[i].APIGroups,
			APIVersions:  rules[i].APIVersions,
			Resources:    rules[i].Resources,
			Operations:   watchOps(rules[i].GetOperations()),

			ExcludeFieldManagers: rules[i].ExcludeFieldManagers,
			ExcludeUsers:         rules[i].ExcludeUsers,
		}
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

// streamOf names where a GitTarget writes, for its streams' identity and resume cursors:
// "<branch>:<folder>" (a Git branch name cannot hold ':'). The source cluster is not part of
// it: a cursor's key names its cluster already.
func streamOf(d v1alpha1.Destination) string {
	return d.Branch + ":" + cleanPath(d.Path)
}
