package app

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/test/controlplane"
)

// redisTLSFixture is a CA, a redis-server serving a certificate of it for 127.0.0.1 and
// redis.test, and a client certificate of it, all in files.
type redisTLSFixture struct {
	ca                  *controlplane.CA
	dir                 string
	addr                string
	caFile              string
	certFile, keyFile   string // the client's
	srvCert, srvKey     string
	clientCN, serverDNS string
}

func newRedisTLSFixture(t *testing.T, authClients bool) *redisTLSFixture {
	t.Helper()
	ca, err := controlplane.NewCA("redis test CA")
	require.NoError(t, err)
	f := &redisTLSFixture{ca: ca, dir: t.TempDir(), clientCN: "kubescribe", serverDNS: "redis.test"}
	f.caFile = filepath.Join(f.dir, "ca.crt")
	writeFile(t, f.caFile, ca.CertPEM)
	f.srvCert, f.srvKey = f.issue(t, ca, "server", false)
	f.certFile, f.keyFile = f.issue(t, ca, "client", true)
	f.addr = redistest.StartTLS(t, redistest.TLSServer{CertFile: f.srvCert, KeyFile: f.srvKey, CAFile: f.caFile, AuthClients: authClients})
	return f
}

// issue writes a certificate of ca (a client's, or a server's for 127.0.0.1 and redis.test)
// and its key as NAME.crt and NAME.key.
func (f *redisTLSFixture) issue(t *testing.T, ca *controlplane.CA, name string, client bool) (certFile, keyFile string) {
	t.Helper()
	var certPEM, keyPEM []byte
	var err error
	if client {
		certPEM, keyPEM, err = ca.Issue(f.clientCN, nil, nil, true)
	} else {
		certPEM, keyPEM, err = ca.Issue("redis", []string{f.serverDNS}, []net.IP{net.ParseIP("127.0.0.1")}, false)
	}
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(f.dir, name+".crt"), filepath.Join(f.dir, name+".key")
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM)
	return certFile, keyFile
}

// client is the Redis client kubescribe builds from o (its TLS files watched until the test
// ends), with the listenerTLS that holds them, the log and the metrics registry.
func redisTLSClient(t *testing.T, o Options) (redis.UniversalClient, *listenerTLS, *bytes.Buffer, *prometheus.Registry) {
	t.Helper()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	reg := prometheus.NewRegistry()
	l := newListenerTLS(log, reg)
	rt, err := l.redisClientTLS(o)
	require.NoError(t, err)
	l.Run()
	t.Cleanup(func() { _ = l.Stop(context.Background()) })
	rdb := newRedisClient(o, log, reg, rt.dial)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb, l, &logs, reg
}

func ping(rdb redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return rdb.Ping(ctx).Err()
}

// kubescribe verifies Redis' certificate against --redis-ca-file and presents its client
// certificate to a Redis that requires one; a SET goes through. The client certificate's
// expiry is exported and both loads are logged.
func TestRedisTLSVerifiesTheServerAndPresentsTheClientCertificate(t *testing.T) {
	f := newRedisTLSFixture(t, true)
	o := validOptions()
	o.RedisAddr, o.RedisCAFile, o.RedisCertFile, o.RedisKeyFile = f.addr, f.caFile, f.certFile, f.keyFile
	require.NoError(t, o.Validate())
	require.True(t, o.RedisTLSEnabled())
	rdb, l, logs, reg := redisTLSClient(t, o)
	require.NoError(t, ping(rdb))
	require.NoError(t, rdb.Set(context.Background(), "k", "v", 0).Err())
	require.Equal(t, 1, testutil.CollectAndCount(reg, "kubescribe_tls_client_certificate_expiry_timestamp_seconds"))
	require.Greater(t, testutil.ToFloat64(l.clientExpiry.WithLabelValues("redis")), float64(time.Now().Unix()))
	require.Contains(t, logs.String(), "Redis CA loaded")
	require.Contains(t, logs.String(), "Redis client certificate loaded")
	require.NotContains(t, logs.String(), "PRIVATE KEY")
}

// An impostor: a Redis at the configured address whose certificate another CA signed, or whose
// certificate does not carry the server name kubescribe expects. kubescribe's handshake fails
// before any command (and its password) is sent; no option skips the check.
func TestRedisTLSRefusesAnImpostor(t *testing.T) {
	f := newRedisTLSFixture(t, false)
	other, err := controlplane.NewCA("impostor's CA")
	require.NoError(t, err)
	otherCA := filepath.Join(f.dir, "other-ca.crt")
	writeFile(t, otherCA, other.CertPEM)

	for name, tc := range map[string]struct {
		edit func(*Options)
		want string
	}{
		"another CA":            {func(o *Options) { o.RedisCAFile = otherCA }, "certificate signed by unknown authority"},
		"the system roots":      {func(o *Options) { o.RedisTLS = true }, "certificate signed by unknown authority"},
		"another server name":   {func(o *Options) { o.RedisCAFile, o.RedisServerName = f.caFile, "redis.example" }, "redis.example"},
		"the name it carries":   {func(o *Options) { o.RedisCAFile, o.RedisServerName = f.caFile, f.serverDNS }, ""},
		"the address it serves": {func(o *Options) { o.RedisCAFile = f.caFile }, ""},
	} {
		t.Run(name, func(t *testing.T) {
			o := validOptions()
			o.RedisAddr, o.RedisPassword = f.addr, "secret"
			tc.edit(&o)
			require.NoError(t, o.Validate())
			rdb, _, logs, _ := redisTLSClient(t, o)
			err := ping(rdb)
			if tc.want == "" {
				// A good handshake (this Redis has no password: go-redis lets the AUTH
				// error "without any password configured" pass).
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "secret")
			require.NotContains(t, logs.String(), "secret")
		})
	}
}

