package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/gittest"
)

// signedMirror is newMirror whose GitProvider signs with the key in Secret "signing" (created
// with key), once its Ready condition names the key; then the WatchRule, so that no commit is
// made before.
func signedMirror(t *testing.T, ns string, key []byte) *mirror {
	t.Helper()
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	m := setUpTarget(t, env, ns, "", []string{"alice"}, configMapWriters)
	_, err = admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "signing"},
		Data:       map[string][]byte{v1alpha1.SecretKeySigningKey: key},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	_, err = dyn.Resource(v1alpha1.GitProvidersResource).Namespace(ns).Patch(ctx, "repo", types.MergePatchType,
		[]byte(`{"spec":{"signing":{"secretRef":{"name":"signing"}}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	cond := waitReady(t, v1alpha1.GitProvidersResource, ns, "repo", metav1.ConditionTrue, v1alpha1.ReasonReady, 2)
	require.Contains(t, cond.Message, "commits are signed with")
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "rule", Namespace: ns},
		Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"}, Rules: watchConfigMaps},
	})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady)
	return m
}

// requireSignedByKubescribe checks every commit of main with v: each commit kubescribe made (its
// committer email) verifies, with good in git's output, and there are at least two; the only
// other commit is foreign, whose check fails.
func (m *mirror) requireSignedByKubescribe(t *testing.T, v gittest.Verifier, foreign, good string) {
	t.Helper()
	var ours, others []string
	for _, line := range strings.Split(m.git(t, "log", "--format=%H %ce", "main"), "\n") {
		sha, email, _ := strings.Cut(line, " ")
		if email == v1alpha1.DefaultCommitterEmail {
			ours = append(ours, sha)
		} else {
			others = append(others, sha)
		}
	}
	require.Equal(t, []string{foreign}, others)
	require.GreaterOrEqual(t, len(ours), 2)
	for _, sha := range ours {
		out, err := v.Verify(m.repoDir, sha)
		require.NoError(t, err, "git verify-commit %s: %s", sha, out)
		require.Contains(t, out, good)
	}
	_, err := v.Verify(m.repoDir, foreign)
	require.Error(t, err, "carol's commit is not signed")
}

// alice writes while someone else pushes to the branch: the commit she waits for is built
// again on top of the foreign one. It returns the foreign commit.
func writeAroundAForeignPush(t *testing.T, m *mirror) string {
	t.Helper()
	ctx := context.Background()
	alice := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "a", "b")
	m.waitCommits(t, 1)
	foreign := m.carolCommits(t, "a foreign commit", map[string]string{"README.md": "hello\n"})
	_, err := alice.Patch(ctx, "a", types.MergePatchType, []byte(`{"data":{"k":"v2"}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	createConfigMaps(t, alice, "c")
	require.True(t, poll(60*time.Second, func() bool {
		return slices.Contains(m.files(t), objectFile(m, "", "configmaps", "c")) &&
			strings.Contains(m.git(t, "show", "main:"+objectFile(m, "", "configmaps", "a")), "v2")
	}), "files: %v", m.files(t))
	m.git(t, "merge-base", "--is-ancestor", foreign, "main")
	return foreign
}

// Every commit kubescribe makes with an SSH signing key verifies with the real git (gpg.format
// ssh, an allowed-signers file naming the committer); the commits built again on a foreign push
// too. The key is rotated without a restart: later commits verify with the new key only. A key
// that cannot sign makes the provider Ready=False with its reason, and kubescribe keeps
// signing with the last key that signed: no commit goes unsigned.
func TestCommitsSignedWithAnSSHKey(t *testing.T) {
	ctx := context.Background()
	key, signer := gittest.NewSSHKey(t)
	m := signedMirror(t, "e2e-sign-ssh", key)
	foreign := writeAroundAForeignPush(t, m)
	first := gittest.SSHVerifier(t, v1alpha1.DefaultCommitterEmail, signer.PublicKey())
	m.requireSignedByKubescribe(t, first, foreign, `Good "git" signature for `+v1alpha1.DefaultCommitterEmail)

	// Rotation: the Secret gets a new key; the next commits are signed with it.
	admin, err := kubernetes.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	secrets := admin.CoreV1().Secrets(m.ns)
	key2, signer2 := gittest.NewSSHKey(t)
	_, err = secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "signing"},
		Data: map[string][]byte{v1alpha1.SecretKeySigningKey: key2}}, metav1.UpdateOptions{})
	require.NoError(t, err)
	second := gittest.SSHVerifier(t, v1alpha1.DefaultCommitterEmail, signer2.PublicKey())
	fp2 := ssh.FingerprintSHA256(signer2.PublicKey())
	require.True(t, poll(60*time.Second, func() bool {
		c := waitReady(t, v1alpha1.GitProvidersResource, m.ns, "repo", metav1.ConditionTrue, v1alpha1.ReasonReady)
		return strings.Contains(c.Message, fp2)
	}), "the provider does not name the new key")
	alice := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "after-rotation")
	require.True(t, poll(60*time.Second, func() bool {
		return slices.Contains(m.files(t), objectFile(m, "", "configmaps", "after-rotation"))
	}))
	tip := m.git(t, "rev-parse", "main")
	out, err := second.Verify(m.repoDir, tip)
	require.NoError(t, err, out)
	_, err = first.Verify(m.repoDir, tip)
	require.Error(t, err, "the rotated-out key did not sign the new commit")

	// A public key where the private key belongs: refused with the reason; the last key that
	// signed goes on signing.
	_, err = secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "signing"},
		Data: map[string][]byte{v1alpha1.SecretKeySigningKey: ssh.MarshalAuthorizedKey(signer2.PublicKey())}}, metav1.UpdateOptions{})
	require.NoError(t, err)
	cond := waitReady(t, v1alpha1.GitProvidersResource, m.ns, "repo", metav1.ConditionFalse, v1alpha1.ReasonSigningKeyInvalid)
	require.Contains(t, cond.Message, `signing Secret "signing": the signing key is a public key`)
	require.Contains(t, cond.Message, "last settings that worked")
	createConfigMaps(t, alice, "with-a-bad-key")
	require.True(t, poll(60*time.Second, func() bool {
		return slices.Contains(m.files(t), objectFile(m, "", "configmaps", "with-a-bad-key"))
	}))
	out, err = second.Verify(m.repoDir, m.git(t, "rev-parse", "main"))
	require.NoError(t, err, out)
}

