package controller

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// Ownership says which branches this replica writes and whether it runs the cluster-wide
// singletons; internal/ownership's Membership implements it. Without one (a single replica),
// the controller owns every branch and leads.
//
// A replica reconciles every object, but acts only on what it owns: a GitTarget (and the
// WatchRules, ClusterWatchRules and CommitRequests naming it) belongs to the owner of its
// provider's branch, which routes it, watches what its rules need and writes their status.
// Objects without an owner that way (a GitProvider, a rule or request whose GitTarget does not
// exist, a deleted GitTarget's cursors, finished CommitRequests) are the leader's.
type Ownership interface {
	Owns(key string) bool
	Leading() bool
	// Updates signals that the view changed (members, leadership).
	Updates() <-chan struct{}
	// TakeoverGap tells how long a branch just acquired had no writer, when its previous owner
	// left.
	TakeoverGap(key string) (time.Duration, bool)
	// PreviousOwnerLost tells whether the writer of a branch this replica owns before it may
	// have died holding changes it had not pushed.
	PreviousOwnerLost(key string) bool
}

// HandoverMetrics counts the branches the controller comes to write and stops writing;
// internal/ownership's Handovers implements it.
type HandoverMetrics interface {
	Acquired(gapSeconds float64, known bool)
	Released()
	Owned(n int)
}

// reasonSuperseded is routeTarget's answer for a target whose branch another replica took over
// (git.ErrSuperseded): not a condition reason, the target is released.
const reasonSuperseded = "superseded"

type noHandovers struct{}

func (noHandovers) Acquired(float64, bool) {}
func (noHandovers) Released()              {}
func (noHandovers) Owned(int)              {}

// branchKey names a GitTarget's branch for ownership: its provider and spec.branch. Targets
// on one branch share one writer, so they share an owner.
func branchKey(t *v1alpha1.GitTarget) string {
	return t.Namespace + "/" + t.Spec.ProviderRef.Name + ":" + t.Spec.Branch
}

// ownsTarget reports whether this replica writes t's branch: it owns the branch's key in the
// ownership view, and its worker there was not superseded by another replica's since the view
// last changed (both believed they owned it; the newer writer keeps it).
func (c *Controller) ownsTarget(t *v1alpha1.GitTarget) bool {
	if c.opts.Ownership == nil {
		return true
	}
	provider := types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.ProviderRef.Name}
	return c.opts.Ownership.Owns(branchKey(t)) && !c.opts.Router.Superseded(provider, t.Spec.Branch)
}

// ownsTargetNamed is ownsTarget for the GitTarget name; a target that does not exist (or cannot
// be read) is the leader's.
func (c *Controller) ownsTargetNamed(name types.NamespacedName) bool {
	var t v1alpha1.GitTarget
	if exists, err := c.get(kindTarget, name, &t); err != nil || !exists {
		return c.leads()
	}
	return c.ownsTarget(&t)
}

