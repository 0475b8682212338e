package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/gittest"
)

// A GitProvider that reaches its repository over SSH, with a private key and known_hosts in
// its Secret, mirrors like an HTTPS one: alice's create is committed under her name and pushed
// through the SSH server's git-receive-pack. A GitProvider whose known_hosts holds another key
// for that server is HostKeyRejected (never accepted), the GitTarget on it is not Ready, and
// nothing of it reaches the repository. The private key appears in no condition.
func TestSSHProvider(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-ssh"
	admin, err := kubernetes.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	_, err = admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	bindRole(t, admin, ns, "writers", configMapWriters, "alice")
	m := &mirror{ns: ns, repo: ns}
	m.repoDir, err = env.Git.CreateRepo(ns)
	require.NoError(t, err)

	keyPEM, key := gittest.NewSSHKey(t)
	server := gittest.StartSSHServer(t, m.repoDir, key.PublicKey())
	_, otherHost := gittest.NewSSHKey(t)
	for name, knownHosts := range map[string][]byte{
		"ssh-credentials": gittest.KnownHostsLine(server.Addr, server.HostKey),
		"wrong-host-key":  gittest.KnownHostsLine(server.Addr, otherHost),
	} {
		_, err = admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Data:       map[string][]byte{v1alpha1.SecretKeyIdentity: keyPEM, v1alpha1.SecretKeyKnownHosts: knownHosts},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for provider, secret := range map[string]string{"repo": "ssh-credentials", "wrong": "wrong-host-key"} {
		create(t, v1alpha1.GitProvidersResource, ns, &v1alpha1.GitProvider{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
			ObjectMeta: metav1.ObjectMeta{Name: provider, Namespace: ns},
			Spec: v1alpha1.GitProviderSpec{URL: server.URL, SecretRef: &v1alpha1.LocalObjectReference{Name: secret},
				CommitWindow: &metav1.Duration{Duration: time.Second}},
		})
	}
	for target, provider := range map[string]string{"target": "repo", "refused": "wrong"} {
		create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
			ObjectMeta: metav1.ObjectMeta{Name: target, Namespace: ns},
			Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: provider}, Branch: target},
		})
		create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
			TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
			ObjectMeta: metav1.ObjectMeta{Name: target, Namespace: ns},
			Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: target}, Rules: watchConfigMaps},
		})
	}

	waitReady(t, v1alpha1.GitProvidersResource, ns, "repo", metav1.ConditionTrue, v1alpha1.ReasonReady)
	rejected := waitReady(t, v1alpha1.GitProvidersResource, ns, "wrong", metav1.ConditionFalse, v1alpha1.ReasonHostKeyRejected)
	require.Contains(t, rejected.Message, "does not match known_hosts")
	require.NotContains(t, rejected.Message, "PRIVATE KEY")
	waitReady(t, v1alpha1.GitTargetsResource, ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)
	waitReady(t, v1alpha1.GitTargetsResource, ns, "refused", metav1.ConditionFalse, v1alpha1.ReasonProviderNotReady)
	// The rule watches before alice writes: a ConfigMap the rule's first list found would be
	// the folder's first adoption, the committer's snapshot, unless its fact came first.
	waitReady(t, v1alpha1.WatchRulesResource, ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)

	createConfigMaps(t, clientFor(t, "alice").CoreV1().ConfigMaps(ns), "over-ssh")
	log := func(branch string) string {
		out, _ := exec.Command("git", "--git-dir", m.repoDir, "log", "--format=%an|%s", branch, "--").CombinedOutput()
		return string(out)
	}
	require.True(t, poll(60*time.Second, func() bool { return strings.Contains(log("target"), "alice|create configmaps e2e-ssh/over-ssh") }),
		"alice's create must reach the repository over SSH: %s", log("target"))
	require.Contains(t, strings.Join(server.Execs(), "\n"), "git-receive-pack")
	require.Empty(t, m.git(t, "branch", "--list", "refused"), "nothing of the refused provider reaches the repository")
}
