package e2e

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/test/stack"
)

// An apiserver without apiregistration.k8s.io: mirroring works, and kubescribe's log says once
// why it does not watch APIServices (and that it watches CRDs).
//
// It starts a second stack of its own (a control plane costs seconds, affordable once).
// kube-apiserver refuses --runtime-config=apiregistration.k8s.io/v1=false, so kubescribe
// reaches this one through hidingProxy, which hides the group as such a server would.
func TestWithoutAPIRegistration(t *testing.T) {
	ctx := context.Background()
	s := startStack(t, stack.Options{
		KubescribeConfig: func(cfg *rest.Config) (*rest.Config, error) {
			return startHidingProxy(t, cfg, "apiregistration.k8s.io")
		},
	})

	// The premise: through the proxy, the apiserver does not serve apiregistration.k8s.io.
	proxied, err := startHidingProxy(t, s.UserConfig("kubescribe"), "apiregistration.k8s.io")
	require.NoError(t, err)
	seen, err := discovery.NewDiscoveryClientForConfigOrDie(proxied).ServerGroups()
	require.NoError(t, err)
	require.NotEmpty(t, seen.Groups)
	for _, g := range seen.Groups {
		require.NotEqual(t, "apiregistration.k8s.io", g.Name, "the proxy still shows apiregistration.k8s.io")
	}

	const ns = "e2e-no-apiregistration"
	m := newMirrorOn(t, s, ns, "", []string{"alice"}, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "update", "patch", "delete"}},
	}, []v1alpha1.ResourceRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}}})

	alice, err := kubernetes.NewForConfig(s.UserConfig("alice"))
	require.NoError(t, err)
	_, err = alice.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Equal(t, "alice|create configmaps e2e-no-apiregistration/settings", waitAuthor(t, m, objectFile(m, "", "configmaps", "settings")))

	// Said once, and never retried: a refresh later (the rule's re-checks, the CRD trigger)
	// does not repeat it. The count is read after the mirrored change, so at least the start
	// and one rule evaluation are behind it.
	require.Equal(t, 1, countLogLines(t, s.LogPath, "not watching for discovery changes", "apiservices"))
	require.Equal(t, 1, countLogLines(t, s.LogPath, "watching for discovery changes", "customresourcedefinitions"))
	log, err := os.ReadFile(s.LogPath)
	require.NoError(t, err)
	require.False(t, strings.Contains(string(log), `"resource":"apiregistration.k8s.io/v1, Resource=apiservices","err"`),
		"something tried to watch APIServices")
}
