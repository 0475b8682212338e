package attribution

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/admission"
	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/watch"
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

// The 64/65 attack: 64 forged DELETE candidates naming a victim, posted before the real
// write's candidate, fill the list. The list stops at MaxCandidates+1 records however many
// are pushed, reads as ErrTooManyCandidates, and the join leaves the delete unresolved: the
// victim is never credited, and neither is the real author (which of them is real is
// unknowable).
func TestCandidateFloodIsAmbiguousNeverTruncated(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute)
	forged := func(n int) []admission.Candidate {
		var cs []admission.Candidate
		for i := range n {
			cs = append(cs, admission.Candidate{Route: "local", Resource: "configmaps", UID: "u1", Operation: admission.OpDelete,
				BaseResourceVersion: "7", User: audit.Identity{Username: "victim"}, RequestUID: "forged-" + strconv.Itoa(i)})
		}
		return cs
	}
	real := admission.Candidate{Route: "local", Resource: "configmaps", UID: "u1", Operation: admission.OpDelete,
		BaseResourceVersion: "7", User: audit.Identity{Username: "alice"}, RequestUID: "real"}

	// Exactly the bound is still read in full: the real candidate is seen beside the forged
	// ones, and two users is ambiguous.
	require.NoError(t, s.StoreCandidates(ctx, forged(MaxCandidates-1)))
	require.NoError(t, s.StoreCandidates(ctx, []admission.Candidate{real}))
	got, err := s.Candidates(ctx, "local", "u1", "7")
	require.NoError(t, err)
	require.Len(t, got, MaxCandidates)
	require.Equal(t, "alice", got[MaxCandidates-1].User.Username)

	// One more is an overflow; a thousand more keep the list at its bound.
	require.NoError(t, s.StoreCandidates(ctx, forged(1)))
	_, err = s.Candidates(ctx, "local", "u1", "7")
	require.ErrorIs(t, err, ErrTooManyCandidates)
	for range 4 {
		require.NoError(t, s.StoreCandidates(ctx, forged(250)))
	}
	n, err := rdb.LLen(ctx, "test:ks:cand:local:u1:7").Result()
	require.NoError(t, err)
	require.EqualValues(t, MaxCandidates+1, n)
	_, err = s.Candidates(ctx, "local", "u1", "7")
	require.ErrorIs(t, err, ErrTooManyCandidates)

	// Records of unknown versions count toward the bound too: unreadable junk cannot hide
	// a list's length.
	require.NoError(t, rdb.RPush(ctx, "test:ks:cand:local:u2:-", make([]any, MaxCandidates)...).Err())
	require.NoError(t, s.StoreCandidates(ctx, []admission.Candidate{{Route: "local", UID: "u2", Operation: admission.OpCreate, Digest: "d", User: audit.Identity{Username: "alice"}}}))
	_, err = s.Candidates(ctx, "local", "u2", "")
	require.ErrorIs(t, err, ErrTooManyCandidates)
}

// A push never extends a candidate list's expiry: it is set once, at the list's first push.
func TestCandidateTTLIsNotExtendedByPushes(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute)
	s.SetCandidateTTL(time.Minute)
	c := admission.Candidate{Route: "local", UID: "u1", Operation: admission.OpUpdate, BaseResourceVersion: "3", Digest: "d", User: audit.Identity{Username: "bob"}}
	require.NoError(t, s.StoreCandidates(ctx, []admission.Candidate{c}))
	key := "test:ks:cand:local:u1:3"
	ttl, err := rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second)
	// The list has aged (its expiry is nearer than a fresh TTL); more pushes leave it so.
	require.NoError(t, rdb.PExpire(ctx, key, 5*time.Second).Err())
	for range 3 {
		require.NoError(t, s.StoreCandidates(ctx, []admission.Candidate{c, c}))
	}
	ttl, err = rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Positive(t, ttl)
	require.LessOrEqual(t, ttl, 5*time.Second)
	// A list that somehow has no expiry (written by hand) gets one at the next push.
	require.NoError(t, rdb.Persist(ctx, key).Err())
	require.NoError(t, s.StoreCandidates(ctx, []admission.Candidate{c}))
	ttl, err = rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second)
}

// Through the joiner and the real store: the 65th candidate (the real one) behind 64 forged
// ones leaves the delete unresolved and counts the overflow; the victim is not the author.
func TestJoinerCandidateOverflowIsUnresolved(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute)
	reg := prometheus.NewRegistry()
	j, err := NewJoiner(JoinerOptions{Facts: s, Candidates: s, Grace: 5 * time.Second, Source: SourceAdmission, Metrics: NewMetrics(reg)})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { _ = j.Run(runCtx) }()

	var cs []admission.Candidate
	for i := range MaxCandidates {
		cs = append(cs, admission.Candidate{Route: "local", UID: "u1", Operation: admission.OpDelete, BaseResourceVersion: "7",
			User: audit.Identity{Username: "victim"}, RequestUID: "forged-" + strconv.Itoa(i)})
	}
	require.NoError(t, s.StoreCandidates(ctx, cs))
	require.NoError(t, s.StoreCandidates(ctx, []admission.Candidate{{Route: "local", UID: "u1", Operation: admission.OpDelete,
		BaseResourceVersion: "7", User: audit.Identity{Username: "alice"}, RequestUID: "real"}}))
	out := make(chan AttributedChange, 1)
	j.Join(watch.Change{Cluster: "local", UID: "u1", Name: "app", ResourceVersion: "7", Op: watch.OpDelete, BaseResourceVersion: "7"},
		func(a AttributedChange) { out <- a })
	a := await(t, out)
	require.False(t, a.Author.Resolved)
	require.Equal(t, UnresolvedUsername, a.Author.Username)
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.overflows))
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.ambiguous))
}
