package app

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"

	"github.com/kubescribe/kubescribe/test/controlplane"
)

func validOptions() Options {
	o := DefaultOptions()
	o.RedisAddr = "127.0.0.1:6379"
	o.TLSCertFile, o.TLSKeyFile = "tls.crt", "tls.key"
	o.AuditTokenFile = "tokens"
	o.AdmissionClientCAFile = "admission-ca.crt"
	return o
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{name: "valid", mutate: func(*Options) {}},
		{name: "client CA instead of token", mutate: func(o *Options) { o.AuditTokenFile, o.AuditClientCAFile = "", "ca.crt" }},
		{name: "no redis", mutate: func(o *Options) { o.RedisAddr = "" }, wantErr: "Options.RedisAddr is required"},
		{name: "redis list of nothing", mutate: func(o *Options) { o.RedisAddr = " , ," }, wantErr: "Options.RedisAddr is required"},
		{name: "glob in prefix", mutate: func(o *Options) { o.RedisKeyPrefix = "ks*" }, wantErr: "Options.RedisKeyPrefix is invalid"},
		{name: "percent in prefix", mutate: func(o *Options) { o.RedisKeyPrefix = "ks%" }, wantErr: "Options.RedisKeyPrefix is invalid"},
		{name: "no TLS", mutate: func(o *Options) { o.TLSKeyFile = "" }, wantErr: "TLSCertFile/TLSKeyFile are required"},
		{name: "no audit authentication", mutate: func(o *Options) { o.AuditTokenFile = "" }, wantErr: "at least one is required"},
		{name: "bad cluster name", mutate: func(o *Options) { o.ClusterName = "Prod_1" }, wantErr: "Options.ClusterName"},
		{name: "zero discovery refresh", mutate: func(o *Options) { o.DiscoveryRefresh = 0 }, wantErr: "DiscoveryRefresh must be positive"},
		{name: "zero grace", mutate: func(o *Options) { o.AttributionGrace = 0 }, wantErr: "AttributionGrace must be positive"},
		{name: "ttl shorter than grace", mutate: func(o *Options) { o.FactTTL = o.AttributionGrace / 2 }, wantErr: "must be longer than AttributionGrace"},
		{name: "zero body limit", mutate: func(o *Options) { o.AuditMaxBodyBytes = 0 }, wantErr: "AuditMaxBodyBytes"},
		{name: "no workers", mutate: func(o *Options) { o.ControllerWorkers = 0 }, wantErr: "ControllerWorkers"},
		{name: "secret digest key", mutate: func(o *Options) { o.SecretDigestKey = make([]byte, 32) }},
		{name: "short secret digest key", mutate: func(o *Options) { o.SecretDigestKey = make([]byte, 31) },
			wantErr: "Options.SecretDigestKey is 31 bytes; it needs at least 32"},
		{name: "admission disabled", mutate: func(o *Options) { o.AdmissionListenAddress, o.AdmissionClientCAFile = "", "" }},
		{name: "admission without authentication", mutate: func(o *Options) { o.AdmissionClientCAFile = "" },
			wantErr: "AdmissionClientCAFile/AdmissionTokenFile one is required with the admission listener"},
		{name: "admission token instead of client CA", mutate: func(o *Options) { o.AdmissionClientCAFile, o.AdmissionTokenFile = "", "tokens" }},
		{name: "admission unauthenticated, opted out", mutate: func(o *Options) {
			o.AdmissionClientCAFile, o.AdmissionInsecureAllowUnauthenticated = "", true
		}},
		{name: "remote route bound to namespaces", mutate: func(o *Options) {
			o.AuditRouteNamespaces = map[string][]string{"edge": {"team-a", "team-b"}}
		}},
		{name: "local route bound as a remote", mutate: func(o *Options) {
			o.AuditRouteNamespaces = map[string][]string{"local": {"team-a"}}
		}, wantErr: `AuditRouteNamespaces route "local" is ClusterName`},
		{name: "remote route bound to an invalid namespace", mutate: func(o *Options) {
			o.AuditRouteNamespaces = map[string][]string{"edge": {"Team_A"}}
		}, wantErr: `"Team_A" is not a namespace name`},
		{name: "invalid remote route", mutate: func(o *Options) {
			o.AuditRouteNamespaces = map[string][]string{"Edge": {"team-a"}}
		}, wantErr: `route "Edge" must be a DNS label`},
		{name: "audit certificate bound to an invalid route", mutate: func(o *Options) {
			o.AuditClientCertRoutes = map[string][]string{"tenant": {"Tenant_A"}}
		}, wantErr: `AuditClientCertRoutes "tenant": want one or more routes`},
		{name: "admission certificate bound to no route", mutate: func(o *Options) {
			o.AdmissionClientCertRoutes = map[string][]string{"tenant": nil}
		}, wantErr: `AdmissionClientCertRoutes "tenant": want one or more routes`},
		{name: "verdict ttl shorter than close delay", mutate: func(o *Options) { o.VerdictTTL = time.Minute }, wantErr: "VerdictTTL (1m0s) must be longer"},
		{name: "admission cert without key", mutate: func(o *Options) { o.AdmissionTLSCertFile = "a.crt" }, wantErr: "must be set together"},
		{name: "admission source", mutate: func(o *Options) { o.AttributionSource = "admission" }},
		{name: "unknown source", mutate: func(o *Options) { o.AttributionSource = "guess" }, wantErr: `attribution source "guess" is not one of audit, admission, both`},
		{name: "admission source without the listener", mutate: func(o *Options) { o.AttributionSource, o.AdmissionListenAddress = "both", "" }, wantErr: "needs the admission listener"},
		{name: "candidate ttl shorter than grace", mutate: func(o *Options) { o.CandidateTTL = o.AttributionGrace / 2 }, wantErr: "CandidateTTL"},
		{name: "managed webhook", mutate: func(o *Options) {
			o.AttributionWebhookService, o.AttributionWebhookCAFile, o.AttributionSource = "kubescribe/kubescribe", "ca.crt", "admission"
		}},
		{name: "managed webhook for Secrets' authors", mutate: func(o *Options) {
			o.AttributionWebhookService, o.AttributionWebhookCAFile, o.SecretDigestKey = "kubescribe/kubescribe", "ca.crt", make([]byte, 32)
		}},
		{name: "managed webhook with audit and no digest key", mutate: func(o *Options) {
			o.AttributionWebhookService, o.AttributionWebhookCAFile = "kubescribe/kubescribe", "ca.crt"
		}, wantErr: "serve only the writes of encrypted Secrets, which need SecretDigestKey"},
		{name: "managed webhook two ways", mutate: func(o *Options) {
			o.AttributionWebhookService, o.AttributionWebhookURL, o.AttributionWebhookCAFile = "kubescribe/kubescribe", "https://h", "ca.crt"
		}, wantErr: "are exclusive"},
		{name: "managed webhook without CA", mutate: func(o *Options) { o.AttributionWebhookURL = "https://h" }, wantErr: "AttributionWebhookCAFile is required"},
		{name: "self-managed TLS", mutate: func(o *Options) {
			o.TLSCertFile, o.TLSKeyFile, o.TLSSelfManagedSecret = "", "", "kubescribe/kubescribe-tls"
			o.TLSSelfManagedExtraSANs = []string{"10.96.0.50", "kubescribe.example.com"}
			o.AttributionWebhookService, o.AttributionSource = "kubescribe/kubescribe-admission", "both"
		}},
		{name: "self-managed TLS and certificate files", mutate: func(o *Options) { o.TLSSelfManagedSecret = "kubescribe/tls" },
			wantErr: "TLSSelfManagedSecret excludes TLSCertFile"},
		{name: "self-managed TLS and a webhook CA file", mutate: func(o *Options) {
			o.TLSCertFile, o.TLSKeyFile, o.TLSSelfManagedSecret = "", "", "kubescribe/tls"
			o.AttributionWebhookService, o.AttributionWebhookCAFile = "kubescribe/kubescribe", "ca.crt"
		}, wantErr: "excludes AttributionWebhookCAFile"},
		{name: "self-managed Secret without namespace", mutate: func(o *Options) { o.TLSCertFile, o.TLSKeyFile, o.TLSSelfManagedSecret = "", "", "tls" },
			wantErr: `"tls": want <namespace>/<name>`},
		{name: "self-managed bad SAN", mutate: func(o *Options) {
			o.TLSCertFile, o.TLSKeyFile, o.TLSSelfManagedSecret = "", "", "kubescribe/tls"
			o.TLSSelfManagedExtraSANs = []string{"not a name"}
		}, wantErr: `extra SAN "not a name" is neither`},
		{name: "self-managed CA too short", mutate: func(o *Options) {
			o.TLSCertFile, o.TLSKeyFile, o.TLSSelfManagedSecret = "", "", "kubescribe/tls"
			o.TLSSelfManagedCAValidity = o.TLSSelfManagedValidity
		}, wantErr: "at least three times"},
		{name: "self-managed bad webhook name", mutate: func(o *Options) {
			o.TLSCertFile, o.TLSKeyFile, o.TLSSelfManagedSecret = "", "", "kubescribe/tls"
			o.TLSSelfManagedWebhooks = []string{"Not_A_Name"}
		}, wantErr: "TLSSelfManagedWebhooks"},
		{name: "zero admission body limit", mutate: func(o *Options) { o.AdmissionMaxBodyBytes = 0 }, wantErr: "AdmissionMaxBodyBytes"},
		{name: "negative request ttl", mutate: func(o *Options) { o.CommitRequestTTL = -time.Second }, wantErr: "CommitRequestTTL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := validOptions()
			tt.mutate(&o)
			err := o.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	o := Options{}
	err := o.Validate()
	require.ErrorContains(t, err, "RedisAddr")
	require.ErrorContains(t, err, "TLSCertFile")
	require.ErrorContains(t, err, "ClusterName")
}

func TestNewFailsOnUnreadableCertificate(t *testing.T) {
	o := validOptions()
	o.TLSCertFile = "/nonexistent/tls.crt"
	_, err := New(o)
	require.ErrorContains(t, err, "loading the audit serving certificate")
}

func TestValidateRedisModes(t *testing.T) {
	o := validOptions()
	o.RedisAddr, o.RedisMasterName, o.RedisDB = "10.0.0.1:26379,10.0.0.2:26379", "mymaster", 1
	o.RedisSentinelPassword = "sentinel-secret"
	require.NoError(t, o.Validate(), "Sentinel keeps database numbers")
	o.RedisSentinelPassword = ""
	o.RedisMasterName = ""
	require.ErrorContains(t, o.Validate(), "must be 0 with Redis Cluster")
	o.RedisAddr, o.RedisCluster = "10.0.0.1:6379", true
	require.ErrorContains(t, o.Validate(), "must be 0 with Redis Cluster")
}

// TestNewReleasesWhatStartedOnFailure: New fails on a taken ops port after it bound the audit
// listener and created the Redis client; both are released, so the audit port is free again.
func TestNewReleasesWhatStartedOnFailure(t *testing.T) {
	dir := t.TempDir()
	ca, err := controlplane.NewCA("test")
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.Issue("kubescribe", []string{"localhost"}, nil, false)
	require.NoError(t, err)
	o := validOptions()
	o.TLSCertFile, o.TLSKeyFile, o.AuditTokenFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(o.TLSCertFile, certPEM, 0o600))
	require.NoError(t, os.WriteFile(o.TLSKeyFile, keyPEM, 0o600))
	require.NoError(t, os.WriteFile(o.AuditTokenFile, []byte("secret-token\n"), 0o600))
	o.RestConfig = &rest.Config{Host: "https://127.0.0.1:1"}
	o.Logger = slog.New(slog.DiscardHandler)
	o.AdmissionListenAddress, o.AdmissionClientCAFile = "", ""

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o.AuditListenAddress = free.Addr().String()
	require.NoError(t, free.Close())
	o.OpsListenAddress = taken.Addr().String()

	_, err = New(o)
	require.ErrorContains(t, err, "ops listener")
	again, err := net.Listen("tcp", o.AuditListenAddress)
	require.NoError(t, err, "the audit listener was not closed")
	require.NoError(t, again.Close())
}

