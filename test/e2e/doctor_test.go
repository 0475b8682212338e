package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/deploy"
	"github.com/kubescribe/kubescribe/test/stack"
)

// doctorReport is what the test reads of `kubescribe doctor --format json`.
type doctorReport struct {
	Checks []struct {
		Name     string `json:"name"`
		Verdict  string `json:"verdict"`
		Summary  string `json:"summary"`
		Fix      string `json:"fix"`
		Findings []struct {
			Verdict string `json:"verdict"`
			Object  string `json:"object"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
			Fix     string `json:"fix"`
		} `json:"findings"`
	} `json:"checks"`
	Failed int `json:"failed"`
}

// TestDoctor: `kubescribe doctor` on the real stack, kubescribe running as the installed
// ServiceAccount with only the install's grants and what `kubescribe rbac` prints for one
// mirror. On that healthy setup every check passes: the apiserver delivers the batch of the
// dry-run write doctor makes, /metrics is read with a token doctor requests for the
// ServiceAccount bound to kubescribe-metrics-reader. Then a WatchRule selects a resource
// kubescribe may not list, a GitProvider points at a URL where no Git server answers, and
// Redis stops: doctor names each, in its check, and exits 1.
func TestDoctor(t *testing.T) {
	ctx := context.Background()
	const ns = "e2e-doctor"
	admin := clientFor(t, "admin")

	require.NoError(t, env.StopKubescribe())
	t.Cleanup(func() {
		require.NoError(t, env.StartRedis())
		require.NoError(t, env.StopKubescribe())
		require.NoError(t, env.StartKubescribe(context.Background()))
	})
	setUpTarget(t, env, ns, "", []string{"alice"}, configMapWriters)
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps", Namespace: ns},
		Spec:       v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"}, Rules: watchConfigMaps},
	})
	// The grant `kubescribe rbac` prints, read from the cluster: this namespace's Role and
	// RoleBinding only, so that no other test's rules widen the identity.
	adminKubeconfig := kubeconfigFor(t, "admin")
	grant := runCLI(t, "rbac", "--kubeconfig", adminKubeconfig)
	require.Equal(t, 0, grant.code, "stderr: %s", grant.stderr)
	printed, err := deploy.Objects([]byte(grant.stdout))
	require.NoError(t, err)
	var ours []*unstructured.Unstructured
	for _, o := range printed {
		if o.GetNamespace() == ns {
			ours = append(ours, o)
		}
	}
	require.Len(t, ours, 2, "a Role and its RoleBinding for %s in:\n%s", ns, grant.stdout)
	require.NoError(t, stack.Apply(ctx, env.AdminConfig, stream(t, ours)))
	waitAllowed(t, admin, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "watch", Resource: "configmaps"})
	require.NoError(t, env.StartKubescribeAs(ctx, serviceAccountConfig(t, admin)))
	// Created while kubescribe (its webhook) was down: vouched for now.
	vouchFor(t, v1alpha1.GitProvidersResource, ns, "repo")
	waitReady(t, v1alpha1.WatchRulesResource, ns, "configmaps", metav1.ConditionTrue, v1alpha1.ReasonReady)
	waitReady(t, v1alpha1.GitTargetsResource, ns, "target", metav1.ConditionTrue, v1alpha1.ReasonReady)

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, env.CA.CertPEM, 0o600))
	doctor := func(t *testing.T) (int, *doctorReport, string) {
		t.Helper()
		// kubescribe runs in the test's process, not in a Pod: doctor reaches its listeners
		// by URL, and is told its identity.
		r := runCLI(t, "doctor", "--kubeconfig", adminKubeconfig, "-n", ns, "--format", "json",
			"--ops-url", env.OpsURL, "--metrics-url", env.MetricsURL, "--metrics-ca-file", caFile,
			"--service-account", installedSANamespace+"/"+installedSAName, "--audit-wait", "30s")
		var report doctorReport
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &report), "stdout: %s\nstderr: %s", r.stdout, r.stderr)
		return r.code, &report, r.stdout
	}
	verdicts := func(r *doctorReport) map[string]string {
		out := map[string]string{}
		for _, c := range r.Checks {
			out[c.Name] = c.Verdict
		}
		return out
	}

	// (1) Healthy: nothing wrong, exit 0.
	began := time.Now()
	code, report, out := doctor(t)
	t.Logf("doctor on a healthy setup took %s", time.Since(began).Round(time.Millisecond))
	require.Equal(t, 0, code, out)
	require.Equal(t, map[string]string{"kubescribe": "ok", "redis": "ok", "audit-delivery": "ok", "audit-routes": "ok",
		"rbac": "ok", "rules": "ok", "git": "ok"}, verdicts(report), out)
	for _, c := range report.Checks {
		switch c.Name {
		case "audit-delivery":
			require.Contains(t, c.Summary, "(route local)")
		case "rbac":
			// list and watch of ConfigMaps, get of the GitProvider's Secret.
			require.Equal(t, "ServiceAccount kubescribe/kubescribe may do the 3 requests the rules and Git credentials need", c.Summary)
		}
	}

	// (2) Broken: a WatchRule on a resource kubescribe may not list, a GitProvider whose URL
	// no Git server answers (and a GitTarget on it), Redis gone.
	create(t, v1alpha1.WatchRulesResource, ns, &v1alpha1.WatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "WatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "podtemplates", Namespace: ns},
		Spec: v1alpha1.WatchRuleSpec{TargetRef: v1alpha1.LocalObjectReference{Name: "target"},
			Rules: []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"podtemplates"}}}},
	})
	create(t, v1alpha1.GitProvidersResource, ns, &v1alpha1.GitProvider{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitProvider"},
		ObjectMeta: metav1.ObjectMeta{Name: "nowhere", Namespace: ns},
		Spec:       v1alpha1.GitProviderSpec{URL: "https://127.0.0.1:1/nothing.git"},
	})
	create(t, v1alpha1.GitTargetsResource, ns, &v1alpha1.GitTarget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "GitTarget"},
		ObjectMeta: metav1.ObjectMeta{Name: "nowhere", Namespace: ns},
		Spec:       v1alpha1.GitTargetSpec{ProviderRef: v1alpha1.LocalObjectReference{Name: "nowhere"}, Branch: "main"},
	})
	t.Cleanup(func() {
		// The shared stack's later tests need not see these fail.
		dyn := dynamicFor(t, "admin")
		_ = dyn.Resource(v1alpha1.WatchRulesResource).Namespace(ns).Delete(context.Background(), "podtemplates", metav1.DeleteOptions{})
		_ = dyn.Resource(v1alpha1.GitTargetsResource).Namespace(ns).Delete(context.Background(), "nowhere", metav1.DeleteOptions{})
		_ = dyn.Resource(v1alpha1.GitProvidersResource).Namespace(ns).Delete(context.Background(), "nowhere", metav1.DeleteOptions{})
	})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "podtemplates", metav1.ConditionFalse, v1alpha1.ReasonWatchFailed)
	waitReady(t, v1alpha1.GitProvidersResource, ns, "nowhere", metav1.ConditionFalse, v1alpha1.ReasonRemoteUnreachable)
	require.NoError(t, env.StopRedis())

	code, report, out = doctor(t)
	require.Equal(t, 1, code, out)
	require.Equal(t, "fail", verdicts(report)["rbac"], out)
	require.Equal(t, "fail", verdicts(report)["git"], out)
	require.Equal(t, "fail", verdicts(report)["redis"], out)
	// Redis is not needed to read /metrics. (Whether a batch was answered 503 depends on
	// whether one carried a fact: doctor's dry-run write makes none.)
	require.NotEqual(t, "skip", verdicts(report)["audit-delivery"], out)
	for _, c := range report.Checks {
		var found []string
		for _, f := range c.Findings {
			found = append(found, strings.Join([]string{f.Object, f.Reason, f.Message, f.Fix}, " | "))
		}
		all := strings.Join(found, "\n")
		switch c.Name {
		case "rbac":
			require.Contains(t, all, "ServiceAccount kubescribe/kubescribe may not list, watch podtemplates in namespace "+ns+", which WatchRule "+ns+"/podtemplates needs")
			require.Contains(t, c.Fix, "kubescribe rbac | kubectl apply -f -")
		case "rules":
			require.NotContains(t, all, "podtemplates", "a forbidden watch is the RBAC check's")
		case "git":
			require.Contains(t, all, "GitProvider "+ns+"/nowhere | RemoteUnreachable | ")
			require.Contains(t, all, "GitTarget "+ns+"/nowhere | ProviderNotReady | ")
			require.NotContains(t, all, "GitProvider "+ns+"/repo", "the working provider is not named")
		case "redis":
			require.Contains(t, all, "/readyz: redis: not answering")
		}
	}
}
