package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// redisDialTimeout and redisKeepAlive are go-redis' own defaults for the connections it dials
// itself (Options.DialTimeout, its keep-alive configuration), kept for the TLS connections
// kubescribe dials for it.
const redisDialTimeout = 5 * time.Second

var redisKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3}

// redisTLS dials Redis and its Sentinels over TLS. Every new connection builds its tls.Config
// from the CA bundle and client certificate the providers hold at that moment, so a renewed
// certificate or CA (a mounted Secret's update, seen through fsnotify or at the latest a minute
// later) is used from the next dial on, without a restart; open connections keep theirs.
// Redis' certificate is always verified: there is no option to skip it.
type redisTLS struct {
	serverName string
	ca         dynamiccertificates.CAContentProvider      // nil: the system roots
	client     dynamiccertificates.CertKeyContentProvider // nil: no client certificate

	mu       sync.Mutex
	caBundle []byte
	roots    *x509.CertPool
	certPEM  []byte
	pair     *tls.Certificate
}

// redisClientTLS loads the files of Redis' TLS from opts and has Run watch them.
func (t *listenerTLS) redisClientTLS(opts Options) (*redisTLS, error) {
	r := &redisTLS{serverName: opts.RedisServerName}
	if opts.RedisCAFile != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("Redis CA", opts.RedisCAFile)
		if err != nil {
			return nil, fmt.Errorf("loading the Redis CA %s: %w", opts.RedisCAFile, err)
		}
		l := &caLog{log: t.log.With("client", "redis"), content: ca, msg: "Redis CA loaded"}
		ca.AddListener(l)
		l.Enqueue()
		t.runners = append(t.runners, ca)
		r.ca = ca
	}
	if opts.RedisCertFile != "" {
		// The provider is named for serving, but is a certificate and key read from two files,
		// checked to be a pair, and reloaded: what a client certificate needs too.
		c, err := dynamiccertificates.NewDynamicServingContentFromFiles("Redis client certificate", opts.RedisCertFile, opts.RedisKeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading the Redis client certificate %s: %w", opts.RedisCertFile, err)
		}
		l := &certLog{log: t.log.With("client", "redis"), content: c, msg: "Redis client certificate loaded",
			expiry: t.clientExpiry.WithLabelValues("redis")}
		c.AddListener(l)
		l.Enqueue()
		t.runners = append(t.runners, c)
		r.client = c
	}
	return r, nil
}

// dial is go-redis' Dialer: TCP, then a TLS handshake verifying the server as config says.
func (r *redisTLS) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	cfg, err := r.config(addr)
	if err != nil {
		return nil, err
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: redisDialTimeout, KeepAliveConfig: redisKeepAlive}, Config: cfg}
	return d.DialContext(ctx, network, addr)
}

// config is the tls.Config of a connection to addr: the server name given, else addr's host;
// the current CA bundle, else the system roots; the current client certificate, if any.
func (r *redisTLS) config(addr string) (*tls.Config, error) {
	name := r.serverName
	if name == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("redis TLS: address %q: %w", addr, err)
		}
		name = host
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ca != nil {
		bundle := r.ca.CurrentCABundleContent()
		if r.roots == nil || !bytes.Equal(bundle, r.caBundle) {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(bundle) {
				return nil, errors.New("redis TLS: the CA bundle holds no certificate")
			}
			r.caBundle, r.roots = bytes.Clone(bundle), pool
		}
		cfg.RootCAs = r.roots
	}
	if r.client != nil {
		certPEM, keyPEM := r.client.CurrentCertKeyContent()
		if r.pair == nil || !bytes.Equal(certPEM, r.certPEM) {
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				return nil, fmt.Errorf("redis TLS: the client certificate: %w", err)
			}
			r.certPEM, r.pair = bytes.Clone(certPEM), &pair
		}
		cfg.Certificates = []tls.Certificate{*r.pair}
	}
	return cfg, nil
}
