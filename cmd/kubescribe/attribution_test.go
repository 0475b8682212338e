package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

func TestAttributionWebhookConfig(t *testing.T) {
	dir := t.TempDir()
	ca := writeCA(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))

	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"attribution-webhook-config", "--ca-file", ca, "--url", "https://10.0.0.5:9443", "--route", "prod",
		"--resource", "configmaps", "--resource", "apps/deployments:update,DELETE", "--exclude-namespace", "ops"}, &out, &errOut), errOut.String())
	var c admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, yaml.UnmarshalStrict(out.Bytes(), &c))
	require.Equal(t, "kubescribe-attribution", c.Name)
	w := c.Webhooks[0]
	require.Equal(t, "https://10.0.0.5:9443/validate/attribution/prod", *w.ClientConfig.URL)
	require.Equal(t, admissionregistrationv1.Ignore, *w.FailurePolicy)
	require.Equal(t, admissionregistrationv1.SideEffectClassNone, *w.SideEffects)
	require.Equal(t, admissionregistrationv1.Equivalent, *w.MatchPolicy)
	require.Equal(t, int32(2), *w.TimeoutSeconds)
	require.Equal(t, []string{"kube-system", "ops"}, w.NamespaceSelector.MatchExpressions[0].Values)
	var rules []string
	for _, r := range w.Rules {
		var ops []string
		for _, o := range r.Operations {
			ops = append(ops, string(o))
		}
		rules = append(rules, r.APIGroups[0]+"|"+strings.Join(r.Resources, ",")+"|"+strings.Join(ops, ","))
	}
	require.Equal(t, []string{
		"|configmaps|CREATE,DELETE,UPDATE", "|configmaps/scale|UPDATE",
		"apps|deployments|DELETE,UPDATE", "apps|deployments/scale|UPDATE",
	}, rules)

	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no resource":     {[]string{"--ca-file", ca, "--url", "https://h"}, "at least one --resource"},
		"bad operation":   {[]string{"--ca-file", ca, "--url", "https://h", "--resource", "configmaps:PATCH"}, `operation "PATCH" is not one of`},
		"bad resource":    {[]string{"--ca-file", ca, "--url", "https://h", "--resource", "a/b/c"}, "want [group/]resource"},
		"both":            {[]string{"--ca-file", ca, "--url", "https://h", "--service", "a/b", "--resource", "configmaps"}, "exactly one of"},
		"http":            {[]string{"--ca-file", ca, "--url", "http://h", "--resource", "configmaps"}, "want an https URL"},
		"bad service":     {[]string{"--ca-file", ca, "--service", "nope:99999", "--resource", "configmaps"}, "port must be a number"},
		"no ca":           {[]string{"--url", "https://h", "--resource", "configmaps"}, "--ca-file or --ca-from-secret is required"},
		"not a PEM":       {[]string{"--ca-file", notPEM, "--url", "https://h", "--resource", "configmaps"}, "holds no PEM certificate"},
		"bad route":       {[]string{"--ca-file", ca, "--url", "https://h", "--resource", "configmaps", "--route", "Prod_1"}, "must be a DNS label"},
		"extra arguments": {[]string{"--ca-file", ca, "--url", "https://h", "--resource", "configmaps", "x"}, "unexpected arguments"},
		"bad namespace":   {[]string{"--ca-file", ca, "--url", "https://h", "--resource", "configmaps", "--namespace", "Team_A"}, `--namespace "Team_A"`},
		"only excluded":   {[]string{"--ca-file", ca, "--url", "https://h", "--resource", "configmaps", "--namespace", "kubescribe"}, "every --namespace is excluded"},
	} {
		var out, errOut bytes.Buffer
		require.NotEqual(t, 0, run(append([]string{"attribution-webhook-config"}, tc.args...), &out, &errOut), name)
		require.Contains(t, errOut.String(), tc.want, name)
		require.Empty(t, out.String(), name)
	}
}

// --namespace narrows the webhook to those namespaces, less the excluded ones.
func TestAttributionWebhookConfigNamespaces(t *testing.T) {
	ca := writeCA(t, t.TempDir())
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"attribution-webhook-config", "--ca-file", ca, "--url", "https://h", "--resource", "secrets",
		"--namespace", "team-b", "--namespace", "team-a", "--namespace", "kubescribe"}, &out, &errOut), errOut.String())
	var c admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, yaml.UnmarshalStrict(out.Bytes(), &c))
	sel := c.Webhooks[0].NamespaceSelector.MatchExpressions
	require.Len(t, sel, 1)
	require.Equal(t, metav1.LabelSelectorOpIn, sel[0].Operator)
	require.Equal(t, []string{"team-a", "team-b"}, sel[0].Values)
}

// A managed cluster's apiserver authenticates with the token bound to --route, in the path.
func TestAttributionWebhookConfigPathToken(t *testing.T) {
	dir := t.TempDir()
	ca := writeCA(t, dir)
	tokens := filepath.Join(dir, "admission-token")
	require.NoError(t, os.WriteFile(tokens, []byte("local-tok\nprod-tok prod\n"), 0o600))
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"attribution-webhook-config", "--ca-file", ca, "--service", "kubescribe/kubescribe", "--route", "prod",
		"--token-file", tokens, "--resource", "configmaps"}, &out, &errOut), errOut.String())
	var c admissionregistrationv1.ValidatingWebhookConfiguration
	require.NoError(t, yaml.UnmarshalStrict(out.Bytes(), &c))
	require.Equal(t, "/validate/attribution/prod/"+reviewhttp.WebhookToken([]byte("prod-tok"), reviewhttp.WebhookAttribution), *c.Webhooks[0].ClientConfig.Service.Path)
	require.NotContains(t, out.String(), "prod-tok", "the secret itself never goes into a URL")

	out.Reset()
	errOut.Reset()
	require.Equal(t, 1, run([]string{"attribution-webhook-config", "--ca-file", ca, "--url", "https://h", "--route", "edge",
		"--token-file", tokens, "--resource", "configmaps"}, &out, &errOut))
	require.Contains(t, errOut.String(), `no token is bound to route "edge"`)
	require.NotContains(t, errOut.String(), "local-tok")
	require.NotContains(t, errOut.String(), "prod-tok")
}
