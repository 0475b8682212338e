package controlplane

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/redistest"
)

// StartSentinel without the rest of the control plane: its Sentinel requires the password it
// generated (kubescribe refuses an open one), the file holds it, and a client authenticated
// with it follows a failover.
func TestStartSentinelRequiresItsPassword(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make test installs it)")
	}
	master := redistest.Start(t)
	cp := &ControlPlane{Dir: t.TempDir(), logf: t.Logf, redisBin: bin, RedisAddr: master.Options().Addr}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := cp.StartSentinel(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop() })

	require.NotEmpty(t, s.Password)
	b, err := os.ReadFile(s.PasswordFile)
	require.NoError(t, err)
	require.Equal(t, s.Password, strings.TrimSpace(string(b)))
	open := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer open.Close()
	require.ErrorContains(t, open.Ping(ctx).Err(), "NOAUTH")

	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMasterName, SentinelAddrs: []string{s.Addr}, SentinelPassword: s.Password})
	defer rdb.Close()
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
	now, err := s.Failover(ctx)
	require.NoError(t, err)
	require.Equal(t, s.ReplicaAddr, now)
	require.Eventually(t, func() bool { return rdb.Set(ctx, "k", "w", 0).Err() == nil }, 30*time.Second, 100*time.Millisecond)
}