// Resumable tells the watch whether the streams of target, as they are subscribed now, should
// replay the events since their trail (watch.RegistryOptions.Resumable): yes when whoever
// wrote its branch before this replica may have died holding changes it had not pushed (always
// without coordination: the writer before was this process's predecessor), no when a live
// replica hands the branch over, which pushes what it holds itself (replaying it too would
// commit those changes twice).
//
// The answer is taken when this replica comes to write the branch, and holds for
// resumeWindow, once per stream: a stream subscribed again (its cluster's clients rebuilt) or
// later (a rule selecting another resource) does not replay, since the events since its trail
// are this replica's own, handed over and maybe still on their way to the branch.
func (c *Controller) Resumable(stream watch.StreamID) bool {
	var t v1alpha1.GitTarget
	if exists, err := c.get(kindTarget, stream.Target, &t); err != nil || !exists {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resumableStreamLocked(branchKey(&t), stream)
}

// resumableStreamLocked answers Resumable for a stream of branch k. c.mu must be held.
func (c *Controller) resumableStreamLocked(k string, stream watch.StreamID) bool {
	if !c.resumableLocked(k) {
		return false
	}
	d := c.resumes[k]
	if d.asked[stream] {
		return false
	}
	d.asked[stream] = true
	return true
}

// resumeDecision is whether a branch's streams replay: until when (zero: they do not), and the
// streams told to already.
type resumeDecision struct {
	until time.Time
	asked map[watch.StreamID]bool
	// superseded: this replica's worker on the branch was superseded by another replica's
	// before it came to write the branch again; resumed holds the targets whose streams were
	// told to replay then (acquire).
	superseded bool
	resumed    map[types.NamespacedName]bool
}

// resumeWindow is how long after this replica came to write a branch its streams replay.
const resumeWindow = time.Minute

// resumableLocked decides, the first time it is asked for a branch this replica did not write
// yet, whether its streams replay, and answers from that decision until resumeWindow has
// passed. c.mu must be held.
func (c *Controller) resumableLocked(k string) bool {
	now := time.Now()
	if d, decided := c.resumes[k]; decided {
		return now.Before(d.until)
	}
	if _, had := c.owned[k]; had {
		return false // written here since before anything was decided: this replica's own streams
	}
	d := &resumeDecision{asked: map[watch.StreamID]bool{}, resumed: map[types.NamespacedName]bool{}}
	if c.opts.Ownership == nil || c.opts.Ownership.PreviousOwnerLost(k) {
		d.until = now.Add(resumeWindow)
	}
	c.resumes[k] = d
	return !d.until.IsZero()
}

// retakeLocked records that this replica writes branch k again after its worker there was
// superseded by another replica's: the changes that worker held were dropped, and the writer
// in between hands the branch back while running, dropping the changes still waiting for
// their authors (their audit facts may be what the pause held up). So the branch's streams
// replay as a lost writer's heir's do, whether they stopped meanwhile (a new subscription asks
// Resumable) or not (acquire resumes them). c.mu must be held.
func (c *Controller) retakeLocked(k string) {
	c.resumes[k] = &resumeDecision{asked: map[watch.StreamID]bool{}, resumed: map[types.NamespacedName]bool{},
		until: time.Now().Add(resumeWindow), superseded: true}
}

// leads reports whether this replica runs the singletons.
func (c *Controller) leads() bool {
	return c.opts.Ownership == nil || c.opts.Ownership.Leading()
}

// acquire records that this replica writes t's branch, counting a handover when it did not.
func (c *Controller) acquire(t *v1alpha1.GitTarget) {
	name := types.NamespacedName{Namespace: t.Namespace, Name: t.Name}
	k := branchKey(t)
	superseded := c.opts.Router.LastSuperseded(types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.ProviderRef.Name}, t.Spec.Branch)
	c.mu.Lock()
	_, had := c.owned[k]
	switch {
	case superseded.After(c.supersedeSeen[k]):
		c.supersedeSeen[k] = superseded
		c.retakeLocked(k)
	case !had:
		c.resumableLocked(k) // decided now if no stream asked yet
	}
	c.owned[k] = struct{}{}
	n := len(c.owned)
	_, released := c.releasedHere[name]
	delete(c.releasedHere, name)
	resume := released
	if d := c.resumes[k]; d != nil && d.superseded && !d.resumed[name] && time.Now().Before(d.until) {
		d.resumed[name], resume = true, true
	}
	c.mu.Unlock()
	if resume {
		// The target's streams here may not have stopped while this replica did not write its
		// branch (the ownership view changed back before its rules were synced): their changes
		// were dropped meanwhile, and a superseded writer dropped what it held. They start
		// again as a lost writer's heir's would; a stream that did stop is subscribed anew
		// and asks Resumable.
		if n := c.opts.Sources.Resume(name); n > 0 || !released {
			c.log.Info("streams replay the events since their trail: this replica writes a branch again whose writer in between may have dropped changes",
				"branch", k, "target", name.String(), "streams", n)
		}
	}
	if had || c.opts.Ownership == nil {
		return
	}
	gap, known := c.opts.Ownership.TakeoverGap(k)
	c.opts.Handovers.Acquired(gap.Seconds(), known)
	c.opts.Handovers.Owned(n)
	c.log.Info("this replica writes a branch now", "branch", k, "takeover_gap", gap, "gap_known", known)
}

// recheckSuperseded syncs t again once its branch's supersede hold ends, when this replica's
// view still says it owns the branch: if the newer writer's replica gave the branch up
// meanwhile (its own view says this one owns it), nobody else takes it up.
func (c *Controller) recheckSuperseded(t *v1alpha1.GitTarget) {
	if c.opts.Ownership == nil || !c.opts.Ownership.Owns(branchKey(t)) {
		return
	}
	c.queue.AddAfter(key{kindTarget, types.NamespacedName{Namespace: t.Namespace, Name: t.Name}}, c.opts.Router.SupersededHold()+time.Second)
}

// release stops writing t's branch (and t) here: another replica owns it.
func (c *Controller) release(t *v1alpha1.GitTarget) {
	name := types.NamespacedName{Namespace: t.Namespace, Name: t.Name}
	c.opts.Router.Release(name)
	k := branchKey(t)
	c.mu.Lock()
	_, had := c.owned[k]
	delete(c.owned, k)
	delete(c.resumes, k)
	c.releasedHere[name] = struct{}{}
	n := len(c.owned)
	c.mu.Unlock()
	if !had {
		return
	}
	c.opts.Handovers.Released()
	c.opts.Handovers.Owned(n)
	c.log.Info("another replica writes a branch now; this one stopped writing it", "branch", k)
}

// followOwnership reconciles everything again whenever the ownership view changes: each
// replica then takes up what it came to own and lets go of the rest.
func (c *Controller) followOwnership(ctx context.Context) {
	if c.opts.Ownership == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.opts.Ownership.Updates():
			c.opts.Router.ClearSuperseded()
			for _, k := range []kind{kindProvider, kindTarget, kindRule, kindClusterRule, kindCommitRequest} {
				c.enqueueAll(k)
			}
		}
	}
}
