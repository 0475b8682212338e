package e2e

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"

	"github.com/kubescribe/kubescribe/test/stack"
)

// kubescribe against a Redis that accepts TLS only and requires a client certificate
// (tls-auth-clients yes), configured as a user would: --redis-ca-file, --redis-cert-file,
// --redis-key-file and --redis-server-name. The facts it stores there from the apiserver's audit
// events still name each change's author, and a client without TLS gets nothing from Redis.
// A stack of its own: the shared one's Redis is plain TCP.
func TestRedisOverTLS(t *testing.T) {
	s := startStack(t, stack.Options{RedisTLS: true})
	const ns = "e2e-redis-tls"
	m := newMirrorOn(t, s, ns, "", []string{"alice", "bob"}, configMapWriters, watchConfigMaps)

	for _, user := range []string{"alice", "bob"} {
		c, err := kubernetes.NewForConfig(s.UserConfig(user))
		require.NoError(t, err)
		createConfigMaps(t, c.CoreV1().ConfigMaps(ns), "from-"+user)
	}
	want := map[string]string{"from-alice": "alice create", "from-bob": "bob create"}
	require.True(t, poll(90*time.Second, func() bool {
		if len(m.files(t)) < 2 {
			return false
		}
		got := m.lastChanges(t, 0)
		return got["from-alice"] == want["from-alice"] && got["from-bob"] == want["from-bob"]
	}), "each ConfigMap committed by its writer: %v", m.lastChanges(t, 0))
	requireNoCommitterChange(t, m, 0)
	require.Positive(t, stackMetric(t, s, `kubescribe_redis_requests_total{kind="command",result="ok"}`))
	require.Positive(t, stackMetric(t, s, `kubescribe_tls_client_certificate_expiry_timestamp_seconds{client="redis"}`))

	// Plain TCP on Redis' port: no PONG, the TLS server drops what is not a handshake.
	conn, err := net.DialTimeout("tcp", s.RedisAddr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
	_, _ = io.WriteString(conn, "*1\r\n$4\r\nPING\r\n")
	line, _ := bufio.NewReader(conn).ReadString('\n')
	require.False(t, strings.HasPrefix(line, "+PONG"), "Redis answered plain TCP: %q", line)
}
