package controller

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/git"
	"github.com/kubescribe/kubescribe/internal/repoid"
	"github.com/kubescribe/kubescribe/internal/secretenc"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// targetSealer is what seals t's Secrets (spec.encryption.age), nil when it sets none or its
// recipients are invalid (then the target is not routed: InvalidSpec).
func targetSealer(t *v1alpha1.GitTarget) watch.Sealer {
	if t.Spec.Encryption == nil {
		return nil
	}
	e, err := secretenc.NewEncrypter(t.Spec.Encryption.Age)
	if err != nil {
		return nil
	}
	return e
}

// syncTarget routes a GitTarget's changes to the worker of its provider's branch, and moves it
// when its destination (branch, path, sourceCluster) changed: see retarget.
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
		c.mu.Lock()
		delete(c.replayed, name)
		c.mu.Unlock()
		c.releaseSource(name, "")
		c.forgetSecretRefs(ctx, kindTarget, name)
		if c.opts.Cursors != nil && c.leads() {
			n, err := c.opts.Cursors.DropTarget(ctx, name)
			if err != nil {
				return fmt.Errorf("removing the resume cursors of deleted GitTarget %s: %w", name, err)
			}
			c.log.Debug("removed the resume cursors of a deleted GitTarget", "target", name.String(), "cursors", n)
		}
		c.enqueueAllTargets() // one refused for overlapping this one may write now
		return nil
	}
	if !c.ownsTarget(&t) {
		// Another replica writes its branch: it routes the target and writes its status.
		c.release(&t)
		c.recheckSuperseded(&t)
		return nil
	}
	c.acquire(&t)
	before := t.Status.DeepCopy()
	desired := t.Spec.Destination()
	moving := t.Status.RetargetingTo != nil || (t.Status.ObservedDestination != nil && *t.Status.ObservedDestination != desired)
	if moving && (t.Status.RetargetingTo == nil || *t.Status.RetargetingTo != desired) {
		if err := c.tearDown(ctx, name, &t); err != nil {
			// Not torn down completely: retargetingTo stays as it was, so the next sync (with
			// backoff) starts the move again. Status says so meanwhile.
			msg := fmt.Sprintf("retargeting to %s: %v; retrying", describeDestination(&desired), err)
			setRetargeting(&t, metav1.ConditionTrue, v1alpha1.ReasonSnapshotPending, msg)
			setCondition(&t.Status.Conditions, t.Generation, metav1.ConditionUnknown, v1alpha1.ReasonProgressing, "%s", msg)
			t.Status.ObservedGeneration = t.Generation
			if werr := c.writeStatus(ctx, v1alpha1.GitTargetsResource, &t, before, &t.Status); werr != nil {
				c.log.Warn("cannot write the status of a GitTarget whose retarget failed", "target", name.String(), "err", werr)
			}
			return err
		}
		t.Status.RetargetingTo = &desired
	}
	if od := t.Status.ObservedDestination; od != nil && t.Status.FolderTree != "" {
		// What the last push left in the folder, so a restart does not check it again.
		c.opts.Router.KnowFolder(name, git.FolderRecord{Provider: types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.ProviderRef.Name},
			Branch: od.Branch, Path: od.Path, Tree: t.Status.FolderTree})
	}
	ready, reason, msg := c.routeTarget(name, &t)
	if reason == reasonSuperseded {
		c.release(&t)
		c.recheckSuperseded(&t)
		return nil
	}
	ready, reason, msg = c.reachSourceCluster(&t, ready, reason, msg)
	st := c.opts.Router.TargetStatus(name)
	c.replayIfLost(name, &t, st)
	if ready {
		if st.FolderRefused != nil {
			ready, reason = false, v1alpha1.ReasonFolderNotAdoptable
			msg = fmt.Sprintf("%v; nothing is committed for this GitTarget, its changes are held until the folder is fixed (checked again when branch %q moves; `kubescribe scan` gives the same answer)", st.FolderRefused, st.Branch)
		} else if st.LastError != nil {
			ready, reason = false, v1alpha1.ReasonPushFailed
			msg = fmt.Sprintf("pushing to %s branch %q failed (%d changes pending, retrying): %v", st.URL, st.Branch, st.Pending, st.LastError)
		} else if provider := (types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.ProviderRef.Name}); !c.isProviderReady(provider) {
			ready, reason = false, v1alpha1.ReasonProviderNotReady
			msg = fmt.Sprintf("GitProvider %q is not Ready; changes are still written with its last settings that worked", t.Spec.ProviderRef.Name)
			if c.providerHolds(provider) {
				msg = fmt.Sprintf("GitProvider %q is not Ready: its signing key cannot sign, and its commits are held until one can", t.Spec.ProviderRef.Name)
			}
		}
	}
	if st.LastCommit != "" {
		t.Status.LastCommit = st.LastCommit
		t.Status.FolderTree = st.FolderTree
		pt := metav1.NewTime(st.LastPush.Truncate(time.Second))
		t.Status.LastPushTime = &pt
	}
	status := conditionStatus(ready)
	recheck := targetRecheck
	switch {
	case moving:
		status, reason, msg = c.retargetProgress(ctx, name, &t, ready, reason, msg)
		if status != metav1.ConditionTrue {
			recheck = progressFallback
		}
	case ready:
		t.Status.ObservedDestination = &desired
	}
	if status == metav1.ConditionFalse {
		recheck = notReadyRecheck
	}
	setCondition(&t.Status.Conditions, t.Generation, status, reason, "%s", msg)
	t.Status.ObservedGeneration = t.Generation
	if err := c.writeStatus(ctx, v1alpha1.GitTargetsResource, &t, before, &t.Status); err != nil {
		return err
	}
	c.queue.AddAfter(key{kindTarget, name}, recheck)
	return nil
}

