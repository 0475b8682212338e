package app

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	if opts.RedisMasterName != "" && opts.RedisSentinelPassword != "" {
		dial = requireSentinelAuth(dial, addrs, log)
	}
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:         addrs,
		MasterName:    opts.RedisMasterName,
		IsClusterMode: opts.RedisCluster,
		Username:      opts.RedisUsername,
		Password:      opts.RedisPassword,
		// Sent to the Sentinels only; the master gets Username and Password.
		SentinelUsername: opts.RedisSentinelUsername,
		SentinelPassword: opts.RedisSentinelPassword,
		DB:               opts.RedisDB,
		Dialer:           dial,
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

// errSentinelOpen is why a Sentinel that answered PING without authentication is refused.
var errSentinelOpen = errors.New("it answers commands without authentication, so whoever reaches it could re-point it " +
	"at a listener of theirs; set requirepass (or disable its default user) on every Sentinel")

// requireSentinelAuth wraps dial (nil: plain TCP) for Sentinel mode with a Sentinel password:
// each connection to one of the Sentinels (addrs) first sends PING without authentication and
// is refused unless the Sentinel answers NOAUTH. An open Sentinel would accept go-redis'
// HELLO with any password for its default user, and could have been re-pointed by anyone: the
// master it announces is never dialled, so the Redis password never reaches it. Sentinels
// go-redis discovers later (SENTINEL SENTINELS) are not probed: every Sentinel of one
// deployment is configured alike. Refusals are logged at most every redisDialLogInterval.
func requireSentinelAuth(dial func(context.Context, string, string) (net.Conn, error), addrs []string, log *slog.Logger) func(context.Context, string, string) (net.Conn, error) {
	if dial == nil {
		d := &net.Dialer{Timeout: redisDialTimeout, KeepAliveConfig: redisKeepAlive}
		dial = d.DialContext
	}
	sentinels := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		sentinels[a] = true
	}
	var lastLog atomic.Int64
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil || !sentinels[addr] {
			return conn, err
		}
		if err := probeSentinelAuth(ctx, conn); err != nil {
			_ = conn.Close()
			err = fmt.Errorf("refusing the Redis Sentinel at %s: %w", addr, err)
			now := time.Now().UnixNano()
			if last := lastLog.Load(); now-last >= int64(redisDialLogInterval) && lastLog.CompareAndSwap(last, now) {
				log.Error("refusing a Redis Sentinel", "addr", addr, "err", err)
			}
			return nil, err
		}
		return conn, nil
	}
}

// probeSentinelAuth sends PING on conn, not yet authenticated, and returns nil only when the
// answer is a NOAUTH error. The answer is read to its end, so the connection is left clean for
// go-redis. The server's text is never quoted back.
func probeSentinelAuth(ctx context.Context, conn net.Conn) error {
	deadline := time.Now().Add(redisDialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n"); err != nil {
		return err
	}
	// One reply line, read a byte at a time so that nothing past it is consumed; a Redis
	// error line is short.
	var line []byte
	b := make([]byte, 1)
	for {
		if len(line) >= 512 {
			return errors.New("its answer to an unauthenticated PING is too long")
		}
		if _, err := conn.Read(b); err != nil {
			return fmt.Errorf("reading its answer to an unauthenticated PING: %w", err)
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(string(line), "-NOAUTH"):
		return nil
	case strings.HasPrefix(string(line), "+PONG"):
		return errSentinelOpen
	default:
		return errors.New("it answered an unauthenticated PING with neither NOAUTH nor PONG")
	}
}
