package authz

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// TestDeployedWebhookMatchesTheGenerated: deploy/base/webhook.yaml is WebhookConfiguration
// with a reference to the Service kubescribe-admission and no caBundle (the overlays add it),
// so the two cannot drift apart.
func TestDeployedWebhookMatchesTheGenerated(t *testing.T) {
	b, err := os.ReadFile("../../deploy/base/webhook.yaml")
	require.NoError(t, err)
	var deployed admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, yaml.UnmarshalStrict(b, &deployed))

	port := int32(9443)
	path := Path
	want := WebhookConfiguration(admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
		Namespace: "kubescribe", Name: "kubescribe-admission", Path: &path, Port: &port,
	}})
	require.Equal(t, want, &deployed)

	require.Len(t, want.Webhooks, 3)
	for i, w := range want.Webhooks {
		require.Equal(t, admissionregistrationv1.SideEffectClassNoneOnDryRun, *w.SideEffects)
		require.LessOrEqual(t, *w.TimeoutSeconds, int32(10))
		if i == 2 {
			require.Equal(t, SecretRefsWebhookName, w.Name)
			require.Equal(t, SecretRefsPath, *w.ClientConfig.Service.Path)
			require.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, w.Rules[0].Operations)
			require.Equal(t, []string{"gitproviders", "gittargets"}, w.Rules[0].Resources)
			require.Equal(t, admissionregistrationv1.Ignore, *w.FailurePolicy, "the controller is the real gate")
			continue
		}
		require.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, w.Rules[0].Operations)
		require.Len(t, w.MatchConditions, 1)
		if i == 0 {
			require.Equal(t, SubmitterWebhookName, w.Name)
			require.Equal(t, admissionregistrationv1.Ignore, *w.FailurePolicy, "a plain CommitRequest never waits for kubescribe")
		} else {
			require.Equal(t, AuthorWebhookName, w.Name)
			require.Equal(t, admissionregistrationv1.Fail, *w.FailurePolicy, "an assertion kubescribe cannot check is refused")
		}
	}
}

// The token a managed cluster's webhook carries in its path stays at the end of the Secret
// reference entry's path.
func TestSecretRefsEntryKeepsThePathToken(t *testing.T) {
	url := "https://kubescribe.example:9443" + Path + "/tok"
	cfg := WebhookConfiguration(admissionregistrationv1.WebhookClientConfig{URL: &url})
	require.Equal(t, "https://kubescribe.example:9443"+Path+"/tok", *cfg.Webhooks[0].ClientConfig.URL)
	require.Equal(t, "https://kubescribe.example:9443"+SecretRefsPath+"/tok", *cfg.Webhooks[2].ClientConfig.URL)
}
