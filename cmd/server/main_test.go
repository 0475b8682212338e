package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseFlags(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("s3cret\n"), 0o600))
	opts, logger, err := parseFlags([]string{"--redis-addr=127.0.0.1:6379", "--redis-password-file=" + pw, "--redis-key-prefix=team:ks:", "--log-format=text"})
	require.NoError(t, err)
	require.NotNil(t, logger)
	require.Equal(t, "s3cret", opts.RedisPassword)
	require.Equal(t, "team:ks:", opts.RedisKeyPrefix) // validated and trimmed by app.Options
	require.Equal(t, "local", opts.ClusterName)

	key := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef\n"), 0o600))
	opts, _, err = parseFlags([]string{"--secret-digest-key-file=" + key})
	require.NoError(t, err)
	require.Equal(t, []byte("0123456789abcdef0123456789abcdef"), opts.SecretDigestKey, "read into memory, the newline trimmed")

	// The Sentinels' credentials are their own: the master's password is not sent to them.
	spw := filepath.Join(t.TempDir(), "sentinel-pw")
	require.NoError(t, os.WriteFile(spw, []byte("s3ntinel\r\n"), 0o600))
	opts, _, err = parseFlags([]string{"--redis-addr=10.0.0.1:26379", "--redis-master-name=m", "--redis-password-file=" + pw,
		"--redis-sentinel-username=ks", "--redis-sentinel-password-file=" + spw})
	require.NoError(t, err)
	require.Equal(t, "ks", opts.RedisSentinelUsername)
	require.Equal(t, "s3ntinel", opts.RedisSentinelPassword, "read into memory, the line end trimmed")
	require.Equal(t, "s3cret", opts.RedisPassword)
	require.False(t, opts.RedisSentinelInsecureAllowUnauthenticated)
	opts, _, err = parseFlags([]string{"--redis-sentinel-insecure-allow-unauthenticated"})
	require.NoError(t, err)
	require.True(t, opts.RedisSentinelInsecureAllowUnauthenticated)

	for _, bad := range [][]string{{"--log-format=xml"}, {"--log-level=loud"}, {"stray"}, {"--redis-password-file=/nonexistent"}, {"--secret-digest-key-file=/nonexistent"},
		{"--redis-sentinel-password-file=/nonexistent"}} {
		_, _, err := parseFlags(bad)
		require.Error(t, err, bad)
	}
}

func TestRunRefusesInvalidOptions(t *testing.T) {
	// No Redis, no TLS, no audit authentication: every problem is named, nothing starts.
	require.Equal(t, 1, run([]string{"--redis-key-prefix=kube*"}))
	require.Equal(t, 2, run([]string{"--no-such-flag"}))
}

func TestParseAdmissionFlags(t *testing.T) {
	opts, _, err := parseFlags([]string{"--redis-addr=r:6379"})
	require.NoError(t, err)
	require.Equal(t, ":9443", opts.AdmissionListenAddress)
	require.Equal(t, 24*time.Hour, opts.CommitRequestTTL)

	opts, _, err = parseFlags([]string{"--redis-addr=r:6379", "--admission-listen-address=", "--admission-tls-cert-file=a.crt",
		"--admission-tls-private-key-file=a.key", "--admission-client-ca-file=ca.crt", "--admission-max-body-bytes=1024",
		"--verdict-ttl=1h", "--commit-request-ttl=0"})
	require.NoError(t, err)
	require.Empty(t, opts.AdmissionListenAddress)
	require.Equal(t, "a.crt", opts.AdmissionTLSCertFile)
	require.Equal(t, "a.key", opts.AdmissionTLSKeyFile)
	require.Equal(t, "ca.crt", opts.AdmissionClientCAFile)
	require.EqualValues(t, 1024, opts.AdmissionMaxBodyBytes)
	require.Equal(t, time.Hour, opts.VerdictTTL)
	require.Zero(t, opts.CommitRequestTTL)
}

func TestParseCredentialRouteFlags(t *testing.T) {
	opts, _, err := parseFlags([]string{"--redis-addr=r:6379",
		"--audit-client-cert-routes=kube-apiserver-a=tenant-a", "--audit-client-cert-routes=kube-apiserver-b=tenant-b,tenant-c",
		"--admission-client-cert-routes=webhook-a=tenant-a", "--admission-token-file=tokens", "--admission-insecure-allow-unauthenticated"})
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"kube-apiserver-a": {"tenant-a"}, "kube-apiserver-b": {"tenant-b", "tenant-c"}}, opts.AuditClientCertRoutes)
	require.Equal(t, map[string][]string{"webhook-a": {"tenant-a"}}, opts.AdmissionClientCertRoutes)
	require.Equal(t, "tokens", opts.AdmissionTokenFile)
	require.True(t, opts.AdmissionInsecureAllowUnauthenticated)

	_, _, err = parseFlags([]string{"--redis-addr=r:6379", "--audit-client-cert-routes=no-route"})
	require.ErrorContains(t, err, "--audit-client-cert-routes")

	opts, _, err = parseFlags([]string{"--redis-addr=r:6379", "--admission-client-cert-webhooks=cn=a=attribution",
		"--admission-client-cert-webhooks=kube-apiserver=commitrequests,attribution"})
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"cn=a": {"attribution"}, "kube-apiserver": {"commitrequests", "attribution"}}, opts.AdmissionClientCertWebhooks)
	_, _, err = parseFlags([]string{"--redis-addr=r:6379", "--admission-client-cert-webhooks=cn=audit"})
	require.ErrorContains(t, err, `webhook "audit"`)
}

