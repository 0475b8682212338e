package controller

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/git"
)

// VerdictSource reads what admission recorded of a CommitRequest; authz.Store implements it.
type VerdictSource interface {
	Lookup(ctx context.Context, uid types.UID) (authz.Verdict, bool, error)
}

// verdictRetries is how often a failed verdict lookup (Redis unavailable) is retried, with the
// queue's backoff, before the request is decided as if no verdict existed.
const verdictRetries = 5

// syncCommitRequest drives a CommitRequest: wait for its close delay, find its submitter in the
// admission record, hand a close request to the git router, and report what came of it. It is
// the gate of spec.author: the assertion is honoured only when the recorded verdict for this
// very object says the submitter was allowed to make it.
func (c *Controller) syncCommitRequest(ctx context.Context, name types.NamespacedName) error {
	var cr v1alpha1.CommitRequest
	exists, err := c.get(kindCommitRequest, name, &cr)
	if err != nil || !exists {
		return err
	}
	k := key{kindCommitRequest, name}
	if cr.Status.CompletionTime != nil {
		if !c.leads() {
			return nil
		}
		return c.expireCommitRequest(ctx, &cr)
	}
	if !c.ownsTargetNamed(types.NamespacedName{Namespace: cr.Namespace, Name: cr.Spec.TargetRef.Name}) {
		return nil // the owner of its GitTarget's branch closes the window
	}
	before := cr.Status.DeepCopy()
	st := &cr.Status
	st.ObservedGeneration = cr.Generation
	now := time.Now()
	if due := cr.CreationTimestamp.Add(cr.Spec.GetCloseDelay()); now.Before(due) {
		setCondition(&st.Conditions, cr.Generation, metav1.ConditionUnknown, v1alpha1.ReasonProgressing,
			"the window is closed once closeDelaySeconds (%d) have passed", cr.Spec.GetCloseDelay()/time.Second)
		c.queue.AddAfter(k, due.Sub(now))
		return c.writeStatus(ctx, v1alpha1.CommitRequestsResource, &cr, before, st)
	}

	id := string(cr.UID)
	target := types.NamespacedName{Namespace: cr.Namespace, Name: cr.Spec.TargetRef.Name}
	// A close an earlier kubescribe process accepted is kept in Redis: the router reports its
	// pushed commit, or commits its window again once the target is routed.
	res, handed := c.opts.Router.CloseResult(target, id)
	if handed && res.Outcome == git.CloseUnknown {
		// Whether a worker took it (before a restart) cannot be read now: nothing is decided
		// or written until it can (retried with backoff). Deciding now raced Redis' return: a
		// verdict read a moment later made the next sync take the request for lost.
		return fmt.Errorf("commit request %s: cannot read whether its window was closed (Redis): retrying", name)
	}
	if !handed && meta.FindStatusCondition(before.Conditions, v1alpha1.ConditionAuthorAttributed) != nil {
		// Handed to a worker by an earlier kubescribe process, which stopped before its worker
		// accepted it, or whose close could not be kept (AuthorAttributed is set only once a
		// request is handed over, or with a final state).
		res, handed = git.CloseResult{Outcome: git.CloseLost}, true
	}
	if !handed {
		v, found, err := c.lookupVerdict(ctx, &cr)
		if err != nil {
			if c.queue.NumRequeues(k) < verdictRetries {
				return err // retried with backoff
			}
			c.log.Warn("admission record unreadable; deciding the commit request without it", "object", name.String(), "err", err)
		}
		honoured := setAuthorAttributed(&cr, v, found)
		if !found {
			finish(&cr, now, v1alpha1.ReasonSubmitterUnknown,
				"no admission record for this request (the webhook is not registered, was bypassed, or could not reach Redis, or the record expired): kubescribe cannot tell whose window to close, so nothing is committed")
			return c.finishWrite(ctx, &cr, before)
		}
		st.Submitter = v.Submitter.Username
		req := git.CloseRequest{
			ID:       id,
			Target:   target,
			Username: v.Submitter.Username,
			Message:  cr.Spec.Message,
			Request:  name.String(),
		}
		if honoured {
			req.Author = &git.Signature{Name: cr.Spec.Author.Name, Email: cr.Spec.Author.Email}
		}
		if err := c.opts.Router.RequestClose(req); err != nil {
			// Not handed over: AuthorAttributed marks a request handed to a worker.
			meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionAuthorAttributed)
			setReady(&st.Conditions, cr.Generation, false, v1alpha1.ReasonTargetNotReady,
				"GitTarget %q is not Ready, so its windows cannot be closed yet: %v", cr.Spec.TargetRef.Name, err)
			c.queue.AddAfter(k, notReadyRecheck)
			return c.writeStatus(ctx, v1alpha1.CommitRequestsResource, &cr, before, st)
		}
		res = git.CloseResult{Outcome: git.ClosePending}
	} else if meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAuthorAttributed) == nil {
		// Handed over by an earlier process that stopped before its status write landed (the
		// router kept the close): the condition and the submitter come from the same record.
		if v, found, err := c.lookupVerdict(ctx, &cr); err == nil {
			setAuthorAttributed(&cr, v, found)
			if found {
				st.Submitter = v.Submitter.Username
			}
		}
	}

	switch res.Outcome {
	case git.ClosePending:
		msg := "closing the submitter's window; waiting for the commit to be pushed"
		if ts := c.opts.Router.TargetStatus(target); ts.LastError != nil {
			msg = fmt.Sprintf("the commit is made; pushing it failed and is retried: %v", ts.LastError)
		}
		setCondition(&st.Conditions, cr.Generation, metav1.ConditionUnknown, v1alpha1.ReasonProgressing, "%s", msg)
		// The router's push signal re-enqueues the request; this is the fallback.
		c.queue.AddAfter(k, notReadyRecheck)
		return c.writeStatus(ctx, v1alpha1.CommitRequestsResource, &cr, before, st)
	case git.CloseCommitted:
		st.SHA, st.Branch = res.SHA, res.Branch
		finish(&cr, now, v1alpha1.ReasonCommitted, "committed %s to branch %q with the request's message", res.SHA, res.Branch)
	case git.CloseNoOpenWindow:
		finish(&cr, now, v1alpha1.ReasonNoOpenWindow,
			"%s had no open commit window on GitTarget %q: nothing of theirs was waiting (already committed, closed by another author's change, or not yet attributed). Nothing is committed",
			st.Submitter, cr.Spec.TargetRef.Name)
	case git.CloseNothingToCommit:
		finish(&cr, now, v1alpha1.ReasonNothingToCommit, "the window's changes leave the folder as it is on the branch; no commit")
	default:
		finish(&cr, now, v1alpha1.ReasonFailed,
			"the git worker stopped (kubescribe restarted, or the GitTarget was retargeted) before this request's commit was pushed; its changes are committed with the generated message")
	}
	if err := c.finishWrite(ctx, &cr, before); err != nil {
		return err
	}
	c.opts.Router.ForgetClose(target, id)
	return nil
}