// A Redis that requires client certificates refuses kubescribe without one, or with one of
// another CA; a plain TCP client gets nothing from its TLS port.
func TestRedisTLSClientCertificateRequired(t *testing.T) {
	f := newRedisTLSFixture(t, true)
	other, err := controlplane.NewCA("another CA")
	require.NoError(t, err)
	strangerCert, strangerKey := f.issue(t, other, "stranger", true)

	o := validOptions()
	o.RedisAddr, o.RedisCAFile = f.addr, f.caFile
	rdb, _, _, _ := redisTLSClient(t, o)
	require.Error(t, ping(rdb), "no client certificate")

	o.RedisCertFile, o.RedisKeyFile = strangerCert, strangerKey
	rdb, _, _, _ = redisTLSClient(t, o)
	require.Error(t, ping(rdb), "a client certificate of another CA")

	plain := newRedisClient(validOptionsAt(f.addr), slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	defer plain.Close()
	require.Error(t, ping(plain), "plain TCP on the TLS port")
}

func validOptionsAt(addr string) Options {
	o := validOptions()
	o.RedisAddr = addr
	return o
}

// The CA bundle and the client certificate are reloaded when their files change (a Secret's
// update): a dial after the change uses the new content, without a restart.
func TestRedisTLSReloadsItsFiles(t *testing.T) {
	f := newRedisTLSFixture(t, true)
	other, err := controlplane.NewCA("another CA")
	require.NoError(t, err)
	caFile := filepath.Join(f.dir, "client-ca.crt")
	writeFile(t, caFile, other.CertPEM) // the wrong CA first
	certFile, keyFile := f.issue(t, other, "rotated", true)

	o := validOptions()
	o.RedisAddr, o.RedisCAFile, o.RedisCertFile, o.RedisKeyFile = f.addr, caFile, certFile, keyFile
	rdb, _, _, _ := redisTLSClient(t, o)
	require.ErrorContains(t, ping(rdb), "unknown authority")

	writeFile(t, caFile, f.ca.CertPEM) // the server's CA now: the client certificate is still wrong
	require.Eventually(t, func() bool {
		err := ping(rdb)
		return err != nil && !bytes.Contains([]byte(err.Error()), []byte("unknown authority"))
	}, 90*time.Second, 100*time.Millisecond, "the new CA bundle was never used")
	require.Error(t, ping(rdb), "Redis refuses a client certificate of another CA")

	good, goodKey := f.issue(t, f.ca, "good", true)
	certPEM, err := os.ReadFile(good)
	require.NoError(t, err)
	keyPEM, err := os.ReadFile(goodKey)
	require.NoError(t, err)
	writeFile(t, keyFile, keyPEM)
	writeFile(t, certFile, certPEM)
	require.Eventually(t, func() bool { return ping(rdb) == nil }, 90*time.Second, 100*time.Millisecond,
		"the new client certificate was never presented")
}

// Options: a client certificate needs its key, a server name has no port, and any TLS setting
// turns TLS on.
func TestRedisTLSOptions(t *testing.T) {
	o := validOptions()
	require.False(t, o.RedisTLSEnabled())
	o.RedisCertFile = "/c"
	require.ErrorContains(t, o.Validate(), "RedisCertFile/RedisKeyFile")
	require.True(t, o.RedisTLSEnabled())
	o.RedisCertFile, o.RedisKeyFile = "", "/k"
	require.ErrorContains(t, o.Validate(), "RedisCertFile/RedisKeyFile")
	o = validOptions()
	o.RedisServerName = "redis:6379"
	require.ErrorContains(t, o.Validate(), "RedisServerName")
	for _, edit := range []func(*Options){
		func(o *Options) { o.RedisTLS = true },
		func(o *Options) { o.RedisCAFile = "/ca" },
		func(o *Options) { o.RedisServerName = "redis" },
	} {
		o := validOptions()
		edit(&o)
		require.True(t, o.RedisTLSEnabled())
	}

	l := newListenerTLS(slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	o = validOptions()
	o.RedisCAFile = filepath.Join(t.TempDir(), "missing.crt")
	_, err := l.redisClientTLS(o)
	require.ErrorContains(t, err, "loading the Redis CA")
	dir := t.TempDir()
	o = validOptions()
	o.RedisCertFile, o.RedisKeyFile = filepath.Join(dir, "c"), filepath.Join(dir, "k")
	writeFile(t, o.RedisCertFile, []byte("not a certificate"))
	writeFile(t, o.RedisKeyFile, []byte("not a key"))
	_, err = l.redisClientTLS(o)
	require.ErrorContains(t, err, "loading the Redis client certificate")
}
