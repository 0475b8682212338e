package controller

import (
	"context"
	"fmt"
	"reflect"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/git"
)

// route is where a Ready target's changes go.
type route struct {
	worker *runningWorker
	path   string
}

// workerKey names the single writer of one branch of one provider's repository.
type workerKey struct {
	provider types.NamespacedName
	branch   string
}

type runningWorker struct {
	key    workerKey
	state  providerState
	worker *git.Worker
	cancel context.CancelFunc
}

// pushRecord is the last push that carried a target's commits.
type pushRecord struct {
	sha  string
	time time.Time
}

// syncTarget routes a GitTarget's changes to the worker of its provider's branch.
func (c *Controller) syncTarget(ctx context.Context, name types.NamespacedName) error {
	var t v1alpha1.GitTarget
	exists, err := c.get(kindTarget, name, &t)
	if err != nil {
		return err
	}
	defer c.enqueueReferencing(kindRule, name.Namespace, "targetRef", name.Name)
	if !exists {
		c.mu.Lock()
		c.setRouteLocked(name, nil)
		delete(c.pushes, name) // a re-created target starts without its predecessor's history
		c.mu.Unlock()
		return nil
	}
	before := t.Status.DeepCopy()
	rt, reason, msg := c.routeTarget(name, &t)
	ready := rt != nil
	if ready {
		t.Status.ObservedDestination = &v1alpha1.Destination{Branch: t.Spec.Branch, Path: t.Spec.Path}
		if st := rt.worker.worker.Status(); st.LastError != nil {
			ready, reason = false, v1alpha1.ReasonPushFailed
			msg = fmt.Sprintf("pushing to %s branch %q failed (%d changes pending, retrying): %v", rt.worker.state.url, t.Spec.Branch, st.Pending, st.LastError)
		} else if !c.isProviderReady(types.NamespacedName{Namespace: t.Namespace, Name: t.Spec.ProviderRef.Name}) {
			ready, reason = false, v1alpha1.ReasonProviderNotReady
			msg = fmt.Sprintf("GitProvider %q is not Ready; changes are still written with its last settings that worked", t.Spec.ProviderRef.Name)
		}
	}
	c.mu.RLock()
	push, pushed := c.pushes[name]
	c.mu.RUnlock()
	if pushed {
		t.Status.LastCommit = push.sha
		pt := metav1.NewTime(push.time.Truncate(time.Second))
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

// routeTarget routes the target to its branch worker when it can be written to, or unroutes
// it and says why. Finding or starting the worker and recording the route happen under one
// lock, so a concurrent sync of another target cannot see the new worker unused and stop it.
func (c *Controller) routeTarget(name types.NamespacedName, t *v1alpha1.GitTarget) (rt *route, reason, msg string) {
	unroute := func(reason, msg string) (*route, string, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.setRouteLocked(name, nil)
		return nil, reason, msg
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
	c.mu.Lock()
	defer c.mu.Unlock()
	state, ok := c.providers[providerName]
	if !ok {
		c.setRouteLocked(name, nil)
		return nil, v1alpha1.ReasonProviderNotReady, fmt.Sprintf("GitProvider %q is not Ready", providerName.Name)
	}
	w, err := c.ensureWorkerLocked(workerKey{provider: providerName, branch: t.Spec.Branch}, *state)
	if err != nil {
		c.setRouteLocked(name, nil)
		return nil, v1alpha1.ReasonInvalidSpec, err.Error()
	}
	where := "the repository root"
	if t.Spec.Path != "" {
		where = fmt.Sprintf("folder %q", t.Spec.Path)
	}
	rt = &route{worker: w, path: t.Spec.Path}
	c.setRouteLocked(name, rt)
	return rt, v1alpha1.ReasonReady, fmt.Sprintf("writing to %s branch %q, %s", state.url, t.Spec.Branch, where)
}

// ensureWorkerLocked returns the running worker for k, replacing one started with other
// provider settings (rotated credentials, a new commit window).
func (c *Controller) ensureWorkerLocked(k workerKey, state providerState) (*runningWorker, error) {
	old, replacing := c.workers[k]
	if replacing {
		if reflect.DeepEqual(old.state, state) {
			return old, nil
		}
		// Rotated credentials are taken in place, so the worker keeps what it holds, including
		// commits the old credentials could not push. Other settings need a new worker.
		withOldCreds := state
		withOldCreds.creds = old.state.creds
		if reflect.DeepEqual(old.state, withOldCreds) {
			if err := old.worker.SetCredentials(state.creds); err != nil {
				return nil, err
			}
			old.state.creds = state.creds // the rest is equal; syncTarget reads state.url unlocked
			return old, nil
		}
		c.stopWorkerLocked(old)
	}
	if c.workerCtx == nil {
		return nil, fmt.Errorf("controller is not running")
	}
	w, err := git.NewWorker(git.Options{
		URL:               state.url,
		Branch:            k.branch,
		Credentials:       state.creds,
		Committer:         state.committer,
		CommitWindow:      state.window,
		AuthorEmailDomain: state.domain,
		Logger:            c.opts.Logger.With("provider", k.provider.String()), // the worker adds component, url and branch
		Metrics:           c.opts.GitMetrics,
		OnPushed:          c.onPushed,
		OnFailed:          func(error) { c.enqueueTargetsOf(k) },
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(c.workerCtx)
	rw := &runningWorker{key: k, state: state, worker: w, cancel: cancel}
	c.workers[k] = rw
	c.workersGroup.Add(1)
	go func() {
		defer c.workersGroup.Done()
		if err := w.Run(ctx); err != nil {
			c.log.Error("git worker stopped", "provider", k.provider.String(), "branch", k.branch, "err", err)
		}
	}()
	if replacing {
		// Other targets on this branch switch to the new worker at once, so no change is
		// handed to the stopping one.
		for name, r := range c.routes {
			if r.worker == old {
				r.worker = rw
				c.routes[name] = r
			}
		}
	}
	c.log.Info("started git worker", "provider", k.provider.String(), "branch", k.branch, "url", state.url)
	return rw, nil
}

// stopWorkerLocked asks a worker to commit and push what it holds, then stop.
func (c *Controller) stopWorkerLocked(rw *runningWorker) {
	rw.cancel()
	delete(c.workers, rw.key)
	c.log.Info("stopping git worker", "provider", rw.key.provider.String(), "branch", rw.key.branch)
}

// setRouteLocked records (or with nil removes) a target's route and stops workers no route
// uses. c.mu must be held.
func (c *Controller) setRouteLocked(name types.NamespacedName, rt *route) {
	if rt == nil {
		delete(c.routes, name)
	} else {
		c.routes[name] = *rt
	}
	used := map[*runningWorker]bool{}
	for _, r := range c.routes {
		used[r.worker] = true
	}
	for _, rw := range c.workers {
		if !used[rw] {
			c.stopWorkerLocked(rw)
		}
	}
}

// deliver hands an attributed change to its target's worker. The read lock is held across
// Submit (which never blocks): a worker is replaced or stopped only under the write lock, so a
// change is handed either to the old worker before it is told to stop, and is part of what it
// commits and pushes on its way out, or to its successor.
func (c *Controller) deliver(ac attribution.AttributedChange) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	rt, ok := c.routes[ac.Target]
	if !ok {
		c.log.Warn("change dropped: its GitTarget is not Ready", "target", ac.Target.String(),
			"resource", ac.GVR.Resource, "namespace", ac.Namespace, "name", ac.Name, "op", ac.Op)
		return
	}
	rt.worker.worker.Submit(rt.path, ac)
}

// onPushed records the last commit of each target a push carried and refreshes their status.
func (c *Controller) onPushed(res git.PushResult) {
	now := time.Now()
	c.mu.Lock()
	for _, ci := range res.Commits {
		c.pushes[ci.Target] = pushRecord{sha: ci.SHA, time: now}
	}
	c.mu.Unlock()
	for _, ci := range res.Commits {
		c.enqueue(kindTarget, ci.Target)
	}
}

// enqueueTargetsOf refreshes the status of every target a worker writes for, so a failing push
// shows in their Ready condition without waiting for the periodic re-check.
func (c *Controller) enqueueTargetsOf(k workerKey) {
	c.mu.RLock()
	var names []types.NamespacedName
	for name, r := range c.routes {
		if r.worker.key == k {
			names = append(names, name)
		}
	}
	c.mu.RUnlock()
	for _, name := range names {
		c.enqueue(kindTarget, name)
	}
}

func (c *Controller) isProviderReady(name types.NamespacedName) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.providerReady[name]
}
