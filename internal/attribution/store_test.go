package attribution

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
	"github.com/kubescribe/kubescribe/internal/redistest"
)

// startRedis runs a real redis-server on a free loopback port for the test.
func startRedis(t testing.TB) *redis.Client { return redistest.Start(t) }

// arrivingAt makes s receive every batch at t: the facts of these tests have fixed stage
// timestamps, which must lie in the delivery window.
func arrivingAt(s *Store, t time.Time) *Store {
	s.now = func() time.Time { return t }
	return s
}

func TestStoreEarliestFactWins(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	s := arrivingAt(NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute), t0.Add(5*time.Second))

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
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	s := arrivingAt(NewStore(rdb, keyspace.MustParse("kubescribe"), 0), t0.Add(time.Second))
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
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{{Route: "local", UID: "u9", ResourceVersion: "5", Verb: "update", User: audit.Identity{Username: "bob"}, StageTimestamp: time.Now()}}))
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
	err := s.StoreFacts(context.Background(), []audit.Fact{{Route: "local", UID: "u1", ResourceVersion: "1", Verb: "create", StageTimestamp: time.Now()}})
	require.ErrorContains(t, err, "storing 1 attribution facts")
}

// countCalls counts the round trips a client makes: one per command or pipeline.
type countCalls struct{ n atomic.Int64 }

func (c *countCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *countCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(1); return next(ctx, cmds) }
}

func TestStoreFactsOneRoundTrip(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	s := arrivingAt(NewStore(rdb, keyspace.MustParse("kubescribe"), 0), t0.Add(time.Second))
	batch := func(n int, user string) []audit.Fact {
		var facts []audit.Fact
		for i := range n {
			facts = append(facts, audit.Fact{Route: "local", Resource: "configmaps", UID: "u" + strconv.Itoa(i), ResourceVersion: strconv.Itoa(100 + i),
				Verb: "update", User: audit.Identity{Username: user}, AuditID: "a" + strconv.Itoa(i), StageTimestamp: t0.Add(time.Duration(i) * time.Millisecond)})
		}
		// A held delete (two keys) and a deletecollection (one key per uid).
		facts = append(facts,
			audit.Fact{Route: "local", Resource: "configmaps", UID: "held", ResourceVersion: "7", Verb: "delete", Terminating: true, User: audit.Identity{Username: user}, StageTimestamp: t0},
			audit.Fact{Route: "local", Resource: "configmaps", Verb: "deletecollection", DeletedUIDs: []string{"c1", "c2"}, User: audit.Identity{Username: user}, StageTimestamp: t0})
		return facts
	}
	require.NoError(t, s.StoreFacts(ctx, batch(1, "warm-up"))) // loads the script
	require.NoError(t, rdb.FlushAll(ctx).Err())

	var calls countCalls
	rdb.AddHook(&calls)
	sub := rdb.Subscribe(ctx, "kubescribe:facts")
	defer sub.Close()
	_, err := sub.Receive(ctx) // subscribed
	require.NoError(t, err)

	calls.n.Store(0)
	require.NoError(t, s.StoreFacts(ctx, batch(400, "alice")))
	require.EqualValues(t, 1, calls.n.Load(), "a batch is one round trip, announcement included")
	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	ids := strings.Split(msg.Payload, "\n")
	require.Len(t, ids, 403)
	require.Equal(t, "local/u0", ids[0])
	require.Equal(t, []string{"local/held", "local/c1", "local/c2"}, ids[400:])

	n, err := rdb.DBSize(ctx).Result()
	require.NoError(t, err)
	require.EqualValues(t, 400+2+2, n)
	for _, probe := range []struct {
		uid, rv  string
		isDelete bool
	}{{"u399", "499", false}, {"held", "7", false}, {"held", "", true}, {"c2", "", true}} {
		got, err := s.Lookup(ctx, "local", probe.uid, probe.rv, probe.isDelete)
		require.NoError(t, err)
		require.Equal(t, "alice", got.User.Username, probe.uid)
	}

	// A retried batch (same facts, or a later no-op by someone else) changes nothing.
	require.NoError(t, s.StoreFacts(ctx, batch(400, "alice")))
	later := batch(400, "bob")
	for i := range later {
		later[i].StageTimestamp = later[i].StageTimestamp.Add(time.Minute)
	}
	arrivingAt(s, t0.Add(time.Minute+time.Second))
	require.NoError(t, s.StoreFacts(ctx, later))
	got, err := s.Lookup(ctx, "local", "u7", "107", false)
	require.NoError(t, err)
	require.Equal(t, "alice", got.User.Username)
}

