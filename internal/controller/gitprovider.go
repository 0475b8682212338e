package controller

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/authz"
	"github.com/kubescribe/kubescribe/internal/git"
)

// probeTimeout bounds one reachability check of a repository.
const probeTimeout = 30 * time.Second

// maxCommitWindow is the longest commit window accepted, as the CRD schema says.
const maxCommitWindow = time.Hour

// minFetchInterval and maxFetchInterval bound a fetch interval other than 0, as the CRD schema
// says.
const (
	minFetchInterval = time.Second
	maxFetchInterval = 24 * time.Hour
)

// syncProvider validates a GitProvider's credentials and checks its repository answers.
func (c *Controller) syncProvider(ctx context.Context, name types.NamespacedName) error {
	var p v1alpha1.GitProvider
	exists, err := c.get(kindProvider, name, &p)
	if err != nil {
		return err
	}
	defer c.enqueueReferencing(kindTarget, name.Namespace, "providerRef", name.Name)
	if !exists {
		c.forgetProvider(name)
		c.forgetSecretRefs(ctx, kindProvider, name)
		return nil
	}
	before := p.Status.DeepCopy()
	state, signer, reason, msg, retry := c.evaluateProvider(ctx, &p)
	c.setProvider(name, state)
	if state == nil && p.Spec.Signing != nil && c.holdUnsigned(ctx, &p, signer, reason, msg) {
		msg += "; commits are held until a key can sign them: nothing is pushed unsigned"
	} else if state == nil && c.hasProvider(name) {
		msg += "; kubescribe keeps writing with the last settings that worked"
	}
	setReady(&p.Status.Conditions, p.Generation, state != nil, reason, "%s", msg)
	p.Status.ObservedGeneration = p.Generation
	// Every replica checks the provider (its targets are routed with what passed), the leader
	// alone reports it.
	if c.leads() {
		if err := c.writeStatus(ctx, v1alpha1.GitProvidersResource, &p, before, &p.Status); err != nil {
			return err
		}
	}
	if retry {
		return fmt.Errorf("GitProvider %s not ready: %s", name, msg)
	}
	c.queue.AddAfter(key{kindProvider, name}, providerRecheck)
	return nil
}