// replayMark is what replayIfLost last acted on for a GitTarget.
type replayMark struct{ startOvers, foreignEdits int }

// replayIfLost reports, once each, that the target's streams handed their whole state over
// again because its branch no longer held what was pushed, as the router did it: the branch
// worker started the branch over (git.TargetStatus.StartOvers; a Warning event), or someone else's
// commits changed the target's folder (ForeignEdits; a log line).
func (c *Controller) replayIfLost(name types.NamespacedName, t *v1alpha1.GitTarget, st git.TargetStatus) {
	now := replayMark{startOvers: st.StartOvers, foreignEdits: st.ForeignEdits}
	c.mu.Lock()
	seen := c.replayed[name]
	c.replayed[name] = now
	c.mu.Unlock()
	if now == seen {
		return
	}
	streams := st.ReplayedStreams
	branch := st.Branch
	if branch == "" {
		branch = t.Spec.Branch // this sync left the target unrouted
	}
	if now.startOvers == seen.startOvers {
		c.log.Info("someone else's commits changed the GitTarget's folder; its streams hand their state over again",
			"target", name.String(), "branch", branch, "streams", streams)
		return
	}
	c.log.Warn("the branch was started over; the GitTarget's streams hand their state over again",
		"target", name.String(), "branch", branch, "streams", streams)
	c.events.Eventf(t, corev1.EventTypeWarning, v1alpha1.ReasonBranchStartedOver,
		"branch %q was deleted and the server no longer holds its history; it is created again from the cluster (streams replayed: %d)", branch, streams)
}