func TestRecordFormat(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 1, 30, 0, 123456000, time.UTC)
	facts := []audit.Fact{
		{Route: "local", Resource: "configmaps", Namespace: "team-a", Name: "demo", UID: "u1", ResourceVersion: "42", Verb: "update",
			User: audit.Identity{Username: "alice", UID: "ua", Groups: []string{"devs", "system:authenticated"},
				Extra: map[string][]string{"z": {"1"}, "a": {"x", "y"}, "n": nil, "e": {}}},
			AuditID: "a1", StageTimestamp: t0},
		{Route: "r", Group: "apps", Resource: "deployments", Subresource: "scale", UID: "u2", ResourceVersion: "7", Terminating: true, Verb: "patch",
			User: audit.Identity{Username: "weird \"<&>\" \\ \n\t\b\f\x01 \u2028\u2029 é 😀 \xff"}, StageTimestamp: t0.Add(time.Nanosecond)},
		{Route: "r", Resource: "configmaps", Verb: "deletecollection", LabelSelector: "app in (a,b)", DeletedUIDs: []string{"c1", "c2"},
			User: audit.Identity{Username: "bob", Groups: []string{}}},
	}
	for _, f := range facts {
		got := appendRecord(nil, &f)
		want, err := json.Marshal(recordOf(&f))
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "the hand-written encoder must match encoding/json")
		back, err := decodeRecord(got)
		require.NoError(t, err)
		var norm audit.Fact
		require.NoError(t, json.Unmarshal(want, &norm)) // what encoding/json round-trips
		require.Equal(t, norm, *back)
	}
	require.True(t, strings.HasPrefix(string(appendRecord(nil, &facts[0])), `{"v":1,"route":"local",`))
}

func TestLookupRecordVersions(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	s := NewStore(rdb, keyspace.MustParse("kubescribe"), 0)
	rank := "1" + strings.Repeat("0", 19)
	set := func(uid, record string) {
		require.NoError(t, rdb.Set(ctx, "kubescribe:fact:local:"+uid+":rv:1", rank+record, time.Minute).Err())
	}
	set("current", `{"v":1,"route":"local","resource":"configmaps","uid":"current","resourceVersion":"1","verb":"update","user":{"username":"alice"},"auditID":"a","stageTimestamp":"2026-11-30T01:30:00Z"}`)
	set("legacy", `{"route":"local","resource":"configmaps","uid":"legacy","resourceVersion":"1","verb":"update","user":{"username":"alice"},"auditID":"a","stageTimestamp":"2026-11-30T01:30:00Z"}`)
	set("future", `{"v":2,"route":"local","user":"a different shape","who":{"username":"mallory"}}`)
	set("corrupt", `{"v":1,"user":`)

	for _, uid := range []string{"current", "legacy"} {
		got, err := s.Lookup(ctx, "local", uid, "1", false)
		require.NoError(t, err, uid)
		require.Equal(t, "alice", got.User.Username, uid)
		require.Equal(t, uid, got.UID)
	}
	got, err := s.Lookup(ctx, "local", "future", "1", false)
	require.Nil(t, got)
	var unknown *UnknownRecordVersionError
	require.ErrorAs(t, err, &unknown)
	require.Equal(t, 2, unknown.Version)
	require.ErrorContains(t, err, "fact record version 2 is unknown")

	got, err = s.Lookup(ctx, "local", "corrupt", "1", false)
	require.Nil(t, got)
	require.ErrorContains(t, err, "decoding fact record")
	require.False(t, errors.As(err, &unknown))
}