// Remote audit routes are bound to namespaces by a repeatable flag; a route bound twice, or a
// binding without namespaces, is refused.
func TestParseAuditRouteNamespaces(t *testing.T) {
	opts, _, err := parseFlags([]string{"--redis-addr=r:6379",
		"--audit-route-namespaces=edge=team-a", "--audit-route-namespaces=prod=team-b,team-c,team-b"})
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"edge": {"team-a"}, "prod": {"team-b", "team-c"}}, opts.AuditRouteNamespaces)
	for _, bad := range [][]string{{"--audit-route-namespaces=edge"}, {"--audit-route-namespaces=edge="},
		{"--audit-route-namespaces=edge=a", "--audit-route-namespaces=edge=b"}} {
		_, _, err = parseFlags(append([]string{"--redis-addr=r:6379"}, bad...))
		require.ErrorContains(t, err, "--audit-route-namespaces", bad)
	}
	opts, _, err = parseFlags([]string{"--redis-addr=r:6379"})
	require.NoError(t, err)
	require.Empty(t, opts.AuditRouteNamespaces, "no remote route is bound by default")
}

// /metrics has a listener of its own, on by default and authenticated unless opted out.
func TestParseMetricsFlags(t *testing.T) {
	opts, _, err := parseFlags([]string{"--redis-addr=r:6379"})
	require.NoError(t, err)
	require.Equal(t, ":8080", opts.OpsListenAddress)
	require.Equal(t, ":8081", opts.MetricsListenAddress)
	require.False(t, opts.MetricsInsecureAllowUnauthenticated)

	opts, _, err = parseFlags([]string{"--redis-addr=r:6379", "--metrics-listen-address=127.0.0.1:9090", "--metrics-insecure-allow-unauthenticated"})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9090", opts.MetricsListenAddress)
	require.True(t, opts.MetricsInsecureAllowUnauthenticated)

	opts, _, err = parseFlags([]string{"--redis-addr=r:6379", "--metrics-listen-address="})
	require.NoError(t, err)
	require.Empty(t, opts.MetricsListenAddress)
}

func TestParseSelfManagedTLSFlags(t *testing.T) {
	opts, _, err := parseFlags([]string{"--redis-addr=r:6379"})
	require.NoError(t, err)
	require.Empty(t, opts.TLSSelfManagedSecret)
	require.Equal(t, []string{"kubescribe-audit", "kubescribe-admission", "kubescribe-metrics"}, opts.TLSSelfManagedServices)
	require.Equal(t, []string{"kubescribe-commitrequests"}, opts.TLSSelfManagedWebhooks)
	require.Equal(t, 365*24*time.Hour, opts.TLSSelfManagedValidity)
	require.Equal(t, 3650*24*time.Hour, opts.TLSSelfManagedCAValidity)
	require.Equal(t, time.Minute, opts.TLSSelfManagedCheckInterval)

	opts, _, err = parseFlags([]string{"--redis-addr=r:6379", "--tls-self-managed-secret=ks/tls", "--tls-self-managed-services=audit",
		"--tls-self-managed-extra-sans= 10.96.0.50, kubescribe.example.com,", "--tls-self-managed-validity=720h",
		"--tls-self-managed-ca-validity=8760h", "--tls-self-managed-webhooks=", "--tls-self-managed-check-interval=10s",
		"--audit-token-file=tokens", "--admission-token-file=tokens"})
	require.NoError(t, err)
	require.NoError(t, opts.Validate())
	require.Equal(t, "ks/tls", opts.TLSSelfManagedSecret)
	require.Equal(t, []string{"audit"}, opts.TLSSelfManagedServices)
	require.Equal(t, []string{"10.96.0.50", "kubescribe.example.com"}, opts.TLSSelfManagedExtraSANs)
	require.Empty(t, opts.TLSSelfManagedWebhooks)
	require.Equal(t, 720*time.Hour, opts.TLSSelfManagedValidity)
	require.Equal(t, 10*time.Second, opts.TLSSelfManagedCheckInterval)
	p, err := opts.SelfManagedPolicy()
	require.NoError(t, err)
	require.Equal(t, []string{"audit.ks.svc", "audit.ks.svc.cluster.local", "kubescribe.example.com"}, p.DNSNames)
	require.Len(t, p.IPs, 1)
}
