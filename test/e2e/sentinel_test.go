package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/test/stack"
)

// kubescribe reaches Redis through Sentinel (--redis-addr of the Sentinel, --redis-master-name),
// and the master is failed over (SENTINEL FAILOVER, as an operator forces one) while alice and
// bob create 60 ConfigMaps: every ConfigMap is in Git (0 lost), none is credited to somebody who
// did not write it nor to the committer (0 wrong). A fact the old master took but had not passed
// to the replica when it was demoted is gone with it (Redis replicates asynchronously): that
// change may be unresolved, never another's. On the apiserver's default audit retries; a stack
// of its own.
func TestSentinelFailoverMidStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	s := startStack(t, stack.Options{RedisSentinel: true})

	const ns, total, failoverAt = "e2e-sentinel", 60, 20
	users := []string{"alice", "bob"}
	m := newMirrorOn(t, s, ns, "", users, configMapWriters, watchConfigMaps)
	clients := map[string]kubernetes.Interface{}
	for _, u := range users {
		c, err := kubernetes.NewForConfig(s.UserConfig(u))
		require.NoError(t, err)
		clients[u] = c
	}
	oldMaster, err := s.Sentinel.Master(ctx)
	require.NoError(t, err)

	writer := map[string]string{} // ConfigMap -> who created it
	failover := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := range total {
			<-tick.C
			if i == failoverAt {
				close(failover)
			}
			u := users[i%2]
			if _, err := clients[u].CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%02d", i)},
				Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range total {
		writer[fmt.Sprintf("cm-%02d", i)] = users[i%2]
	}
	<-failover
	began := time.Now()
	newMaster, err := s.Sentinel.Failover(ctx)
	require.NoError(t, err)
	t.Logf("failover: the Sentinel announced %s instead of %s after %s", newMaster, oldMaster, time.Since(began).Round(time.Millisecond))
	require.NoError(t, <-done)

	var got map[string]string
	require.True(t, poll(4*time.Minute, func() bool {
		if len(m.files(t)) < total {
			return false
		}
		got = m.lastChanges(t, 0)
		return len(got) == total
	}), "every ConfigMap in Git: %d of %d files", len(m.files(t)), total)
	var unresolved, attributed int
	for name, change := range got {
		switch change {
		case writer[name] + " create":
			attributed++
		case attribution.UnresolvedUsername + " create":
			unresolved++
		default:
			t.Errorf("%s: %q, created by %s", name, change, writer[name])
		}
	}
	requireNoCommitterChange(t, m, 0)
	// The facts live on the new master now; the old one serves as its replica.
	for addr, role := range map[string]string{newMaster: "role:master", oldMaster: "role:slave"} {
		c := redis.NewClient(&redis.Options{Addr: addr})
		info, err := c.Info(ctx, "replication").Result()
		require.NoError(t, err)
		require.Contains(t, info, role, "%s", addr)
		if role == "role:master" {
			keys, err := c.Keys(ctx, "kubescribe:*").Result()
			require.NoError(t, err)
			require.NotEmpty(t, keys, "kubescribe's keys on the new master")
		}
		_ = c.Close()
	}
	t.Logf("after the failover: %d of %d creates attributed to their writers, %d unresolved, 0 wrong", attributed, total, unresolved)
	require.Greater(t, attributed, total-failoverAt, "the creates after the failover are attributed through the new master")
}
