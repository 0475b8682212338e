package app

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func validOptions() Options {
	o := DefaultOptions()
	o.RedisAddr = "127.0.0.1:6379"
	o.TLSCertFile, o.TLSKeyFile = "tls.crt", "tls.key"
	o.AuditTokenFile = "tokens"
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
		{name: "glob in prefix", mutate: func(o *Options) { o.RedisKeyPrefix = "ks*" }, wantErr: "Options.RedisKeyPrefix is invalid"},
		{name: "percent in prefix", mutate: func(o *Options) { o.RedisKeyPrefix = "ks%" }, wantErr: "Options.RedisKeyPrefix is invalid"},
		{name: "no TLS", mutate: func(o *Options) { o.TLSKeyFile = "" }, wantErr: "TLSCertFile/TLSKeyFile are required"},
		{name: "no audit authentication", mutate: func(o *Options) { o.AuditTokenFile = "" }, wantErr: "at least one is required"},
		{name: "bad cluster name", mutate: func(o *Options) { o.ClusterName = "Prod_1" }, wantErr: "Options.ClusterName"},
		{name: "zero grace", mutate: func(o *Options) { o.AttributionGrace = 0 }, wantErr: "AttributionGrace must be positive"},
		{name: "ttl shorter than grace", mutate: func(o *Options) { o.FactTTL = o.AttributionGrace / 2 }, wantErr: "must be longer than AttributionGrace"},
		{name: "zero body limit", mutate: func(o *Options) { o.AuditMaxBodyBytes = 0 }, wantErr: "AuditMaxBodyBytes"},
		{name: "no workers", mutate: func(o *Options) { o.ControllerWorkers = 0 }, wantErr: "ControllerWorkers"},
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
