package app

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/reviewhttp"
)

// The managed attribution webhook configuration carries the attribution webhook's token
// derived from the first admission secret bound to the cluster, in its URL path: a managed cluster's apiserver presents no client certificate.
func TestAttributionWebhookCarriesThePathToken(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o600))
	tokens := filepath.Join(dir, "admission-token")
	require.NoError(t, os.WriteFile(tokens, []byte("tenant-tok tenant-a\nlocal-tok\n"), 0o600))
	o := validOptions()
	o.AttributionWebhookURL, o.AttributionWebhookCAFile = "https://10.0.0.5:9443", ca
	a := &App{opts: o, log: slog.New(slog.DiscardHandler)}
	w, err := a.attributionWebhook()
	require.NoError(t, err)
	require.Equal(t, "https://10.0.0.5:9443/validate/attribution/local", *w.ClientConfig.URL, "no token file: no token")

	a.opts.AdmissionTokenFile = tokens
	w, err = a.attributionWebhook()
	require.NoError(t, err)
	require.Equal(t, "https://10.0.0.5:9443/validate/attribution/local/"+reviewhttp.WebhookToken([]byte("local-tok"), reviewhttp.WebhookAttribution), *w.ClientConfig.URL,
		"the attribution webhook's own token, never the secret, which the CommitRequest webhook accepts as a bearer token")
}

// The admission listener's tokens must fit a URL path; errors name the line, never the token.
func TestAdmissionAuthRefusesTokensUnfitForAPath(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "admission-token")
	require.NoError(t, os.WriteFile(tokens, []byte("fine-token\nsecret/part tenant-a\n"), 0o600))
	o := validOptions()
	o.AdmissionTokenFile = tokens
	o.Registry = prometheus.NewRegistry()
	a := &App{opts: o, log: slog.New(slog.DiscardHandler)}
	_, err := a.admissionAuth()
	require.ErrorContains(t, err, "line 2: a token may hold only letters")
	require.NotContains(t, err.Error(), "secret")

	require.NoError(t, os.WriteFile(tokens, []byte("fine-token\n"), 0o600))
	a.opts.Registry = prometheus.NewRegistry()
	auth, err := a.admissionAuth()
	require.NoError(t, err)
	require.Len(t, auth.Callers.Tokens, 1)
	require.Equal(t, []string{"local"}, auth.Callers.Tokens[0].Routes)
}
