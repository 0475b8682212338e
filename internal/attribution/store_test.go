package attribution

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
)

// startRedis runs a real redis-server on a free loopback port for the test.
func startRedis(t *testing.T) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make test installs it)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))})
	t.Cleanup(func() { _ = rdb.Close() })
	require.Eventually(t, func() bool { return rdb.Ping(context.Background()).Err() == nil }, 10*time.Second, 20*time.Millisecond)
	return rdb
}

func TestStoreEarliestFactWins(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute)

	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	create := audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "create", User: audit.Identity{Username: "alice"}, AuditID: "a1", StageTimestamp: t0}
	noop := audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "patch", User: audit.Identity{Username: "bob"}, AuditID: "a2", StageTimestamp: t0.Add(time.Second)}
	// The no-op patch's batch arrives first (the apiserver retried the create's batch).
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{noop}))
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{create}))
	// A duplicate delivery of the no-op changes nothing.
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{noop}))

	got, err := s.Lookup(ctx, "local", "u1", "10", false)
	require.NoError(t, err)
	require.Equal(t, "alice", got.User.Username, "a no-op patch answering the same resourceVersion must not take the credit")

	got, err = s.Lookup(ctx, "local", "u1", "11", false)
	require.NoError(t, err)
	require.Nil(t, got)

	// Keys live under the prefix, with a TTL.
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{"test:ks:fact:local:u1:rv:10"}, keys)
	ttl, err := rdb.TTL(ctx, keys[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second)
}

func TestStoreDeletes(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("kubescribe"), 0)

	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	held := audit.Fact{Route: "local", UID: "u1", ResourceVersion: "20", Verb: "delete", Terminating: true, User: audit.Identity{Username: "alice"}, StageTimestamp: t0}
	finalizerPatch := audit.Fact{Route: "local", UID: "u1", ResourceVersion: "20", Verb: "patch", Terminating: true, User: audit.Identity{Username: "bot"}, StageTimestamp: t0.Add(-time.Second)}
	collection := audit.Fact{Route: "local", Verb: "deletecollection", DeletedUIDs: []string{"u2", "u3"}, User: audit.Identity{Username: "carol"}, StageTimestamp: t0}
	// Even delivered first, and even with an earlier timestamp, the finalizer patch loses to
	// the delete for the resourceVersion they share.
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{finalizerPatch}))
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{held, collection}))

	for uid, want := range map[string]string{"u1": "alice", "u2": "carol", "u3": "carol"} {
		got, err := s.Lookup(ctx, "local", uid, "99", true)
		require.NoError(t, err)
		require.Equal(t, want, got.User.Username, uid)
	}
	got, err := s.Lookup(ctx, "local", "u1", "20", false)
	require.NoError(t, err)
	require.Equal(t, "alice", got.User.Username, "the finalizer-removing patch must not take the deletion's credit")
}

func TestStoreAnnouncesAndJoinerWakes(t *testing.T) {
	rdb := startRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewStore(rdb, keyspace.MustParse("kubescribe"), 0)
	j, err := NewJoiner(JoinerOptions{Facts: s, Grace: time.Hour})
	require.NoError(t, err)
	go func() { _ = j.Run(ctx) }()
	// Let the subscription reach Redis before the fact is published.
	require.Eventually(t, func() bool {
		n, err := rdb.PubSubNumSub(ctx, "kubescribe:facts").Result()
		return err == nil && n["kubescribe:facts"] == 1
	}, 5*time.Second, 10*time.Millisecond)

	out := make(chan AttributedChange, 1)
	j.Join(change("u9", "5", "update"), func(c AttributedChange) { out <- c })
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{{Route: "local", UID: "u9", ResourceVersion: "5", Verb: "update", User: audit.Identity{Username: "bob"}}}))
	select {
	case got := <-out:
		require.Equal(t, "bob", got.Author.Username)
	case <-time.After(10 * time.Second):
		t.Fatal("the joiner was not woken by the stored fact")
	}
}

func TestStoreUnavailable(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	s := NewStore(rdb, keyspace.MustParse("kubescribe"), 0)
	err := s.StoreFacts(context.Background(), []audit.Fact{{Route: "local", UID: "u1", ResourceVersion: "1", Verb: "create"}})
	require.ErrorContains(t, err, "storing 1 attribution facts")
}