// The same with an OpenPGP key, checked by Debian's gnupg with the public key imported.
func TestCommitsSignedWithAnOpenPGPKey(t *testing.T) {
	secret, public := gittest.NewOpenPGPKey(t, "kubescribe", v1alpha1.DefaultCommitterEmail, "")
	m := signedMirror(t, "e2e-sign-pgp", secret)
	foreign := writeAroundAForeignPush(t, m)
	m.requireSignedByKubescribe(t, gittest.OpenPGPVerifier(t, public), foreign, "GOODSIG")
}

// Signing turned on with a key kubescribe cannot read: the provider is Ready=False naming the
// missing Secret, and the commits are held rather than pushed unsigned (the GitTarget says why);
// once the Secret exists, the held change is pushed, signed.
func TestSigningWithAMissingKeyHoldsCommits(t *testing.T) {
	ctx := context.Background()
	m := newMirror(t, "e2e-sign-missing", "", []string{"alice"}, configMapWriters, watchConfigMaps)
	alice := clientFor(t, "alice").CoreV1().ConfigMaps(m.ns)
	createConfigMaps(t, alice, "unsigned")
	m.waitCommits(t, 1) // signing is not configured yet

	dyn, err := dynamic.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	_, err = dyn.Resource(v1alpha1.GitProvidersResource).Namespace(m.ns).Patch(ctx, "repo", types.MergePatchType,
		[]byte(`{"spec":{"signing":{"secretRef":{"name":"signing"}}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	cond := waitReady(t, v1alpha1.GitProvidersResource, m.ns, "repo", metav1.ConditionFalse, v1alpha1.ReasonSigningKeyInvalid, 2)
	require.Contains(t, cond.Message, `signing Secret "signing" not found in namespace "e2e-sign-missing"`)
	require.Contains(t, cond.Message, "nothing is pushed unsigned")

	createConfigMaps(t, alice, "held")
	cond = waitReady(t, v1alpha1.GitTargetsResource, m.ns, "target", metav1.ConditionFalse, v1alpha1.ReasonPushFailed)
	require.Contains(t, cond.Message, "the signing key cannot sign")
	require.Len(t, m.commits(t), 1, "nothing was pushed unsigned")

	key, signer := gittest.NewSSHKey(t)
	admin, err := kubernetes.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	_, err = admin.CoreV1().Secrets(m.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "signing"},
		Data: map[string][]byte{v1alpha1.SecretKeySigningKey: key}}, metav1.CreateOptions{})
	require.NoError(t, err)
	m.waitCommits(t, 2)
	out, err := gittest.SSHVerifier(t, v1alpha1.DefaultCommitterEmail, signer.PublicKey()).Verify(m.repoDir, m.git(t, "rev-parse", "main"))
	require.NoError(t, err, out)
	require.Contains(t, m.git(t, "show", "--stat", "main"), "held.yaml")
}
