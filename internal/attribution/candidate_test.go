package attribution

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
)

// Candidates are appended per (object, base), announced like facts, and expire.
func TestStoreCandidates(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute)
	s.SetCandidateTTL(30 * time.Second)
	three := int64(3)
	batch := []admission.Candidate{
		{Route: "local", Resource: "configmaps", UID: "u1", Operation: admission.OpCreate, Digest: "d1", User: audit.Identity{Username: "alice", Groups: []string{"devs"}}, RequestUID: "r1"},
		{Route: "local", Resource: "configmaps", UID: "u1", Operation: admission.OpUpdate, BaseResourceVersion: "7", Digest: "d2", User: audit.Identity{Username: "bob"}},
		{Route: "local", Resource: "configmaps", UID: "u1", Operation: admission.OpUpdate, BaseResourceVersion: "7", Digest: "d2", User: audit.Identity{Username: "mallory"}},
		{Route: "local", Group: "apps", Resource: "deployments", Subresource: "scale", UID: "u2", Operation: admission.OpUpdate, BaseResourceVersion: "9", Replicas: &three, User: audit.Identity{Username: "carol"}},
	}
	require.NoError(t, s.StoreCandidates(ctx, batch))

	got, err := s.Candidates(ctx, "local", "u1", "")
	require.NoError(t, err)
	require.Equal(t, []StoredCandidate{{Operation: admission.OpCreate, Digest: "d1", Request: "r1", User: audit.Identity{Username: "alice", Groups: []string{"devs"}}}}, got)
	got, err = s.Candidates(ctx, "local", "u1", "7")
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "bob", got[0].User.Username)
	require.Equal(t, "mallory", got[1].User.Username)
	got, err = s.Candidates(ctx, "local", "u2", "9")
	require.NoError(t, err)
	require.Equal(t, []StoredCandidate{{Operation: admission.OpUpdate, Subresource: "scale", Replicas: &three, User: audit.Identity{Username: "carol"}}}, got)
	got, err = s.Candidates(ctx, "other", "u1", "7")
	require.NoError(t, err)
	require.Empty(t, got)

	// A record of an unknown version is no candidate.
	require.NoError(t, rdb.RPush(ctx, "test:ks:cand:local:u3:-", `{"v":2,"op":"CREATE"}`, `not json`).Err())
	got, err = s.Candidates(ctx, "local", "u3", "")
	require.NoError(t, err)
	require.Empty(t, got)

	ttl, err := rdb.TTL(ctx, "test:ks:cand:local:u1:7").Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 20*time.Second)
	require.LessOrEqual(t, ttl, 30*time.Second)
}