// Sentinel mode is refused at start unless the Sentinels authenticate kubescribe or TLS pins
// whom kubescribe trusts: else whoever reaches a Sentinel re-points it at their own listener,
// which receives the Redis password. The opt-out is explicit; the error never holds a password.
func TestValidateSentinelNeedsAuthenticationOrPinnedTLS(t *testing.T) {
	sentinel := func(mutate func(*Options)) Options {
		o := validOptions()
		o.RedisAddr, o.RedisMasterName, o.RedisPassword = "10.0.0.1:26379", "mymaster", "master-secret"
		mutate(&o)
		return o
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*Options)
		wantErr string
	}{
		{name: "open Sentinel", mutate: func(*Options) {}, wantErr: "Options.RedisSentinelPassword is required with Sentinel"},
		{name: "TLS on the system roots only", mutate: func(o *Options) { o.RedisTLS = true }, wantErr: "RedisSentinelPassword is required"},
		{name: "a client certificate only", mutate: func(o *Options) { o.RedisCertFile, o.RedisKeyFile = "c.crt", "c.key" }, wantErr: "RedisSentinelPassword is required"},
		{name: "username without password", mutate: func(o *Options) { o.RedisSentinelUsername = "ks" }, wantErr: "RedisSentinelUsername needs RedisSentinelPassword"},
		{name: "password", mutate: func(o *Options) { o.RedisSentinelPassword = "sentinel-secret" }},
		{name: "ACL user", mutate: func(o *Options) { o.RedisSentinelUsername, o.RedisSentinelPassword = "ks", "sentinel-secret" }},
		{name: "TLS with a CA", mutate: func(o *Options) { o.RedisCAFile = "ca.crt" }},
		{name: "TLS with a pinned name", mutate: func(o *Options) { o.RedisServerName = "redis.internal" }},
		{name: "opt-out", mutate: func(o *Options) { o.RedisSentinelInsecureAllowUnauthenticated = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := sentinel(tc.mutate)
			err := o.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			require.ErrorContains(t, err, "--redis-sentinel-insecure-allow-unauthenticated")
			require.NotContains(t, err.Error(), "master-secret")
		})
	}
	// Without Sentinel, the Sentinel options are a mistake.
	o := validOptions()
	o.RedisSentinelPassword = "sentinel-secret"
	err := o.Validate()
	require.ErrorContains(t, err, "apply to Sentinel mode only")
	require.NotContains(t, err.Error(), "sentinel-secret")
}
