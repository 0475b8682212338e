package app

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
)

// redisDialLogInterval bounds how often a failing connection to Redis is logged: during an
// outage the pool dials on every command.
const redisDialLogInterval = 10 * time.Second

// Buffer sizes of each Redis connection, per direction, and the idle connections the pool
// keeps (newRedisClient).
const (
	redisBufferSize         = 8 << 10
	redisPipelineBufferSize = 32 << 10
	redisMaxIdleConns       = 4
)

// newRedisClient builds the Redis client the options describe. go-redis' universal client
// picks the mode: a master name selects Sentinel, several addresses (or RedisCluster) a Redis
// Cluster, else a single node. Connection failures, errors and latency are reported through a
// hook on this client, so two kubescribes in one process (tests) keep their logs and metrics
// apart; no process-global logger is installed.
// dial, when not nil, dials every connection (TLS: redisTLS.dial).
func newRedisClient(opts Options, log *slog.Logger, reg prometheus.Registerer, dial func(context.Context, string, string) (net.Conn, error)) redis.UniversalClient {
	var addrs []string
	for _, a := range strings.Split(opts.RedisAddr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:         addrs,
		MasterName:    opts.RedisMasterName,
		IsClusterMode: opts.RedisCluster,
		Username:      opts.RedisUsername,
		Password:      opts.RedisPassword,
		DB:            opts.RedisDB,
		Dialer:        dial,
		// Smaller buffers than go-redis' defaults (32 KiB per direction on each connection,
		// 128 KiB on each pipeline connection). Connections opened during a burst stay in the
		// pool, idle, with their buffers: after 10,000 commits the pool held ~1.5 MB of them.
		// kubescribe's values are a few KB; larger replies (a cursor) are read in more reads.
		ReadBufferSize:          redisBufferSize,
		WriteBufferSize:         redisBufferSize,
		PipelineReadBufferSize:  redisPipelineBufferSize,
		PipelineWriteBufferSize: redisPipelineBufferSize,
		// go-redis keeps every connection a burst opened (up to PoolSize, 10 per CPU) idle
		// in the pool: it checks ConnMaxIdleTime only when it takes a connection out, which an
		// idle kubescribe rarely does. After 10,000 commits that was ~18 more connections
		// than after the snapshot, 0.3 MB of buffers (test/snapshotload's heap dump). A
		// connection returned while 4 are idle is closed instead; a burst dials again (a
		// round trip on the network kubescribe already talks to Redis over).
		MaxIdleConns: redisMaxIdleConns,
	})
	rdb.AddHook(newRedisHook(log, reg))
	return rdb
}

// redisHook observes every command and pipeline of one client.
type redisHook struct {
	log      *slog.Logger
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	lastLog  atomic.Int64 // unix nanoseconds of the last dial failure logged
}

func newRedisHook(log *slog.Logger, reg prometheus.Registerer) *redisHook {
	f := promauto.With(reg)
	h := &redisHook{
		log: log,
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "kubescribe_redis_requests_total",
			Help: "Round trips to Redis by kind (command or pipeline) and result (ok or error; a missing key is ok).",
		}, []string{"kind", "result"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubescribe_redis_request_duration_seconds",
			Help:    "Duration of round trips to Redis by kind (command or pipeline), whatever their result.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9),
		}, []string{"kind"}),
	}
	for _, kind := range []string{"command", "pipeline"} {
		for _, result := range []string{"ok", "error"} {
			h.requests.WithLabelValues(kind, result)
		}
	}
	return h
}

func (h *redisHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil && ctx.Err() == nil {
			now := time.Now().UnixNano()
			last := h.lastLog.Load()
			if now-last >= int64(redisDialLogInterval) && h.lastLog.CompareAndSwap(last, now) {
				h.log.Warn("cannot connect to Redis", "addr", addr, "err", err)
			}
		}
		return conn, err
	}
}

func (h *redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		began := time.Now()
		err := next(ctx, cmd)
		h.observe("command", began, err)
		return err
	}
}

func (h *redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		began := time.Now()
		err := next(ctx, cmds)
		h.observe("pipeline", began, err)
		return err
	}
}

func (h *redisHook) observe(kind string, began time.Time, err error) {
	result := "ok"
	if err != nil && !errors.Is(err, redis.Nil) {
		result = "error"
	}
	h.requests.WithLabelValues(kind, result).Inc()
	h.duration.WithLabelValues(kind).Observe(time.Since(began).Seconds())
}