// records counts the records a slog handler receives and keeps their messages.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// Finding 4b: a fact's stage timestamp is chosen by whoever posts it, so a fact dated outside
// the apiserver's delivery window is no evidence. A forged fact dated 1970, arriving after the
// genuine one for the same key, is refused, counted and logged once per batch; it replaces
// nothing. So is a fact dated in the future.
func TestStoreRefusesFactsOutsideTheDeliveryWindow(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	logs := &records{}
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := arrivingAt(NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute), t0.Add(time.Second))
	s.SetObservability(slog.New(logs), m)

	genuine := audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "update", User: audit.Identity{Username: "alice"}, AuditID: "a1", StageTimestamp: t0}
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{genuine}))

	arrivingAt(s, t0.Add(3*time.Second))
	forged := []audit.Fact{
		{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "update", User: audit.Identity{Username: "mallory"}, AuditID: "f1", StageTimestamp: time.Unix(0, 0)},
		{Route: "local", UID: "u1", Verb: "delete", User: audit.Identity{Username: "mallory"}, AuditID: "f2", StageTimestamp: time.Unix(1, 0)},
		{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "patch", User: audit.Identity{Username: "mallory"}, AuditID: "f3"}, // no timestamp
		{Route: "local", UID: "u2", ResourceVersion: "4", Verb: "create", User: audit.Identity{Username: "mallory"}, AuditID: "f4", StageTimestamp: t0.Add(time.Hour)},
	}
	require.NoError(t, s.StoreFacts(ctx, forged), "a refused fact is no error: retrying the batch would not make it evidence")

	got, err := s.Lookup(ctx, "local", "u1", "10", false)
	require.NoError(t, err)
	require.Equal(t, "alice", got.User.Username)
	got, err = s.Lookup(ctx, "local", "u1", "", true)
	require.NoError(t, err)
	require.Nil(t, got, "the forged delete is not stored")
	got, err = s.Lookup(ctx, "local", "u2", "4", false)
	require.NoError(t, err)
	require.Nil(t, got, "a fact from the future is not stored")

	require.Equal(t, 3.0, testutil.ToFloat64(m.factsRefused.WithLabelValues("stale")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.factsRefused.WithLabelValues("future")))
	require.Len(t, logs.msgs, 1, "one log line for the batch: %q", logs.msgs)
	require.Contains(t, logs.msgs[0], "outside the apiserver's delivery window")
}

// The window's edges: DefaultFactMaxDelay plus the skew into the past, the skew into the
// future; SetFactWindow moves them.
func TestStoreFactWindowEdges(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := arrivingAt(NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute), now)
	oldest := now.Add(-DefaultFactMaxDelay - DefaultFactClockSkew)
	newest := now.Add(DefaultFactClockSkew)
	for i, c := range []struct {
		stage  time.Time
		stored bool
	}{
		{oldest, true}, {oldest.Add(-time.Millisecond), false},
		{newest, true}, {newest.Add(time.Millisecond), false},
	} {
		uid := "w" + strconv.Itoa(i)
		require.NoError(t, s.StoreFacts(ctx, []audit.Fact{{Route: "local", UID: uid, ResourceVersion: "1", Verb: "create", User: audit.Identity{Username: "alice"}, StageTimestamp: c.stage}}))
		got, err := s.Lookup(ctx, "local", uid, "1", false)
		require.NoError(t, err)
		require.Equal(t, c.stored, got != nil, "stage %s, arrival %s", c.stage, now)
	}
	s.SetFactWindow(time.Minute, time.Second)
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{{Route: "local", UID: "x", ResourceVersion: "1", Verb: "create", StageTimestamp: now.Add(-2 * time.Minute)}}))
	got, err := s.Lookup(ctx, "local", "x", "1", false)
	require.NoError(t, err)
	require.Nil(t, got)
}

// Why the timestamp is there at all: the real write's batch fails and is retried, and lands
// after the batch of a later no-op patch that answered the same resourceVersion. Delivered as
// late as the apiserver's default schedule allows, the real write keeps the credit.
func TestStoreRetriedBatchKeepsTheRealWritesCredit(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := arrivingAt(NewStore(rdb, keyspace.MustParse("test:ks:"), time.Minute), t0.Add(2*time.Second))
	write := audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "update", User: audit.Identity{Username: "alice"}, AuditID: "a1", StageTimestamp: t0}
	noop := audit.Fact{Route: "local", UID: "u1", ResourceVersion: "10", Verb: "patch", User: audit.Identity{Username: "bob"}, AuditID: "a2", StageTimestamp: t0.Add(time.Second)}
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{noop}))
	arrivingAt(s, t0.Add(DefaultFactMaxDelay))
	require.NoError(t, s.StoreFacts(ctx, []audit.Fact{write}))
	got, err := s.Lookup(ctx, "local", "u1", "10", false)
	require.NoError(t, err)
	require.Equal(t, "alice", got.User.Username)
}
