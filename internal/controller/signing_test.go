package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/git"
	"github.com/kubescribe/kubescribe/internal/gittest"
)

func withSigning(secret string) func(*v1alpha1.GitProvider) {
	return func(p *v1alpha1.GitProvider) {
		p.Spec.Signing = &v1alpha1.CommitSigning{SecretRef: v1alpha1.LocalObjectReference{Name: secret}}
	}
}

// A provider's signing key walks through its life: a key that signs makes the provider Ready and
// names the key; a rotated key replaces it; a key that cannot sign makes the provider
// Ready=False (SigningKeyInvalid) and keeps the last key that signed; signing configured on a
// provider that signed nothing before, with a key that cannot sign, holds its commits rather
// than push them unsigned. No message quotes the key.
func TestSyncProviderSigningKey(t *testing.T) {
	key, signer := gittest.NewSSHKey(t)
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", remoteURL, withSigning("sign"))},
		secrets: []runtime.Object{
			newSecret("creds", map[string]string{"password": testPassword}),
			newSecret("sign", map[string]string{v1alpha1.SecretKeySigningKey: string(key)}),
		},
	})
	secrets := f.kube.CoreV1().Secrets(testNS)
	ctx := context.Background()

	require.NoError(t, f.syncProvider("git"))
	p := f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionTrue, v1alpha1.ReasonReady,
		"commits are signed with SSH ssh-ed25519 key SHA256:")
	first := f.settings("git").Signer
	require.NotNil(t, first)

	// Rotated: the next sync signs with the new key.
	key2, _ := gittest.NewSSHKey(t)
	_, err := secrets.Update(ctx, newSecret("sign", map[string]string{v1alpha1.SecretKeySigningKey: string(key2)}), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.syncProvider("git"))
	second := f.settings("git").Signer
	require.NotEqual(t, first.Key(), second.Key())

	// A public key where the private key belongs: not Ready, the last key that signed is kept.
	pub := string(ssh.MarshalAuthorizedKey(signer.PublicKey()))
	_, err = secrets.Update(ctx, newSecret("sign", map[string]string{v1alpha1.SecretKeySigningKey: pub}), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.syncProvider("git"))
	p = f.provider("git")
	cond := requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSigningKeyInvalid,
		`signing Secret "sign": the signing key is a public key`, "last settings that worked")
	require.NotContains(t, cond.Message, strings.Fields(pub)[1])
	require.Equal(t, second.Key(), f.settings("git").Signer.Key())

	// The Secret is deleted: retried, still the last key.
	require.NoError(t, secrets.Delete(ctx, "sign", metav1.DeleteOptions{}))
	require.Error(t, f.syncProvider("git"))
	p = f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSigningKeyInvalid,
		`signing Secret "sign" not found`)
	require.Equal(t, second.Key(), f.settings("git").Signer.Key())
}

// Signing turned on for a provider that pushed unsigned commits, with a key that cannot sign:
// the workers must not go on pushing unsigned. The kept settings refuse to sign (commits are
// held, the message says so) until a key that signs is given.
func TestSyncProviderHoldsCommitsWhenSigningCannotStart(t *testing.T) {
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", remoteURL)},
		secrets: []runtime.Object{
			newSecret("creds", map[string]string{"password": testPassword}),
			newSecret("sign", map[string]string{"wrong-key-name": "x"}),
		},
	})
	require.NoError(t, f.syncProvider("git"))
	require.Nil(t, f.settings("git").Signer, "unsigned before signing is configured")

	p := f.provider("git")
	withSigning("sign")(&p)
	_, err := f.dyn.Resource(v1alpha1.GitProvidersResource).Namespace(testNS).Update(context.Background(), toUnstructured(t, &p), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.syncProvider("git"))
	p = f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSigningKeyInvalid,
		`signing Secret "sign" has no "signing.key" key`, "commits are held until a key can sign them: nothing is pushed unsigned")
	s := f.settings("git").Signer
	require.NotNil(t, s)
	require.True(t, git.Refuses(s))
	_, err = s.Sign([]byte("x"))
	require.ErrorContains(t, err, `the signing key cannot sign: signing Secret "sign" has no "signing.key" key`)

	key, _ := gittest.NewSSHKey(t)
	_, err = f.kube.CoreV1().Secrets(testNS).Update(context.Background(), newSecret("sign", map[string]string{v1alpha1.SecretKeySigningKey: string(key)}), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.syncProvider("git"))
	require.False(t, git.Refuses(f.settings("git").Signer))
}