// evaluateProvider returns the provider's state when Ready, else the reason. retry says the
// failure may pass by itself (a network error) and deserves a backoff retry. signer is the
// signing key it read, when the check got that far and the key signs (a failure after it, the
// remote's, leaves it set).
func (c *Controller) evaluateProvider(ctx context.Context, p *v1alpha1.GitProvider) (remote *git.Remote, signer git.Signer, reason, msg string, retry bool) {
	// Credentials in the URL would end up in status messages and logs: refuse them, without
	// repeating the URL.
	// An SSH URL may name the user (git@host:path); never a password.
	if git.IsSSHURL(p.Spec.URL) {
		if err := git.ValidateURL(p.Spec.URL); err != nil {
			return nil, nil, v1alpha1.ReasonInvalidSpec, "spec.url must be an SSH repository URL without password; put the private key in the Secret named by spec.secretRef", false
		}
		if p.Spec.SecretRef == nil {
			return nil, nil, v1alpha1.ReasonInvalidSpec, fmt.Sprintf("an SSH repository needs spec.secretRef: a Secret with the keys %q and %q", v1alpha1.SecretKeyIdentity, v1alpha1.SecretKeyKnownHosts), false
		}
	} else if u, err := url.Parse(p.Spec.URL); err != nil || u.User != nil {
		return nil, nil, v1alpha1.ReasonInvalidSpec, "spec.url must be a plain repository URL without user or password; put credentials in the Secret named by spec.secretRef", false
	}
	// The CRD schema refuses these, but objects stored before that rule existed, or served by
	// an apiserver without CEL, may still carry them.
	if w := p.GetCommitWindow(); w <= 0 || w > maxCommitWindow {
		return nil, nil, v1alpha1.ReasonInvalidSpec, fmt.Sprintf("spec.commitWindow %s must be above 0s and at most %s", w, maxCommitWindow), false
	}
	if f := p.GetFetchInterval(); f != 0 && (f < minFetchInterval || f > maxFetchInterval) {
		return nil, nil, v1alpha1.ReasonInvalidSpec, fmt.Sprintf("spec.fetchInterval %s must be 0s, or at least %s and at most %s", f, minFetchInterval, maxFetchInterval), false
	}
	// Only then are the Secrets it names read: their content goes to the spec's URL.
	if msg, retry := c.secretRefsVerified(ctx, kindProvider, types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, p.UID, authz.ProviderSecretRefs(p), p.Spec); msg != "" {
		return nil, nil, v1alpha1.ReasonSecretReferenceUnverified, msg, retry
	}
	creds, reason, msg, retry := c.providerCredentials(ctx, p)
	if reason != "" {
		return nil, nil, reason, msg, retry
	}
	signer, msg, retry = c.providerSigner(ctx, p)
	if msg != "" {
		return nil, nil, v1alpha1.ReasonSigningKeyInvalid, msg, retry
	}
	committer := p.GetCommitter()
	remote = &git.Remote{
		Provider:          types.NamespacedName{Namespace: p.Namespace, Name: p.Name},
		URL:               p.Spec.URL,
		Credentials:       creds,
		Committer:         git.Signature{Name: committer.Name, Email: committer.Email},
		Signer:            signer,
		CommitWindow:      p.GetCommitWindow(),
		AuthorEmailDomain: p.GetAuthorEmailDomain(),
		FetchInterval:     p.GetFetchInterval(),
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := c.opts.ProbeRemote(pctx, p.Spec.URL, creds); err != nil {
		// The condition says what kind of failure it was (git.Probe classifies it); what the
		// server said goes to the log only.
		c.log.Warn("a GitProvider's repository check failed", "gitprovider", p.Namespace+"/"+p.Name, "err", err, "detail", git.RemoteDetail(err))
		if errors.Is(err, git.ErrHostKey) {
			return nil, signer, v1alpha1.ReasonHostKeyRejected, fmt.Sprintf("the SSH host key is not trusted (known_hosts of Secret %q): %v", p.Spec.SecretRef.Name, err), false
		}
		if errors.Is(err, git.ErrAuthentication) {
			if p.Spec.SecretRef == nil {
				return nil, signer, v1alpha1.ReasonAuthenticationFailed, fmt.Sprintf("the repository refused anonymous access (set spec.secretRef): %v", err), false
			}
			return nil, signer, v1alpha1.ReasonAuthenticationFailed, fmt.Sprintf("the repository refused the credentials of Secret %q: %v", p.Spec.SecretRef.Name, err), false
		}
		return nil, signer, v1alpha1.ReasonRemoteUnreachable, err.Error(), true
	}
	msg = fmt.Sprintf("repository %s is reachable", p.Spec.URL)
	if signer != nil {
		msg += "; commits are signed with " + signer.Key()
	}
	return remote, signer, v1alpha1.ReasonReady, msg, false
}

// providerSigner reads the provider's signing key (nil without spec.signing). The key stays in
// memory; messages name its fingerprint, never the key. msg says why it cannot sign; retry,
// that the Secret may yet appear.
func (c *Controller) providerSigner(ctx context.Context, p *v1alpha1.GitProvider) (signer git.Signer, msg string, retry bool) {
	if p.Spec.Signing == nil {
		return nil, "", false
	}
	name := p.Spec.Signing.SecretRef.Name
	s, err := c.opts.Kube.CoreV1().Secrets(p.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Sprintf("signing Secret %q not found in namespace %q", name, p.Namespace), true
	case err != nil:
		return nil, fmt.Sprintf("reading signing Secret %q: %v", name, err), true
	}
	key := s.Data[v1alpha1.SecretKeySigningKey]
	if len(key) == 0 {
		return nil, fmt.Sprintf("signing Secret %q has no %q key (an OpenSSH or armored OpenPGP private key)", name, v1alpha1.SecretKeySigningKey), false
	}
	signer, err = git.ParseSigningKey(key, s.Data[v1alpha1.SecretKeySigningPassphrase])
	if err != nil {
		return nil, fmt.Sprintf("signing Secret %q: %v", name, err), false
	}
	return signer, "", false
}

// holdUnsigned keeps a provider that must sign from pushing unsigned commits when its check
// failed (for whatever reason: the signing key, the credentials, the remote) and the last
// settings that worked sign nothing, or refuse to: their signer becomes the spec's key when
// that key signs (signer, when the check read it already), else one that refuses, so the workers hold their commits (LastError says why)
// until a key can sign. Settings that worked with a key keep it. It reports whether the
// commits are held.
func (c *Controller) holdUnsigned(ctx context.Context, p *v1alpha1.GitProvider, signer git.Signer, reason, msg string) bool {
	name := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	c.mu.RLock()
	r, ok := c.providers[name]
	c.mu.RUnlock()
	if !ok || (r.Signer != nil && !git.Refuses(r.Signer)) {
		return false
	}
	if signer == nil && reason != v1alpha1.ReasonSigningKeyInvalid && reason != v1alpha1.ReasonSecretReferenceUnverified {
		signer, msg, _ = c.providerSigner(ctx, p) // the check failed before it read the key
	}
	held := false
	if signer == nil {
		signer, held = git.RefusingSigner(msg), true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.providers[name] != r {
		return false // replaced meanwhile
	}
	kept := *r
	kept.Signer = signer
	c.providers[name] = &kept
	return held
}

// providerCredentials reads the provider's Secret. Credentials stay in memory; they are never
// written to disk, logged or put in a status message.
func (c *Controller) providerCredentials(ctx context.Context, p *v1alpha1.GitProvider) (creds git.Credentials, reason, msg string, retry bool) {
	if p.Spec.SecretRef == nil {
		return git.Credentials{}, "", "", false
	}
	s, err := c.opts.Kube.CoreV1().Secrets(p.Namespace).Get(ctx, p.Spec.SecretRef.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return creds, v1alpha1.ReasonSecretNotFound, fmt.Sprintf("Secret %q not found in namespace %q", p.Spec.SecretRef.Name, p.Namespace), true
	case err != nil:
		return creds, v1alpha1.ReasonSecretNotFound, fmt.Sprintf("reading Secret %q: %v", p.Spec.SecretRef.Name, err), true
	}
	if git.IsSSHURL(p.Spec.URL) {
		return sshCredentials(p.Spec.URL, s)
	}
	if _, ok := s.Data[v1alpha1.SecretKeyIdentity]; ok {
		return creds, v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q holds an SSH %q key, but spec.url is not an SSH URL: use an ssh:// or user@host:path URL, or %q and %q", s.Name, v1alpha1.SecretKeyIdentity, v1alpha1.SecretKeyUsername, v1alpha1.SecretKeyPassword), false
	}
	password := string(s.Data[v1alpha1.SecretKeyPassword])
	if password == "" {
		return creds, v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q has no %q key (a password or access token)", s.Name, v1alpha1.SecretKeyPassword), false
	}
	if ca := s.Data[v1alpha1.SecretKeyCACert]; len(ca) > 0 && !x509.NewCertPool().AppendCertsFromPEM(ca) {
		return creds, v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q key %q holds no PEM certificate", s.Name, v1alpha1.SecretKeyCACert), false
	}
	creds = git.Credentials{
		Username: string(s.Data[v1alpha1.SecretKeyUsername]),
		Password: password,
		CABundle: s.Data[v1alpha1.SecretKeyCACert],
	}
	if creds.Username == "" {
		creds.Username = v1alpha1.DefaultGitUsername
	}
	return creds, "", "", false
}

// sshCredentials reads an SSH repository's Secret: the private key and known_hosts, both
// required, and an optional username. They stay in memory; messages never quote them.
func sshCredentials(repoURL string, s *corev1.Secret) (creds git.Credentials, reason, msg string, retry bool) {
	key := s.Data[v1alpha1.SecretKeyIdentity]
	if len(key) == 0 {
		return creds, v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q has no %q key (the SSH private key)", s.Name, v1alpha1.SecretKeyIdentity), false
	}
	hosts := s.Data[v1alpha1.SecretKeyKnownHosts]
	if len(hosts) == 0 {
		return creds, v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q has no %q key: kubescribe never accepts an SSH host key unchecked", s.Name, v1alpha1.SecretKeyKnownHosts), false
	}
	creds = git.Credentials{Username: string(s.Data[v1alpha1.SecretKeyUsername]), SSHKey: key, KnownHosts: hosts}
	if err := git.CheckCredentials(repoURL, creds); err != nil {
		return git.Credentials{}, v1alpha1.ReasonSecretInvalid, fmt.Sprintf("Secret %q: %v", s.Name, strings.TrimPrefix(err.Error(), "git: ")), false
	}
	return creds, "", "", false
}

// setProvider records the outcome of a provider check. A Ready check replaces the settings
// workers use; a failed one only marks the provider not Ready. The last settings that worked
// stay in use, so a remote that is down during a re-check, or a Secret being rotated, does not
// stop the workers holding unpushed commits, nor the watches feeding them.
func (c *Controller) setProvider(name types.NamespacedName, remote *git.Remote) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if remote == nil {
		delete(c.providerReady, name)
		return
	}
	c.providers[name] = remote
	c.providerReady[name] = true
}

// providerHolds reports whether a provider's commits are held because signing is configured
// and its key cannot sign (holdUnsigned).
func (c *Controller) providerHolds(name types.NamespacedName) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.providers[name]
	return ok && git.Refuses(r.Signer)
}

// providerRemote is the last settings of a provider that worked.
func (c *Controller) providerRemote(name types.NamespacedName) (git.Remote, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.providers[name]
	if !ok {
		return git.Remote{}, false
	}
	return *r, true
}

// hasProvider reports whether a provider has settings that worked once.
func (c *Controller) hasProvider(name types.NamespacedName) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.providers[name]
	return ok
}

// forgetProvider drops a deleted provider's settings; its targets stop being written.
func (c *Controller) forgetProvider(name types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.providers, name)
	delete(c.providerReady, name)
}
