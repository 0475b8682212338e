package app

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/redistest"
)

// TestRedisHookReportsFailures: a Redis that does not answer shows in the client's own
// metrics and log, not in a process-global logger.
func TestRedisHookReportsFailures(t *testing.T) {
	addr := redistest.FreeAddr(t) // nothing listens there

	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	o := validOptions()
	o.RedisAddr = addr
	rdb := newRedisClient(o, slog.New(slog.NewTextHandler(&logs, nil)), reg, nil)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.Error(t, rdb.Ping(ctx).Err())
	require.Error(t, rdb.Ping(ctx).Err())

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kubescribe_redis_requests_total Round trips to Redis by kind (command or pipeline) and result (ok or error; a missing key is ok).
# TYPE kubescribe_redis_requests_total counter
kubescribe_redis_requests_total{kind="command",result="error"} 2
kubescribe_redis_requests_total{kind="command",result="ok"} 0
kubescribe_redis_requests_total{kind="pipeline",result="error"} 0
kubescribe_redis_requests_total{kind="pipeline",result="ok"} 0
`), "kubescribe_redis_requests_total"))
	require.Contains(t, logs.String(), "cannot connect to Redis")
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte("cannot connect to Redis")), "dial failures are logged at most every 10s")
}

// TestRedisClientBufferSizes: the connections of a burst stay in the pool when it ends, so
// their buffers are kept small.
func TestRedisClientBufferSizes(t *testing.T) {
	o := validOptions()
	o.RedisAddr = "127.0.0.1:1"
	rdb := newRedisClient(o, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	defer rdb.Close()
	c, ok := rdb.(*redis.Client)
	require.True(t, ok, "one address, no master name: a single-node client")
	got := c.Options()
	require.Equal(t, redisBufferSize, got.ReadBufferSize)
	require.Equal(t, redisBufferSize, got.WriteBufferSize)
	require.Equal(t, redisPipelineBufferSize, got.PipelineReadBufferSize)
	require.Equal(t, redisPipelineBufferSize, got.PipelineWriteBufferSize)
}

// TestRedisPoolKeepsFewIdleConnections: the connections a burst of concurrent commands opens
// are closed when it ends, but for redisMaxIdleConns, against a real redis-server.
func TestRedisPoolKeepsFewIdleConnections(t *testing.T) {
	srv := redistest.Start(t)
	o := validOptions()
	o.RedisAddr = srv.Options().Addr
	rdb := newRedisClient(o, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	defer rdb.Close()
	ctx := context.Background()
	const burst = 16
	var wg sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// BLPOP holds its connection for 200ms, so the burst needs one connection each.
			assert.ErrorIs(t, rdb.BLPop(ctx, 200*time.Millisecond, fmt.Sprintf("nothing-%d", i)).Err(), redis.Nil)
		}()
	}
	wg.Wait()
	stats := rdb.PoolStats()
	require.GreaterOrEqual(t, stats.Misses, uint32(burst/2), "the burst opened connections of its own")
	require.LessOrEqual(t, stats.IdleConns, uint32(redisMaxIdleConns))
	require.LessOrEqual(t, stats.TotalConns, uint32(redisMaxIdleConns))
	require.NoError(t, rdb.Ping(ctx).Err(), "the pool still works")
}