// Signing turned on while the rest of the check fails (here the credentials Secret is gone):
// the last settings that worked must not go on pushing unsigned. With a key that signs they
// sign with it; without one they hold the commits.
func TestSyncProviderSignsOrHoldsWhenTheCheckFailsForAnotherReason(t *testing.T) {
	key, _ := gittest.NewSSHKey(t)
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", remoteURL)},
		secrets: []runtime.Object{
			newSecret("creds", map[string]string{"password": testPassword}),
			newSecret("sign", map[string]string{v1alpha1.SecretKeySigningKey: string(key)}),
		},
	})
	ctx := context.Background()
	require.NoError(t, f.syncProvider("git"))
	require.Nil(t, f.settings("git").Signer)

	p := f.provider("git")
	withSigning("sign")(&p)
	_, err := f.dyn.Resource(v1alpha1.GitProvidersResource).Namespace(testNS).Update(ctx, toUnstructured(t, &p), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, f.kube.CoreV1().Secrets(testNS).Delete(ctx, "creds", metav1.DeleteOptions{}))
	require.Error(t, f.syncProvider("git"))
	p = f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound,
		"last settings that worked")
	s := f.settings("git").Signer
	require.NotNil(t, s)
	require.False(t, git.Refuses(s), "the spec's key signs what the last settings push")
	require.Contains(t, s.Key(), "SSH ssh-ed25519 key")

	// The signing key goes bad too: the commits are held.
	_, err = f.kube.CoreV1().Secrets(testNS).Update(ctx, newSecret("sign", map[string]string{v1alpha1.SecretKeySigningKey: "garbage"}), metav1.UpdateOptions{})
	require.NoError(t, err)
	f.c.mu.Lock()
	kept := *f.c.providers[nn("git")]
	kept.Signer = nil // as if signing had never worked
	f.c.providers[nn("git")] = &kept
	f.c.mu.Unlock()
	require.Error(t, f.syncProvider("git"))
	p = f.provider("git")
	requireReady(t, p.Status.Conditions, p.Status.ObservedGeneration, metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound,
		"nothing is pushed unsigned")
	require.True(t, git.Refuses(f.settings("git").Signer))
}

// A changed Secret enqueues the GitProviders whose credentials or signing key it holds and the
// GitTargets whose kubeconfig it is, and nothing else.
func TestASecretChangeEnqueuesWhatReadsIt(t *testing.T) {
	f := newFixture(t, fixtureConfig{objects: []runtime.Object{
		newProvider("creds-only", remoteURL),
		newProvider("signed", remoteURL, withSigning("sign")),
		remoteTarget("remote", "kube", "edge"),
	}})
	// The informers' add events queued every object: wait until they are all in, then empty
	// the queue.
	require.Eventually(t, func() bool { return f.c.queue.Len() == 3 }, 5*time.Second, time.Millisecond)
	drain := func() []key {
		var got []key
		for f.c.queue.Len() > 0 {
			k, _ := f.c.queue.Get()
			f.c.queue.Done(k)
			got = append(got, k)
		}
		return got
	}
	drain()
	for secret, want := range map[string][]key{
		"creds": {{kindProvider, nn("creds-only")}, {kindProvider, nn("signed")}},
		"sign":  {{kindProvider, nn("signed")}},
		"kube":  {{kindTarget, nn("remote")}},
		"other": nil,
	} {
		f.c.enqueueTargetsOfSecret(nn(secret))
		require.ElementsMatch(t, want, drain(), "Secret %q", secret)
	}
}

// A check that read the signing key and then failed at the remote hands that key on: the
// settings kept sign with it, and the signing Secret is read once per check.
func TestAFailedCheckReadsTheSigningKeyOnce(t *testing.T) {
	key, _ := gittest.NewSSHKey(t)
	f := newFixture(t, fixtureConfig{
		objects: []runtime.Object{newProvider("git", remoteURL)},
		secrets: []runtime.Object{
			newSecret("creds", map[string]string{"password": testPassword}),
			newSecret("sign", map[string]string{v1alpha1.SecretKeySigningKey: string(key)}),
		},
	})
	require.NoError(t, f.syncProvider("git"))
	p := f.provider("git")
	withSigning("sign")(&p)
	_, err := f.dyn.Resource(v1alpha1.GitProvidersResource).Namespace(testNS).Update(context.Background(), toUnstructured(t, &p), metav1.UpdateOptions{})
	require.NoError(t, err)
	f.probe.setErr(errors.New("listing " + remoteURL + ": 503 Service Unavailable"))
	f.kube.ClearActions()
	require.Error(t, f.syncProvider("git"))
	reads := 0
	for _, a := range f.kube.Actions() {
		if g, ok := a.(k8stesting.GetAction); ok && a.GetResource().Resource == "secrets" && g.GetName() == "sign" {
			reads++
		}
	}
	require.Equal(t, 1, reads, "the signing Secret is read once per check")
	s := f.settings("git").Signer
	require.NotNil(t, s)
	require.False(t, git.Refuses(s))
}
