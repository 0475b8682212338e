package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMasterName is the name the Sentinel of StartSentinel knows the master by.
const SentinelMasterName = "kubescribe"

// Sentinel is Redis Sentinel for a test of a failover: a replica of the control plane's
// redis-server and one Sentinel watching both, with a quorum of one, so that a test can move the
// master (Failover) while kubescribe writes through go-redis' failover client.
type Sentinel struct {
	// Addr is the Sentinel's 127.0.0.1:port: kubescribe's --redis-addr, with
	// --redis-master-name=SentinelMasterName.
	Addr string
	// ReplicaAddr is the replica's 127.0.0.1:port.
	ReplicaAddr string
	// Password is the Sentinel's requirepass, generated at start (kubescribe refuses an
	// unauthenticated Sentinel), and PasswordFile a file holding it, for
	// --redis-sentinel-password-file.
	Password, PasswordFile string

	replica, sentinel *process
}

// StartSentinel starts the replica and the Sentinel and returns once the replica is in sync
// and the Sentinel knows both (a failover needs a replica it has seen).
func (cp *ControlPlane) StartSentinel(ctx context.Context) (_ *Sentinel, err error) {
	if cp.RedisTLS != nil {
		return nil, errors.New("controlplane: Sentinel with a TLS Redis is not supported")
	}
	ports, err := FreePorts(2)
	if err != nil {
		return nil, err
	}
	s := &Sentinel{ReplicaAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Addr: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if s.Password, err = randomToken(); err != nil {
		return nil, err
	}
	masterHost, masterPort, _ := net.SplitHostPort(cp.RedisAddr)
	replicaDir, sentinelDir := filepath.Join(cp.Dir, "redis-replica"), filepath.Join(cp.Dir, "sentinel")
	for _, d := range []string{replicaDir, sentinelDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	replicaLog := filepath.Join(cp.Dir, "redis-replica.log")
	cp.logPaths = append(cp.logPaths, replicaLog)
	if s.replica, err = startProcess("redis-server (replica)", replicaLog, cp.redisBin, []string{
		"--port", fmt.Sprint(ports[0]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", replicaDir, "--replicaof", masterHost, masterPort,
	}, os.Environ(), cp.logf); err != nil {
		return nil, err
	}
	s.PasswordFile = filepath.Join(sentinelDir, "password")
	if err := os.WriteFile(s.PasswordFile, []byte(s.Password+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	// The Sentinel rewrites its configuration file as it learns: it must be its own, writable.
	conf := filepath.Join(sentinelDir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(strings.Join([]string{
		fmt.Sprintf("port %d", ports[1]),
		"bind 127.0.0.1",
		"dir " + sentinelDir,
		"requirepass " + s.Password,
		fmt.Sprintf("sentinel monitor %s %s %s 1", SentinelMasterName, masterHost, masterPort),
		"sentinel down-after-milliseconds " + SentinelMasterName + " 5000",
		"sentinel failover-timeout " + SentinelMasterName + " 60000",
		"",
	}, "\n")), 0o600); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	sentinelLog := filepath.Join(cp.Dir, "sentinel.log")
	cp.logPaths = append(cp.logPaths, sentinelLog)
	if s.sentinel, err = startProcess("redis-sentinel", sentinelLog, cp.redisBin, []string{conf, "--sentinel"}, os.Environ(), cp.logf); err != nil {
		return nil, err
	}

	replica := redis.NewClient(&redis.Options{Addr: s.ReplicaAddr})
	defer replica.Close()
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, Password: s.Password})
	defer sentinel.Close()
	ready := func(ctx context.Context) error {
		info, err := replica.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return errors.New("the replica is not in sync with the master yet")
		}
		replicas, err := sentinel.Replicas(ctx, SentinelMasterName).Result()
		if err != nil {
			return err
		}
		if len(replicas) == 0 {
			return errors.New("the Sentinel has not seen the replica yet")
		}
		return nil
	}
	if err := waitReady(ctx, s.sentinel, redisReadyTimeout, ready); err != nil {
		return nil, fmt.Errorf("controlplane: Sentinel: %w", err)
	}
	cp.logf("controlplane: Sentinel at %s, replica at %s", s.Addr, s.ReplicaAddr)
	return s, nil
}

// Master is the master's address as the Sentinel announces it.
func (s *Sentinel) Master(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, Password: s.Password})
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, SentinelMasterName).Result()
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("the Sentinel answered %q for the master", hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// Failover has the Sentinel promote a replica (SENTINEL FAILOVER, as an operator forces one)
// and returns the new master's address once the Sentinel announces it.
func (s *Sentinel) Failover(ctx context.Context) (string, error) {
	before, err := s.Master(ctx)
	if err != nil {
		return "", err
	}
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, Password: s.Password})
	defer c.Close()
	if err := c.Failover(ctx, SentinelMasterName).Err(); err != nil {
		return "", fmt.Errorf("SENTINEL FAILOVER: %w", err)
	}
	for {
		if now, err := s.Master(ctx); err == nil && now != before {
			return now, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the Sentinel still announces %s: %w", before, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops the Sentinel and the replica.
func (s *Sentinel) Stop() error {
	var errs []error
	for _, p := range []*process{s.sentinel, s.replica} {
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	return errors.Join(errs...)
}
