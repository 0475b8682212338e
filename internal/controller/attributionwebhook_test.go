package controller

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// testWebhookSync is an attributionWebhookSync of opts, on a fake clientset, that follows
// *streams; the apiserver reaches kubescribe at a URL, verified with a CA bundle.
func testWebhookSync(streams *[]watch.StreamSpec, opts AttributionWebhookOptions) (*attributionWebhookSync, *fake.Clientset) {
	url := "https://kubescribe.example:9443/validate/attribution/local"
	opts.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: []byte("ca")}
	kube := fake.NewSimpleClientset()
	return &attributionWebhookSync{kube: kube, log: slog.New(slog.DiscardHandler), streams: func() []watch.StreamSpec { return *streams }, opts: opts}, kube
}

// The webhook configuration follows the streams in force: created with their resources and
// operations, left alone while they stay, updated when they change, deleted when none is left.
func TestAttributionWebhookFollowsTheStreams(t *testing.T) {
	ctx := context.Background()
	var streams []watch.StreamSpec
	w, kube := testWebhookSync(&streams, AttributionWebhookOptions{ExcludeNamespaces: []string{"kubescribe"}})
	vwcs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	get := func() *admissionregistrationv1.ValidatingWebhookConfiguration {
		v, err := vwcs.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
		require.NoError(t, err)
		return v
	}

	require.NoError(t, w.sync(ctx)) // nothing watched: nothing registered
	_, err := vwcs.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err))

	cm := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	deploy := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	streams = []watch.StreamSpec{
		{GVR: cm, Namespace: "a", Operations: []watch.Op{watch.OpCreate}},
		{GVR: cm, Namespace: "b", Operations: []watch.Op{watch.OpDelete}},
		{GVR: deploy, Namespace: "a"},
	}
	require.NoError(t, w.sync(ctx))
	rules := get().Webhooks[0].Rules
	require.Len(t, rules, 3)
	require.Equal(t, []string{"configmaps"}, rules[0].Resources)
	require.Equal(t, []admissionregistrationv1.OperationType{"CREATE", "DELETE"}, rules[0].Operations)
	require.Equal(t, []string{"deployments"}, rules[1].Resources)
	require.Equal(t, []admissionregistrationv1.OperationType{"CREATE", "DELETE", "UPDATE"}, rules[1].Operations)
	require.Equal(t, []string{"deployments/scale"}, rules[2].Resources)
	// Only the watched namespaces are sent.
	sel := get().Webhooks[0].NamespaceSelector.MatchExpressions[0]
	require.Equal(t, metav1.LabelSelectorOpIn, sel.Operator)
	require.Equal(t, []string{"a", "b"}, sel.Values)

	// Unchanged streams: no write.
	before := len(kube.Actions())
	require.NoError(t, w.sync(ctx))
	for _, a := range kube.Actions()[before:] {
		require.Equal(t, "get", a.GetVerb())
	}

	// A CA bundle that rotates (self-managed TLS) is followed at the next sync.
	bundle := []byte("rotated ca")
	w.opts.CABundle = func() []byte { return bundle }
	require.NoError(t, w.sync(ctx))
	require.Equal(t, bundle, get().Webhooks[0].ClientConfig.CABundle)
	bundle = []byte("rotated again")
	require.NoError(t, w.sync(ctx))
	require.Equal(t, bundle, get().Webhooks[0].ClientConfig.CABundle)

	streams = streams[2:]
	require.NoError(t, w.sync(ctx))
	require.Len(t, get().Webhooks[0].Rules, 2)

	streams = nil
	require.NoError(t, w.sync(ctx))
	_, err = vwcs.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err))
}

// With SecretsOnly (authors from audit events), the webhook covers the watched Secrets and
// nothing else, and it is deleted when no Secret is watched, whatever else is.
func TestAttributionWebhookSecretsOnly(t *testing.T) {
	ctx := context.Background()
	cm := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	streams := []watch.StreamSpec{{GVR: cm, Namespace: "a"}, {GVR: secrets, Namespace: "a"}}
	w, kube := testWebhookSync(&streams, AttributionWebhookOptions{Secrets: true, SecretsOnly: true})
	vwcs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()

	require.NoError(t, w.sync(ctx))
	v, err := vwcs.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	require.NoError(t, err)
	var resources []string
	for _, r := range v.Webhooks[0].Rules {
		resources = append(resources, r.Resources...)
	}
	require.NotContains(t, resources, "configmaps")
	require.Contains(t, resources, "secrets")

	streams = streams[:1] // ConfigMaps only: nothing for the webhook
	require.NoError(t, w.sync(ctx))
	_, err = vwcs.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err))
}

// The webhook takes in the watched namespaces only, less the excluded ones; a stream of every
// namespace (a ClusterWatchRule without namespaces) takes in every one but the excluded.
func TestAttributionWebhookNamespaces(t *testing.T) {
	ctx := context.Background()
	cm := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	streams := []watch.StreamSpec{{GVR: cm, Namespace: "team-b"}, {GVR: cm, Namespace: "team-a"}, {GVR: cm, Namespace: "kubescribe"}}
	w, kube := testWebhookSync(&streams, AttributionWebhookOptions{ExcludeNamespaces: []string{"kubescribe"}})
	vwcs := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	selector := func() metav1.LabelSelectorRequirement {
		require.NoError(t, w.sync(ctx))
		v, err := vwcs.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
		require.NoError(t, err)
		require.Len(t, v.Webhooks[0].NamespaceSelector.MatchExpressions, 1)
		return v.Webhooks[0].NamespaceSelector.MatchExpressions[0]
	}
	require.Equal(t, metav1.LabelSelectorRequirement{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{"team-a", "team-b"}}, selector())

	streams = append(streams, watch.StreamSpec{GVR: cm}) // every namespace
	require.Equal(t, metav1.LabelSelectorRequirement{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "kubescribe"}}, selector())

	// Only an excluded namespace watched: no configuration.
	streams = streams[2:3]
	require.NoError(t, w.sync(ctx))
	_, err := vwcs.Get(ctx, admission.WebhookConfigurationName, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err))
}
