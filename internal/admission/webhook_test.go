package admission

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The Service and URL of a webhook kubescribe serves, shared by the managed configurations and
// the CLI's: a default port and path, and a clear reason for what is refused.
func TestServiceReferenceAndWebhookURL(t *testing.T) {
	ref, err := ServiceReference("kubescribe/kubescribe", "/p")
	require.NoError(t, err)
	require.Equal(t, "kubescribe", ref.Namespace)
	require.Equal(t, "kubescribe", ref.Name)
	require.Equal(t, int32(DefaultServicePort), *ref.Port)
	require.Equal(t, "/p", *ref.Path)
	ref, err = ServiceReference("ns/svc:8443", "/p")
	require.NoError(t, err)
	require.Equal(t, int32(8443), *ref.Port)
	for s, want := range map[string]string{
		"ns/svc:x":     "the port must be a number from 1 to 65535",
		"ns/svc:70000": "the port must be a number from 1 to 65535",
		"svc":          "want namespace/name[:port]",
		"ns/a/b":       "want namespace/name[:port]",
		"/svc":         "want namespace/name[:port]",
	} {
		_, err := ServiceReference(s, "/p")
		require.EqualError(t, err, want, s)
	}

	u, ok := WebhookURL("https://10.0.0.5:9443", "/p")
	require.True(t, ok)
	require.Equal(t, "https://10.0.0.5:9443/p", u)
	u, ok = WebhookURL("https://h/own", "/p")
	require.True(t, ok)
	require.Equal(t, "https://h/own", u)
	for _, bad := range []string{"http://h", "https://", "https://u@h", "https://h?q=1", "https://h#f", "::"} {
		_, ok := WebhookURL(bad, "/p")
		require.False(t, ok, bad)
	}
}
