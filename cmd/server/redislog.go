package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// go-redis prints its own messages (a pool that cannot dial, a Sentinel that names a new
// master) through one logger of the whole process, to stderr as plain text lines, which a JSON
// log pipeline cannot parse. The process has one logger, so main hands go-redis that one;
// internal/app installs nothing process-wide (two kubescribes in one test process keep their
// logs apart).

// redisLogger forwards go-redis' messages to a slog logger, as records of component redis.
type redisLogger struct{ log *slog.Logger }

// redisDialFailure starts go-redis' message for each failed dial. The client's own hook
// already logs dial failures as "cannot connect to Redis", at most every 10s; go-redis' line
// for each command during an outage is kept at debug level.
const redisDialFailure = "redis: connection pool: failed to dial"

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	level := slog.LevelWarn
	if strings.HasPrefix(format, redisDialFailure) {
		level = slog.LevelDebug
	}
	if !l.log.Enabled(ctx, level) {
		return
	}
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	l.log.Log(ctx, level, "redis client: "+msg)
}

// installRedisLogger makes go-redis log through log.
func installRedisLogger(log *slog.Logger) {
	redis.SetLogger(redisLogger{log: log.With("component", "redis")})
}
