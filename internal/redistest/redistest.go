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

// Start runs a redis-server on a free loopback port for the test, without persistence, and
// returns a client for it; both are stopped at cleanup. The test is skipped when redis-server
// is not installed (make test installs it).
func Start(t testing.TB) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make test installs it)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", t.TempDir(), "--save", "", "--appendonly", "no")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))})
	t.Cleanup(func() { _ = rdb.Close() })
	require.Eventually(t, func() bool { return rdb.Ping(context.Background()).Err() == nil }, 10*time.Second, 20*time.Millisecond)
	return rdb
}
