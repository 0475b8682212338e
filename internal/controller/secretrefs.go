package controller

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/authz"
)

// SecretRefVerdicts reads what admission recorded of the Secret references of GitProviders and
// GitTargets; authz.SecretRefStore implements it.
type SecretRefVerdicts interface {
	LookupSecretRefs(ctx context.Context, uid types.UID, digest string) (authz.SecretRefVerdict, bool, error)
	ForgetSecretRefs(ctx context.Context, uid types.UID, keep string) error
}

// verifiedSpec is the object and spec whose Secret references were vouched for.
type verifiedSpec struct {
	uid    types.UID
	digest string
}

// secretRefsVerified says whether the Secrets a GitProvider or GitTarget (kind k) names may be
// used on its behalf: it names none, or admission recorded that someone who may read them
// (get on each, list when refs.List) created or changed the object with exactly this spec.
// kubescribe reads those Secrets with its own rights, so without that record whoever may write
// the object could have kubescribe send a Git password to a URL of theirs, connect with a
// kubeconfig they cannot read, or write the namespace's Secrets to Git for their own age
// recipient. It returns "" when they may be used, else why not; retry when the record could
// not be read (Redis).
func (c *Controller) secretRefsVerified(ctx context.Context, k kind, name types.NamespacedName, uid types.UID, refs authz.SecretRefs, spec any) (msg string, retry bool) {
	if c.opts.SecretRefs == nil || refs.Empty() {
		return "", false
	}
	digest, err := authz.SpecDigest(spec)
	if err != nil {
		return fmt.Sprintf("cannot digest the spec: %v", err), false
	}
	id := key{kind: k, NamespacedName: name}
	c.mu.RLock()
	known := c.refsVerified[id]
	c.mu.RUnlock()
	if known.uid == uid && known.digest == digest {
		return "", false
	}
	v, found, err := c.opts.SecretRefs.LookupSecretRefs(ctx, uid, digest)
	if err != nil {
		c.log.Warn("cannot read the admission record of a Secret reference; the Secrets are not used until it can be read", "kind", k, "object", name.String(), "err", err)
		return fmt.Sprintf("the admission record vouching for the Secrets this %s names cannot be read (Redis): they are not used until it can; retrying", k), true
	}
	if !found || !v.Refs.Covers(refs) {
		return unverifiedMessage(k, name, refs), false
	}
	c.mu.Lock()
	c.refsVerified[id] = verifiedSpec{uid: uid, digest: digest}
	c.mu.Unlock()
	c.log.Info("Secret references vouched for at admission", "kind", k, "object", name.String(), "by", v.User)
	if err := c.opts.SecretRefs.ForgetSecretRefs(ctx, uid, digest); err != nil {
		c.log.Debug("cannot remove the admission records of earlier specs", "kind", k, "object", name.String(), "err", err)
	}
	return "", false
}

// forgetSecretRefs drops what was vouched for of a deleted GitProvider or GitTarget, here and
// in Redis.
func (c *Controller) forgetSecretRefs(ctx context.Context, k kind, name types.NamespacedName) {
	id := key{kind: k, NamespacedName: name}
	c.mu.Lock()
	known, ok := c.refsVerified[id]
	delete(c.refsVerified, id)
	c.mu.Unlock()
	if ok && c.opts.SecretRefs != nil {
		if err := c.opts.SecretRefs.ForgetSecretRefs(ctx, known.uid, ""); err != nil {
			c.log.Debug("cannot remove the admission records of a deleted object", "kind", k, "object", name.String(), "err", err)
		}
	}
}

// unverifiedMessage says which Secrets are not used, why, and how the object gets verified.
func unverifiedMessage(k kind, name types.NamespacedName, refs authz.SecretRefs) string {
	var what []string
	if len(refs.Get) > 0 {
		what = append(what, fmt.Sprintf("the Secrets it names (%s, which need get)", strings.Join(quoteAll(refs.Get), ", ")))
	}
	if refs.List {
		what = append(what, "the namespace's Secrets it encrypts into Git (spec.encryption, which needs list on Secrets)")
	}
	return fmt.Sprintf("kubescribe does not use %s: no admission record says that someone who may read them created or changed this %s with its current spec "+
		"(the webhook %s was bypassed or down, or the requester lacked the right). Someone who may read them vouches for it by changing it, "+
		"or with `kubectl annotate %s %s -n %s kubescribe.dev/verify=$(date +%%s) --overwrite`",
		strings.Join(what, " and "), k, authz.SecretRefsWebhookName, strings.ToLower(string(k)), name.Name, name.Namespace)
}
