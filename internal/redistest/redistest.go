// Package redistest starts a real redis-server for a package's tests.
package redistest

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// FreeAddr returns a loopback address ("127.0.0.1:<port>") where nothing listens now: a port
// the kernel handed out and that was closed again. A client dialling it is refused (a Redis
// that is down), and a server may be started there.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// Start runs a redis-server on a free loopback port for the test, without persistence, and
// returns a client for it; both are stopped at cleanup. The test is skipped when redis-server
// is not installed (make test installs it).
func Start(t testing.TB) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make test installs it)")
	}
	_, portText, err := net.SplitHostPort(FreeAddr(t))
	require.NoError(t, err)
	port, err := strconv.Atoi(portText)
	require.NoError(t, err)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", t.TempDir(), "--save", "", "--appendonly", "no")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))})
	t.Cleanup(func() { _ = rdb.Close() })
	require.Eventually(t, func() bool { return rdb.Ping(context.Background()).Err() == nil }, 10*time.Second, 20*time.Millisecond)
	return rdb
}

// TLSServer is the TLS of a redis-server StartTLS runs: its serving certificate and key, and
// the CA bundle it verifies clients with, all PEM files.
type TLSServer struct {
	CertFile, KeyFile, CAFile string
	// AuthClients makes Redis require a client certificate of CAFile (tls-auth-clients yes);
	// else a client may connect without one.
	AuthClients bool
}

// StartTLS runs a redis-server that accepts TLS only, on a free loopback port, without
// persistence, until the test ends, and returns its address once it accepts connections. The
// test is skipped when redis-server is not installed.
func StartTLS(t testing.TB, s TLSServer) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make test installs it)")
	}
	addr := FreeAddr(t)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	auth := "optional"
	if s.AuthClients {
		auth = "yes"
	}
	cmd := exec.Command(bin, "--port", "0", "--tls-port", port, "--bind", "127.0.0.1", "--dir", t.TempDir(),
		"--save", "", "--appendonly", "no", "--tls-cert-file", s.CertFile, "--tls-key-file", s.KeyFile,
		"--tls-ca-cert-file", s.CAFile, "--tls-auth-clients", auth)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	return addr
}
