package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/attribution"
)

// TestSecretsMirroredEncrypted: a GitTarget with an age recipient mirrors alice's Secrets as
// SOPS documents. The real sops CLI, built from its module, decrypts every committed version
// to the data the cluster held then; a restart and a hand-over of the whole state (after
// carol's commit in the folder) write nothing; no value written appears in the remote's
// objects, Redis, or kubescribe's log; and the folder, decrypted with the age identity as
// Flux's kustomize-controller would, equals the cluster's Secrets.
func TestSecretsMirroredEncrypted(t *testing.T) {
	ctx := context.Background()
	sops := buildSops(t)
	identity, err := age.GenerateX25519Identity()
	require.NoError(t, err)

	ns := "e2e-secrets"
	m := setUpTarget(t, env, ns, "", []string{"alice"}, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create", "update", "delete", "get", "list"}},
	})
	m.setFetchInterval(t, "1s") // carol's commit below is noticed at once
	u, err := dynamicFor(t, "admin").Resource(v1alpha1.GitTargetsResource).Namespace(ns).Patch(ctx, "target", types.MergePatchType,
		[]byte(`{"spec":{"encryption":{"age":["`+identity.Recipient().String()+`"]}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	waitReady(t, v1alpha1.GitTargetsResource, ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady, u.GetGeneration())
	createOn(t, env.AdminConfig, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "rule", Namespace: ns},
		Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"},
			// ConfigMaps too: the webhook must leave them to the audit events.
			Rules: []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}}}},
	})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady)

	// Authors, as a user turns them on (docs/install.md#secret-authors): kubescribe gets a
	// digest key and manages the attribution webhook, which, authors coming from audit events,
	// covers the watched Secrets only; a Secret's create or update is credited by the candidate
	// with its keyed digest (its Metadata-level audit event names no post-write resourceVersion).
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	env.SecretDigestKey = []byte(hex.EncodeToString(key))
	require.NoError(t, env.StopKubescribe())
	env.ManageAttributionWebhook = true
	require.NoError(t, env.StartKubescribe(ctx))
	t.Cleanup(func() {
		env.SecretDigestKey, env.ManageAttributionWebhook = nil, false
		require.NoError(t, env.StopKubescribe())
		require.NoError(t, env.RemoveAttributionWebhook(context.Background()))
		require.NoError(t, env.StartKubescribe(context.Background()))
	})
	admin, err := kubernetes.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	// Its rules name Secrets, and its namespaceSelector takes in the watched namespace.
	var rules string
	require.True(t, poll(60*time.Second, func() bool {
		vwc, err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		b, _ := json.Marshal(vwc.Webhooks[0].Rules)
		rules = string(b)
		return strings.Contains(rules, `"secrets"`) && slices.Contains(vwc.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values, ns)
	}), "kubescribe never registered the webhook for the Secrets of %s: %s", ns, rules)
	require.NotContains(t, rules, "configmaps", "the webhook of an audit cluster covers Secrets only")
	// Probed with dry runs, which mirror nothing.
	waitAttributionWebhookFor(t, env, ns, func(ctx context.Context, kube kubernetes.Interface) error {
		_, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})

	alice, err := kubernetes.NewForConfig(env.UserConfig("alice"))
	require.NoError(t, err)
	secrets := alice.CoreV1().Secrets(ns)
	var values []string // every value written: none may reach Git, Redis or the log
	value := func(what string) string {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		v := what + "-" + hex.EncodeToString(b)
		values = append(values, v)
		return v
	}
	file := ns + "/core/secrets/db.yaml"
	// committed waits for the next commit of main that touches file and returns it.
	last := ""
	committed := func(what string) string {
		t.Helper()
		var sha string
		require.True(t, poll(90*time.Second, func() bool {
			out, err := exec.Command("git", "--git-dir", m.repoDir, "log", "-1", "--format=%H", "main", "--", file).Output()
			sha = strings.TrimSpace(string(out))
			return err == nil && sha != "" && sha != last
		}), "no commit of %s for %s", file, what)
		last = sha
		return sha
	}
	// decryptsTo checks that the file at commit sha, decrypted by sops, holds data.
	decryptsTo := func(sha string, data map[string][]byte) {
		t.Helper()
		enc := m.git(t, "show", sha+":"+file)
		require.Contains(t, enc, "sops:")
		require.Contains(t, enc, identity.Recipient().String(), "the sops block names the recipient")
		require.Contains(t, enc, "kind: Secret")
		require.Contains(t, enc, "name: db", "metadata stays readable")
		got := decryptSecret(t, sops, identity, []byte(enc))
		require.Equal(t, data, got.Data)
		require.Equal(t, corev1.SecretTypeOpaque, got.Type)
	}

	created, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db"},
		StringData: map[string]string{"password": value("create")}}, metav1.CreateOptions{})
	require.NoError(t, err)
	decryptsTo(committed("create"), created.Data)
	// Another Secret, kept: the round trip below decrypts it.
	_, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "api"},
		Data: map[string][]byte{"token": []byte(value("token")), "ca.crt": []byte(value("ca"))}}, metav1.CreateOptions{})
	require.NoError(t, err)

	created.Data = map[string][]byte{"password": []byte(value("update")), "user": []byte(value("user"))}
	updated, err := secrets.Update(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)
	decryptsTo(committed("update"), updated.Data)
	// Every Secret of the namespace is mirrored, the GitProvider's credentials too (the rule
	// selects them all): three files (no ConfigMap: the control plane runs no controller-manager
	// to publish kube-root-ca.crt).
	require.True(t, poll(60*time.Second, func() bool { return len(m.files(t)) == 3 }), "files: %v", m.files(t))

	// A restart writes nothing: the Secrets are as the last push left them.
	// The gauges count every stream of the stack: a change another test left to be replayed
	// after a restart waits up to the resume grace for its audit fact.
	settled := func() {
		t.Helper()
		require.True(t, poll(attribution.DefaultResumeGrace+60*time.Second, func() bool {
			return stackMetric(t, env, "kubescribe_attribution_pending_changes")+stackMetric(t, env, "kubescribe_git_pending_changes") == 0
		}), "kubescribe still holds changes")
	}
	settled()
	tip := m.git(t, "rev-parse", "main")
	require.NoError(t, env.StopKubescribe())
	require.NoError(t, env.StartKubescribe(ctx))
	waitReady(t, v1alpha1.WatchRulesResource, ns, "rule", metav1.ConditionTrue, v1alpha1.ReasonReady)
	require.True(t, poll(60*time.Second, func() bool {
		return stackMetric(t, env, `kubescribe_watch_sealed_total{cluster="local",resource="secrets",result="sealed"}`) >= 2
	}), "the restarted stream handed its Secrets over")
	settled()
	require.Equal(t, tip, m.git(t, "rev-parse", "main"), "a restart made a commit")

	// Carol's commit elsewhere in the folder: the stream hands its whole state over again,
	// and writes nothing of the Secrets.
	sealedBefore := stackMetric(t, env, `kubescribe_watch_sealed_total{cluster="local",resource="secrets",result="sealed"}`)
	carol := m.carolCommits(t, "carol's notes", map[string]string{"NOTES.md": "notes\n"})
	require.True(t, poll(60*time.Second, func() bool {
		return stackMetric(t, env, `kubescribe_watch_sealed_total{cluster="local",resource="secrets",result="sealed"}`) >= sealedBefore+2
	}), "carol's commit did not have the stream hand its state over")
	settled()
	require.Equal(t, carol, m.git(t, "rev-parse", "main"), "a hand-over of unchanged Secrets made a commit")

	// Flux's round trip: the folder, decrypted, is the cluster's Secrets.
	live, err := secrets.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, live.Items, 3)
	for _, want := range live.Items {
		enc := m.git(t, "show", "main:"+ns+"/core/secrets/"+want.Name+".yaml")
		got := decryptSecret(t, sops, identity, []byte(enc))
		require.Equal(t, want.Data, got.Data, want.Name)
		require.Equal(t, want.Type, got.Type, want.Name)
		require.Equal(t, want.Name, got.Name)
		require.Equal(t, ns, got.Namespace)
	}

	require.NoError(t, secrets.Delete(ctx, "db", metav1.DeleteOptions{}))
	committed("delete")
	require.NotContains(t, m.files(t), file)

	// Authors: every change is alice's, creates and updates by their candidates' keyed digests,
	// the delete by its fact's uid. The GitProvider's Secret, there before the rule, is the
	// committer's snapshot.
	lines := m.changeLines(t, 0)
	t.Logf("change lines: %q", lines)
	for _, c := range lines {
		if strings.Contains(c, ns+"/git-credentials ") {
			require.True(t, strings.HasPrefix(c, "kubescribe|create "), "%s", c)
			continue
		}
		require.True(t, strings.HasPrefix(c, "alice|"), "%s", c)
	}
	require.Len(t, lines, 5)

	// No value anywhere it must not be: every object of the remote, Redis, kubescribe's log.
	objects := m.git(t, "cat-file", "--batch-all-objects", "--batch")
	rdb := redis.NewClient(&redis.Options{Addr: env.RedisAddr})
	defer rdb.Close()
	keyspace := dumpRedis(t, rdb)
	logText, err := os.ReadFile(env.LogPath)
	require.NoError(t, err)
	for _, v := range values {
		for where, text := range map[string]string{"the remote's objects": objects, "Redis": keyspace, "kubescribe's log": string(logText)} {
			require.NotContains(t, text, v, "a Secret value in %s", where)
			// The declared form holds data base64-encoded: that form neither.
			require.NotContains(t, text, base64.StdEncoding.EncodeToString([]byte(v)), "a Secret value, base64-encoded, in %s", where)
		}
	}
}

// buildSops builds the sops CLI from the module kubescribe's go.mod requires.
func buildSops(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sops")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/getsops/sops/v3/cmd/sops").CombinedOutput()
	require.NoError(t, err, "go build sops: %s", out)
	return bin
}

// decryptSecret decrypts a SOPS document with the sops CLI and identity, as Flux's
// kustomize-controller would, and reads the Secret it holds.
func decryptSecret(t *testing.T, sops string, identity *age.X25519Identity, enc []byte) *corev1.Secret {
	t.Helper()
	cmd := exec.Command(sops, "decrypt", "--input-type", "yaml", "--output-type", "yaml", "/dev/stdin")
	cmd.Env = append(os.Environ(), "SOPS_AGE_KEY="+identity.String())
	cmd.Stdin = bytes.NewReader(enc)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	plain, err := cmd.Output()
	require.NoError(t, err, "sops decrypt: %s", stderr.String())
	var s corev1.Secret
	require.NoError(t, yaml.UnmarshalStrict(plain, &s), "%s", plain)
	return &s
}

// dumpRedis returns every key of rdb with its value, as text.
func dumpRedis(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		b.WriteString(key + "\n")
		typ, err := rdb.Type(ctx, key).Result()
		require.NoError(t, err)
		var v any
		switch typ {
		case "string":
			v, err = rdb.Get(ctx, key).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, key).Result()
		case "list":
			v, err = rdb.LRange(ctx, key, 0, -1).Result()
		case "set":
			v, err = rdb.SMembers(ctx, key).Result()
		case "zset":
			v, err = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		case "stream":
			v, err = rdb.XRange(ctx, key, "-", "+").Result()
		}
		if err != nil && err != redis.Nil {
			require.NoError(t, err, key)
		}
		fmt.Fprintf(&b, "%v\n", v)
	}
	require.NoError(t, iter.Err())
	return b.String()
}