// routeTarget routes the target to its branch when it can be written to, or unroutes it and
// says why.
func (c *Controller) routeTarget(name types.NamespacedName, t *v1alpha1.GitTarget) (ready bool, reason, msg string) {
	unroute := func(reason, msg string) (bool, string, string) {
		c.opts.Router.Unroute(name, false)
		return false, reason, msg
	}
	if msg, _ := c.secretRefsVerified(context.Background(), kindTarget, name, t.UID, authz.TargetSecretRefs(t), t.Spec); msg != "" {
		// Neither its kubeconfig is read nor its Secrets encrypted for its recipients.
		c.releaseSource(name, "")
		return unroute(v1alpha1.ReasonSecretReferenceUnverified, msg)
	}
	if ref := c.useSourceCluster(name, t); ref != nil {
		return unroute(ref.reason, ref.msg)
	}
	if e := t.Spec.Encryption; e != nil {
		if _, err := secretenc.NewEncrypter(e.Age); err != nil {
			return unroute(v1alpha1.ReasonInvalidSpec, fmt.Sprintf("spec.encryption.age: %v", err))
		}
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
	if other, ok := c.overlappingTarget(name, t, remote.URL); ok {
		return unroute(v1alpha1.ReasonPathOverlap, fmt.Sprintf(
			"folder %q of branch %q overlaps the folder %q of GitTarget %s, which writes to the same repository branch; give each GitTarget a folder of its own",
			cleanPath(t.Spec.Path), t.Spec.Branch, cleanPath(other.Spec.Path), types.NamespacedName{Namespace: other.Namespace, Name: other.Name}))
	}
	dest := git.Destination{Remote: remote, Branch: t.Spec.Branch, Path: t.Spec.Path,
		Stream: streamOf(t.Spec.Destination()), Cluster: c.clusterOf(t.Spec.Destination())}
	if err := c.opts.Router.Route(name, dest); err != nil {
		if errors.Is(err, git.ErrSuperseded) {
			return false, reasonSuperseded, ""
		}
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

// overlappingTarget returns a GitTarget that holds a folder overlapping t's on the same branch
// of the same repository (their GitProviders' URLs however spelled, repoid.Same): two writers
// of one folder would undo each other's sweeps. Only a target that writes (is routed) holds its folder, and only against
// a weaker claim: an established claim (the target writes where its status says its content
// is: observedDestination equals the spec, no retarget in progress) beats a pending one (a new
// target, or one being retargeted), and between equal claims the older target (by creation,
// then namespace/name) keeps it. A routed target that loses to t is re-evaluated, so that it
// stops writing.
func (c *Controller) overlappingTarget(name types.NamespacedName, t *v1alpha1.GitTarget, url string) (*v1alpha1.GitTarget, bool) {
	var found *v1alpha1.GitTarget
	for _, obj := range c.informers[kindTarget].GetIndexer().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || (u.GetNamespace() == name.Namespace && u.GetName() == name.Name) {
			continue
		}
		var other v1alpha1.GitTarget
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &other) != nil || other.Spec.Branch != t.Spec.Branch {
			continue
		}
		otherName := types.NamespacedName{Namespace: other.Namespace, Name: other.Name}
		if !pathsOverlap(other.Spec.Path, t.Spec.Path) || !c.opts.Router.Routed(otherName) {
			continue
		}
		var p v1alpha1.GitProvider
		exists, err := c.get(kindProvider, types.NamespacedName{Namespace: other.Namespace, Name: other.Spec.ProviderRef.Name}, &p)
		if err != nil || !exists || !repoid.Same(p.Spec.URL, url) {
			continue
		}
		if !strongerClaim(&other, t) {
			c.enqueue(kindTarget, otherName) // it loses the folder to t
			continue
		}
		if found == nil || strongerClaim(&other, found) {
			found = other.DeepCopy()
		}
	}
	return found, found != nil
}

// established reports whether t's claim on its folder is established: its content is where
// its spec says (observedDestination equals the spec) and no retarget is in progress.
func established(t *v1alpha1.GitTarget) bool {
	return t.Status.RetargetingTo == nil && t.Status.ObservedDestination != nil && *t.Status.ObservedDestination == t.Spec.Destination()
}

// strongerClaim reports whether a's claim on an overlapping folder beats b's: an established
// claim beats a pending one; creation time (then namespace/name) breaks ties between equal
// claims.
func strongerClaim(a, b *v1alpha1.GitTarget) bool {
	if ea, eb := established(a), established(b); ea != eb {
		return ea
	}
	return olderTarget(a, b)
}

// olderTarget orders GitTargets by creation, then by namespace/name.
func olderTarget(a, b *v1alpha1.GitTarget) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// cleanPath is a folder as the layout uses it: "" for the repository root.
func cleanPath(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// pathsOverlap reports whether one folder equals or contains the other.
func pathsOverlap(a, b string) bool {
	a, b = cleanPath(a), cleanPath(b)
	return a == "" || b == "" || a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// enqueueAllTargets re-evaluates every GitTarget.
func (c *Controller) enqueueAllTargets() {
	for _, obj := range c.informers[kindTarget].GetIndexer().List() {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			c.enqueue(kindTarget, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()})
		}
	}
}
