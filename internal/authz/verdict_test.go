package authz

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
)

func TestVerdictRecord(t *testing.T) {
	rdb := redistest.Start(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("team:ks"), time.Minute)
	require.Equal(t, "team:ks:authz:v1:verdict:cr-uid", s.Key("cr-uid"))

	_, found, err := s.Lookup(ctx, "cr-uid")
	require.NoError(t, err)
	require.False(t, found)

	v := Verdict{UID: "cr-uid", Namespace: "shop", Name: "why", Target: "tenants",
		Submitter: Submitter{Username: "alice", Groups: []string{"devs"}},
		Author:    &Author{Name: "Jane", Email: "jane@example.com"}, Authorized: true}
	require.NoError(t, s.Record(ctx, v))
	got, found, err := s.Lookup(ctx, "cr-uid")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, v, got)

	// The stored format is versioned, and the first record wins.
	raw, err := rdb.Get(ctx, s.Key("cr-uid")).Result()
	require.NoError(t, err)
	require.Contains(t, raw, `"v":1`)
	ttl, err := rdb.TTL(ctx, s.Key("cr-uid")).Result()
	require.NoError(t, err)
	require.Positive(t, ttl)
	require.LessOrEqual(t, ttl, time.Minute)
	forged := v
	forged.Submitter.Username = "mallory"
	require.NoError(t, s.Record(ctx, forged))
	got, _, _ = s.Lookup(ctx, "cr-uid")
	require.Equal(t, "alice", got.Submitter.Username)

	// Another format version, or a record under another UID's key, counts as absent.
	require.NoError(t, rdb.Set(ctx, s.Key("old"), `{"v":0,"verdict":{"uid":"old","authorized":true}}`, 0).Err())
	_, found, err = s.Lookup(ctx, "old")
	require.NoError(t, err)
	require.False(t, found)
	require.NoError(t, rdb.Set(ctx, s.Key("moved"), raw, 0).Err())
	_, found, _ = s.Lookup(ctx, "moved")
	require.False(t, found)

	require.Error(t, s.Record(ctx, Verdict{}))
}

func TestVerdictStoreUnavailable(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStore(rdb, keyspace.MustParse("ks"), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.Error(t, s.Record(ctx, Verdict{UID: "x"}))
	_, found, err := s.Lookup(ctx, "x")
	require.Error(t, err)
	require.False(t, found)
}
