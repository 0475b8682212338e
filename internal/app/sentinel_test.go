package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/test/controlplane"
)

const (
	sentinelTestMaster   = "kubescribe"
	sentinelTestPassword = "master-secret-0f3a"   // the Redis master's requirepass
	sentinelTestSecret   = "sentinel-secret-9c1d" // the Sentinel's ACL user's password
	sentinelTestUser     = "ks"
)

// startRedisProcess runs redis-server with args until the test ends and returns once addr
// answers PING (NOAUTH counts: the server is up).
func startRedisProcess(t *testing.T, addr string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make test installs it)")
	}
	cmd := exec.Command(bin, args...)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	require.Eventually(t, func() bool {
		err := c.Ping(context.Background()).Err()
		return err == nil || strings.HasPrefix(err.Error(), "NOAUTH")
	}, 10*time.Second, 20*time.Millisecond, "redis-server at %s never answered", addr)
}

// startSentinelMaster runs a Redis master that requires sentinelTestPassword and a Sentinel
// watching it; with authenticated, the Sentinel's default user is off and only
// sentinelTestUser/sentinelTestSecret may use it, else it is open, as a Sentinel is by default.
// It returns the master's and the Sentinel's addresses.
func startSentinelMaster(t *testing.T, authenticated bool) (master, sentinel string) {
	t.Helper()
	master, sentinel = redistest.FreeAddr(t), redistest.FreeAddr(t)
	_, masterPort, _ := net.SplitHostPort(master)
	_, sentinelPort, _ := net.SplitHostPort(sentinel)
	startRedisProcess(t, master, "--port", masterPort, "--bind", "127.0.0.1", "--dir", t.TempDir(), "--save", "", "--appendonly", "no",
		"--requirepass", sentinelTestPassword)
	dir := t.TempDir()
	conf := []string{"port " + sentinelPort, "bind 127.0.0.1", "dir " + dir,
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s 1", sentinelTestMaster, masterPort),
		fmt.Sprintf("sentinel auth-pass %s %s", sentinelTestMaster, sentinelTestPassword)}
	if authenticated {
		conf = append(conf, "user default off", fmt.Sprintf("user %s on >%s +@all", sentinelTestUser, sentinelTestSecret))
	}
	file := filepath.Join(dir, "sentinel.conf") // the Sentinel rewrites it: its own, writable
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(conf, "\n")+"\n"), 0o600))
	startRedisProcess(t, sentinel, file, "--sentinel")
	return master, sentinel
}

// fakeMaster is an attacker's listener a Sentinel may be re-pointed at: it records every byte
// it receives, and closes each connection after its first read.
type fakeMaster struct {
	addr string
	mu   sync.Mutex
	got  bytes.Buffer
}

func startFakeMaster(t *testing.T) *fakeMaster {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	f := &fakeMaster{addr: l.Addr().String()}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				b := make([]byte, 4096)
				n, _ := conn.Read(b)
				f.mu.Lock()
				f.got.Write(b[:n])
				f.mu.Unlock()
			}()
		}
	}()
	return f
}

func (f *fakeMaster) received() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got.String()
}

// sentinelOptions are kubescribe's options for the Sentinel at addr, with the master's password.
func sentinelOptions(addr string) Options {
	o := validOptions()
	o.RedisAddr, o.RedisMasterName, o.RedisPassword = addr, sentinelTestMaster, sentinelTestPassword
	return o
}