// lookupVerdict returns the verdict recorded for cr, if it is about this very object.
func (c *Controller) lookupVerdict(ctx context.Context, cr *v1alpha1.CommitRequest) (authz.Verdict, bool, error) {
	if c.opts.Verdicts == nil {
		return authz.Verdict{}, false, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, found, err := c.opts.Verdicts.Lookup(lctx, cr.UID)
	if err != nil || !found {
		return authz.Verdict{}, false, err
	}
	if v.Namespace != cr.Namespace || v.Name != cr.Name || v.Target != cr.Spec.TargetRef.Name || v.Submitter.Username == "" {
		return authz.Verdict{}, false, nil
	}
	return v, true, nil
}

// setAuthorAttributed sets the AuthorAttributed condition and reports whether spec.author is
// honoured: only when a verdict for this object says the submitter was allowed to assert
// exactly this author.
func setAuthorAttributed(cr *v1alpha1.CommitRequest, v authz.Verdict, found bool) bool {
	set := func(ok bool, reason, format string, args ...any) {
		meta.SetStatusCondition(&cr.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionAuthorAttributed, Status: conditionStatus(ok), ObservedGeneration: cr.Generation,
			Reason: reason, Message: fmt.Sprintf(format, args...),
		})
	}
	a := cr.Spec.Author
	switch {
	case a != nil && found && v.Authorized && v.Author != nil && *v.Author == (authz.Author{Name: a.Name, Email: a.Email}):
		set(true, v1alpha1.ReasonAuthorAsserted, "the commit is authored by %s <%s>, asserted by %s, who may assert-author on GitTarget %q",
			a.Name, a.Email, v.Submitter.Username, cr.Spec.TargetRef.Name)
		return true
	case a != nil && found:
		set(false, v1alpha1.ReasonAuthorAssertionUnverified,
			"spec.author is ignored: admission did not record that %s may assert-author on GitTarget %q; the commit is authored by the submitter's attributed identity",
			v.Submitter.Username, cr.Spec.TargetRef.Name)
	case a != nil:
		set(false, v1alpha1.ReasonAuthorAssertionUnverified,
			"spec.author is ignored: there is no admission record for this request, so the assertion cannot be verified")
	case found:
		set(true, v1alpha1.ReasonAttributedFromAdmission, "the commit is authored by the submitter, %s, as the apiserver authenticated them", v.Submitter.Username)
	default:
		set(false, v1alpha1.ReasonCommitterFallback,
			"there is no admission record naming the submitter; no window is closed on an unknown person's behalf")
	}
	return false
}

