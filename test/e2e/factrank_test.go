package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

// forgedEvent is a ResponseComplete audit event claiming that user wrote cm with verb, at
// stage time stage: what a holder of the local route's audit credential can post.
func forgedEvent(cm *corev1.ConfigMap, verb, user, auditID string, stage time.Time) map[string]any {
	meta := map[string]any{"name": cm.Name, "namespace": cm.Namespace, "uid": string(cm.UID), "resourceVersion": cm.ResourceVersion}
	ev := map[string]any{
		"level": "RequestResponse", "auditID": auditID, "stage": "ResponseComplete",
		"requestURI": "/api/v1/namespaces/" + cm.Namespace + "/configmaps/" + cm.Name, "verb": verb,
		"user":                     map[string]any{"username": user, "groups": []string{"system:authenticated"}},
		"objectRef":                map[string]any{"resource": "configmaps", "namespace": cm.Namespace, "name": cm.Name, "uid": string(cm.UID), "apiVersion": "v1"},
		"responseStatus":           map[string]any{"metadata": map[string]any{}, "code": 200},
		"requestObject":            map[string]any{"data": map[string]string{"k": "forged"}},
		"responseObject":           map[string]any{"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta, "data": cm.Data},
		"requestReceivedTimestamp": stage.UTC().Format(time.RFC3339Nano),
		"stageTimestamp":           stage.UTC().Format(time.RFC3339Nano),
	}
	if verb == "delete" {
		ev["responseObject"] = map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Success",
			"details": map[string]any{"name": cm.Name, "kind": "configmaps", "uid": string(cm.UID)}}
	}
	return ev
}

// Finding 4b of issue 23: a client-supplied timestamp decided which audit fact wins. alice
// creates a ConfigMap through the real apiserver; later, a batch posted with the local route's
// own audit token claims the same uid and resourceVersion (and a delete of it) for mallory,
// dated 1970. It is refused as evidence (counted); the fact store still holds alice's fact, so
// a GitTarget that adopts the namespace afterwards, and looks the object's fact up, credits
// alice, and nothing in Git names mallory.
func TestForgedOldFactNeverWins(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-factrank"
	m := newMirror(t, ns, "", []string{"alice"}, configMapWriters, watchConfigMaps)
	alice := clientFor(t, "alice")
	cm, err := alice.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"},
		Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-factrank/cfg"}, m.waitCommits(t, 1))

	// alice's fact is stored (her commit says so); mallory's batch arrives later.
	before := stackMetric(t, env, `kubescribe_attribution_facts_refused_total{reason="stale"}`)
	epoch := time.Unix(0, 0)
	batch, err := json.Marshal(map[string]any{"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "metadata": map[string]any{},
		"items": []any{forgedEvent(cm, "update", "mallory", "forged-update", epoch), forgedEvent(cm, "delete", "mallory", "forged-delete", epoch)}})
	require.NoError(t, err)
	code, err := post(t, auditClient(t, nil), env.Audit.URL, env.Audit.Token, batch)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "the batch is well-formed; its facts are refused, not the batch")
	require.True(t, poll(10*time.Second, func() bool {
		return stackMetric(t, env, `kubescribe_attribution_facts_refused_total{reason="stale"}`) >= before+2
	}), "both forged facts are counted as refused")

	// A second GitTarget adopts the namespace: its first list finds cfg and looks its fact up.
	admin, err := kubernetes.NewForConfig(env.AdminConfig)
	require.NoError(t, err)
	late := &mirror{ns: ns, repo: ns + "-late"}
	late.repoDir, err = env.Git.CreateRepo(late.repo)
	require.NoError(t, err)
	create(t, v1alpha1.GitProvidersResource, ns, &v1alpha1.GitProvider{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: ns},
		Spec: v1alpha1.GitProviderSpec{URL: env.Git.URL(late.repo), SecretRef: &v1alpha1.LocalObjectReference{Name: "git-credentials"},
			CommitWindow: &metav1.Duration{Duration: time.Second}},
	})
	create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: ns},
		Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "late"}, Branch: "main"},
	})
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: ns},
		Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "late"}, Rules: watchConfigMaps},
	})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "late", metav1.ConditionTrue, v1alpha1.ReasonReady)
	got := late.waitCommits(t, 1)
	require.Equal(t, "alice|alice@users.kubescribe.invalid|kubescribe|create configmaps e2e-factrank/cfg", got[0])

	// The object is alive, and nothing in either repository names mallory.
	_, err = admin.CoreV1().ConfigMaps(ns).Get(ctx, "cfg", metav1.GetOptions{})
	require.NoError(t, err)
	for _, r := range []*mirror{m, late} {
		log := r.git(t, "log", "--format=%an %ae %B", "main")
		require.False(t, strings.Contains(log, "mallory"), "%s: %s", r.repo, log)
	}
}