// TestSentinelAuthentication: with --redis-sentinel-username and --redis-sentinel-password-file
// kubescribe authenticates to a Sentinel that requires it, and the attacker who reaches that
// Sentinel without its credentials cannot re-point it (SENTINEL REMOVE, MONITOR are refused
// NOAUTH). kubescribe's Sentinel credentials go to the Sentinel, the master's to the master:
// each server accepts only its own.
func TestSentinelAuthentication(t *testing.T) {
	master, sentinel := startSentinelMaster(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	attacker := redis.NewSentinelClient(&redis.Options{Addr: sentinel, MaxRetries: -1})
	defer attacker.Close()
	require.ErrorContains(t, attacker.Remove(ctx, sentinelTestMaster).Err(), "NOAUTH")
	require.ErrorContains(t, attacker.Monitor(ctx, "evil", "127.0.0.1", "1", "1").Err(), "NOAUTH")
	// Nor with the master's password, which is not the Sentinel's.
	guesser := redis.NewSentinelClient(&redis.Options{Addr: sentinel, Username: sentinelTestUser, Password: sentinelTestPassword, MaxRetries: -1})
	defer guesser.Close()
	require.Error(t, guesser.Remove(ctx, sentinelTestMaster).Err())

	o := sentinelOptions(sentinel)
	o.RedisSentinelUsername, o.RedisSentinelPassword = sentinelTestUser, sentinelTestSecret
	require.NoError(t, o.Validate())
	rdb := newRedisClient(o, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	defer rdb.Close()
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
	direct := redis.NewClient(&redis.Options{Addr: master, Password: sentinelTestPassword})
	defer direct.Close()
	require.Equal(t, "v", direct.Get(ctx, "k").Val(), "the write reached the master the Sentinel announces")

	// The wrong Sentinel password: no master is learnt, nothing is written.
	o.RedisSentinelPassword = "wrong"
	wrong := newRedisClient(o, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	defer wrong.Close()
	require.Error(t, wrong.Ping(ctx).Err())
}

// TestOpenSentinelNeverLeadsToThePassword is the attack of issue 36 finding 4: the attacker
// reaches an open Sentinel, removes the master and has it monitor a listener of theirs under
// the same name. Without the Sentinel's authentication (the unsafe opt-out), kubescribe's next
// connection takes the announced master and sends it the Redis password. With a Sentinel
// password configured, kubescribe refuses a Sentinel that answers without authentication, so
// it never learns the attacker's master: the password never leaves, and the refusal is logged
// without a credential.
func TestOpenSentinelNeverLeadsToThePassword(t *testing.T) {
	_, sentinel := startSentinelMaster(t, false)
	fake := startFakeMaster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	attacker := redis.NewSentinelClient(&redis.Options{Addr: sentinel})
	defer attacker.Close()
	require.NoError(t, attacker.Remove(ctx, sentinelTestMaster).Err())
	fakeHost, fakePort, _ := net.SplitHostPort(fake.addr)
	require.NoError(t, attacker.Monitor(ctx, sentinelTestMaster, fakeHost, fakePort, "1").Err())
	require.Equal(t, []string{fakeHost, fakePort}, attacker.GetMasterAddrByName(ctx, sentinelTestMaster).Val(), "the Sentinel is re-pointed")

	// kubescribe configured with a Sentinel password (which the open Sentinel would accept
	// for its default user): refused, and the fake master never hears the password.
	var logs bytes.Buffer
	o := sentinelOptions(sentinel)
	o.RedisSentinelPassword = sentinelTestSecret
	require.NoError(t, o.Validate())
	rdb := newRedisClient(o, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry(), nil)
	defer rdb.Close()
	for range 3 {
		err := rdb.Ping(ctx).Err()
		require.Error(t, err)
		require.NotContains(t, err.Error(), sentinelTestPassword)
		require.NotContains(t, err.Error(), sentinelTestSecret)
	}
	require.NotContains(t, fake.received(), sentinelTestPassword, "the attacker's master heard the Redis password")
	require.Contains(t, logs.String(), "refusing a Redis Sentinel")
	require.Contains(t, logs.String(), "answers commands without authentication")
	require.NotContains(t, logs.String(), sentinelTestPassword)
	require.NotContains(t, logs.String(), sentinelTestSecret)

	// The unsafe opt-out, with the same Sentinel: the control that shows the attack works,
	// and so that the check above is what kept the password home.
	o = sentinelOptions(sentinel)
	o.RedisSentinelInsecureAllowUnauthenticated = true
	require.NoError(t, o.Validate())
	open := newRedisClient(o, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	defer open.Close()
	require.Eventually(t, func() bool {
		_ = open.Ping(ctx).Err()
		return strings.Contains(fake.received(), sentinelTestPassword)
	}, 20*time.Second, 50*time.Millisecond, "the opt-out sends the password to the announced master")
}

// A Sentinel that requires authentication answers NOAUTH to the probe, and the connection
// goes on as if unprobed; anything else is refused without quoting the server.
func TestProbeSentinelAuth(t *testing.T) {
	for _, tc := range []struct {
		answer, wantErr string
	}{
		{answer: "-NOAUTH Authentication required.\r\n"},
		{answer: "+PONG\r\n", wantErr: "without authentication"},
		{answer: "-DENIED \x1b[31mprotected mode\r\n", wantErr: "neither NOAUTH nor PONG"},
		{answer: strings.Repeat("x", 600), wantErr: "too long"},
		{answer: "", wantErr: "reading its answer"},
	} {
		client, server := net.Pipe()
		go func() {
			b := make([]byte, len("*1\r\n$4\r\nPING\r\n"))
			_, _ = server.Read(b)
			_, _ = server.Write([]byte(tc.answer))
			_ = server.Close()
		}()
		err := probeSentinelAuth(context.Background(), client)
		if tc.wantErr == "" {
			require.NoError(t, err, "%q", tc.answer)
		} else {
			require.ErrorContains(t, err, tc.wantErr, "%q", tc.answer)
			require.NotContains(t, err.Error(), "\x1b")
		}
		_ = client.Close()
	}
}

// An impostor at a Sentinel's address, over TLS with a certificate of another CA (what an
// attacker on the path, or one who took the Sentinel's address, presents): with TLS pinned to
// kubescribe's CA the handshake fails before any command, so neither the Sentinel's password
// nor the master's reaches it, with or without a Sentinel password configured.
func TestSentinelOverTLSRefusesAnImpostor(t *testing.T) {
	f := newRedisTLSFixture(t, false) // only for its CA and files; its Redis is not used
	other, err := controlplane.NewCA("impostor's CA")
	require.NoError(t, err)
	certFile, keyFile := f.issue(t, other, "impostor", false)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	var mu sync.Mutex
	var got bytes.Buffer
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				b := make([]byte, 4096)
				n, _ := conn.Read(b) // the handshake, then whatever the client sends
				mu.Lock()
				got.Write(b[:n])
				mu.Unlock()
				select {
				case accepted <- struct{}{}:
				default:
				}
			}()
		}
	}()

	for name, sentinelPassword := range map[string]string{"with a Sentinel password": sentinelTestSecret, "pinned TLS only": ""} {
		t.Run(name, func(t *testing.T) {
			o := sentinelOptions(l.Addr().String())
			o.RedisCAFile, o.RedisSentinelPassword = f.caFile, sentinelPassword
			require.NoError(t, o.Validate())
			rdb, _, logs, _ := redisTLSClient(t, o)
			err := ping(rdb)
			require.ErrorContains(t, err, "unknown authority")
			<-accepted
			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, got.String(), "the impostor read a command")
			require.NotContains(t, logs.String(), sentinelTestPassword)
			require.NotContains(t, logs.String(), sentinelTestSecret)
		})
	}
}
