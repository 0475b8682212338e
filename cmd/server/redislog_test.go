package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/redistest"
	"github.com/kubescribe/kubescribe/internal/testlog"
)

// TestRedisLoggerKeepsTheLogJSON: go-redis' own message about a Redis it cannot reach
// arrives as a JSON record of component redis, at debug level (the client's hook reports the
// outage itself), rather than as a plain line on stderr.
func TestRedisLoggerKeepsTheLogJSON(t *testing.T) {
	addr := redistest.FreeAddr(t) // nothing listens there

	var out testlog.Buffer
	installRedisLogger(slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.Error(t, rdb.Ping(ctx).Err())

	require.Eventually(t, func() bool { return strings.Contains(out.String(), "failed to dial") }, 5*time.Second, 10*time.Millisecond,
		"go-redis' message reaches the logger: %q", out.String())
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "a log line that is not JSON: %q", line)
		require.Equal(t, "redis", rec["component"], line)
		if strings.Contains(line, "failed to dial") {
			require.Equal(t, "DEBUG", rec["level"], line)
			require.True(t, strings.HasPrefix(rec["msg"].(string), "redis client: connection pool: failed to dial"), line)
		}
	}

	// At the default level the dial failure is left out; any other message is a warning.
	var info testlog.Buffer
	quiet := redisLogger{log: slog.New(slog.NewJSONHandler(&info, nil)).With("component", "redis")}
	quiet.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 5, "refused")
	require.Empty(t, info.String())
	quiet.Printf(ctx, "sentinel: new master=%q addr=%q", "m", "10.0.0.1:6379")
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(info.String()), &rec))
	require.Equal(t, "WARN", rec["level"])
	require.Equal(t, `redis client: sentinel: new master="m" addr="10.0.0.1:6379"`, rec["msg"])
}