// finish sets the final Ready condition and the completion time.
func finish(cr *v1alpha1.CommitRequest, now time.Time, reason, format string, args ...any) {
	setReady(&cr.Status.Conditions, cr.Generation, reason == v1alpha1.ReasonCommitted, reason, format, args...)
	t := metav1.NewTime(now.Truncate(time.Second))
	cr.Status.CompletionTime = &t
}

func (c *Controller) finishWrite(ctx context.Context, cr *v1alpha1.CommitRequest, before *v1alpha1.CommitRequestStatus) error {
	if err := c.writeStatus(ctx, v1alpha1.CommitRequestsResource, cr, before, &cr.Status); err != nil {
		return err
	}
	c.log.Info("commit request finished", "object", cr.Namespace+"/"+cr.Name,
		"reason", meta.FindStatusCondition(cr.Status.Conditions, v1alpha1.ConditionReady).Reason, "sha", cr.Status.SHA)
	if c.opts.CommitRequestTTL > 0 {
		c.queue.AddAfter(key{kindCommitRequest, types.NamespacedName{Namespace: cr.Namespace, Name: cr.Name}}, c.opts.CommitRequestTTL)
	}
	return nil
}

// expireCommitRequest deletes a finished request once CommitRequestTTL has passed.
func (c *Controller) expireCommitRequest(ctx context.Context, cr *v1alpha1.CommitRequest) error {
	ttl := c.opts.CommitRequestTTL
	if ttl <= 0 {
		return nil
	}
	if left := time.Until(cr.Status.CompletionTime.Add(ttl)); left > 0 {
		c.queue.AddAfter(key{kindCommitRequest, types.NamespacedName{Namespace: cr.Namespace, Name: cr.Name}}, left)
		return nil
	}
	uid := cr.UID
	err := c.opts.Client.Resource(v1alpha1.CommitRequestsResource).Namespace(cr.Namespace).Delete(ctx, cr.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting expired commit request %s/%s: %w", cr.Namespace, cr.Name, err)
	}
	c.log.Info("deleted expired commit request", "object", cr.Namespace+"/"+cr.Name)
	return nil
}
