package hostileapi

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

// TestServerAnswersClientGo: client-go's discovery and dynamic clients read the server, and a
// namespaced list answers objects of any namespace.
func TestServerAnswersClientGo(t *testing.T) {
	s := Start(
		Resource{Version: "v1", Name: "configmaps", Kind: "ConfigMap", Objects: []Object{{Namespace: "a", Name: "ok"}, {Namespace: "..", Name: ".."}}},
		Resource{Group: ".github", Version: "v1", Name: "workflows", Kind: "Workflow", Objects: []Object{{Namespace: "..", Name: "evil"}}},
	)
	defer s.Close()
	kc, err := s.Kubeconfig()
	require.NoError(t, err)
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	require.NoError(t, err)
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	require.NoError(t, err)
	_, lists, err := dc.ServerGroupsAndResources()
	require.NoError(t, err)
	var names []string
	for _, l := range lists {
		for _, r := range l.APIResources {
			names = append(names, l.GroupVersion+"/"+r.Name)
		}
	}
	require.ElementsMatch(t, []string{"v1/configmaps", ".github/v1/workflows"}, names)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	l, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("a").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, l.Items, 2)
	require.Equal(t, "..", l.Items[1].GetNamespace())
	l, err = dyn.Resource(schema.GroupVersionResource{Group: ".github", Version: "v1", Resource: "workflows"}).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Equal(t, ".github/v1", l.Items[0].GetAPIVersion())
}
