package attribution

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kubescribe/kubescribe/internal/audit"
	"github.com/kubescribe/kubescribe/internal/keyspace"
)

// Keys owned by this package, all under the configured prefix P:
//
//	P:fact:<route>:<uid>:rv:<resourceVersion>  a write fact, by the resourceVersion it produced
//	P:fact:<route>:<uid>:delete                the delete fact of an object
//	P:facts                                    pub/sub channel: "<route>/<uid>" per stored fact
//	P:wait:<route>:<uid>:rv:<resourceVersion>  when a change the apiserver may still explain was
//	P:wait:<route>:<uid>:delete                first seen waiting for its fact (Unix ms), so that
//	                                           a restart does not start its wait over
//	P:delivered:<route>                        when a batch of the route was last stored, by any
//	                                           replica (Unix ms, written at most once a second per
//	                                           process, the newest always; expires after
//	                                           audit.RouteHistoryWindow): audit.RouteHistory
//	P:deliveryfailed:<route>                   when a batch of the route last failed to be stored
//	                                           (Unix ms, best effort; expires after 10m)
//	P:reviewlost:<route>                       when an admission review of the route was last
//	                                           lost, by any replica (Unix ms, the newest kept;
//	                                           best effort; expires after 10m): admission.LossHistory
//
// Several facts can claim one key. A no-op patch or apply answers with the unchanged
// resourceVersion; the patch that removes the last finalizer of an object held in deletion
// answers with the resourceVersion of the delete. Neither may take the credit of the write that
// really produced that resourceVersion, and the apiserver may deliver their batches in any order
// (it retries a failed batch while later ones go through). So a key keeps the best fact by rank:
// a delete beats any other verb, then the earliest stage timestamp wins. The stored value is the
// fixed-width rank followed by the fact's record (record.go), and the comparison is done by one
// atomic script for the whole batch.
//
// The stage timestamp is written by whoever posts the batch, so it is evidence only within the
// apiserver's delivery schedule: a fact is refused (not stored, counted in
// kubescribe_attribution_facts_refused_total, logged once per batch) when its stage timestamp
// is older than its arrival minus the longest delay the apiserver's audit webhook can deliver
// a batch with (SetFactWindow; DefaultFactMaxDelay, worked out from k8s.io/apiserver's
// defaults), or newer than its arrival, each with a clock-skew allowance. Among the facts left,
// the earliest still wins, but it cannot reach further back than that window: a fact dated
// 1970 replaces nothing. docs/architecture.md ("Fact ranking") has the arithmetic and why no
// rule without a timestamp keeps the real write's credit.

// rankWidth is the length of the rank prefix: one class digit and 19 digits of Unix nanoseconds.
const rankWidth = 20

// storeBatch stores a batch of facts and announces them, in one call. KEYS are the fact keys;
// ARGV[1] is the TTL in milliseconds, ARGV[2] the channel, ARGV[3] the announcement ("" for
// none) and ARGV[3+i] the value for KEYS[i] (rank, then record). A new key is set at once (SET
// NX); an existing key keeps its value unless the new rank is lower (better), so storing a
// batch again (the apiserver retries a batch it got
// no 200 for) changes nothing. It returns the number of keys written.
var storeBatch = redis.NewScript(`
local n = 0
for i, key in ipairs(KEYS) do
  local v = ARGV[3 + i]
  if redis.call('SET', key, v, 'NX', 'PX', ARGV[1]) then
    n = n + 1
  elseif string.sub(redis.call('GET', key), 1, 20) > string.sub(v, 1, 20) then
    redis.call('SET', key, v, 'PX', ARGV[1])
    n = n + 1
  end
end
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return n
`)

// DefaultFactTTL is how long a fact is kept when no TTL is configured: far longer than any grace
// window, short enough that Redis does not fill with facts nobody joins.
const DefaultFactTTL = 10 * time.Minute

// DefaultFactMaxDelay is the longest the kube-apiserver's audit webhook backend, with its
// default settings (k8s.io/apiserver v0.37), takes from an event's ResponseComplete stage to
// the delivery of its batch:
//
//	30s     --audit-webhook-batch-max-wait: an event waits in the buffer until its batch is cut
//	2.5s    the batch throttle (10 batches/s): a full buffer of 10,000 events is 25 batches
//	150s    5 attempts (--audit-webhook-initial-backoff's wait.Backoff has Steps 5), each up
//	        to the webhook client's 30s request timeout (k8s.io/apiserver/pkg/util/webhook)
//	97.5s   the 4 waits between them, 10s x1.5 each time, plus up to 20% jitter:
//	        (10 + 15 + 22.5 + 33.75) x 1.2
//
// 280s in all. An apiserver whose audit webhook flags raise any of these needs a larger window.
const DefaultFactMaxDelay = 280 * time.Second

// DefaultFactClockSkew is how far the apiserver's clock, which writes stage timestamps, may be
// from kubescribe's, which receives them, either way.
const DefaultFactClockSkew = 10 * time.Second

// Reasons of kubescribe_attribution_facts_refused_total.
const (
	refusedStale  = "stale"  // older than its arrival minus the delivery window and the skew
	refusedFuture = "future" // newer than its arrival plus the skew
)

// Store keeps attribution facts in Redis so that any replica can answer for a fact any replica
// received. It implements audit.FactStore.
type Store struct {
	rdb    redis.UniversalClient
	prefix keyspace.Prefix
	ttl    time.Duration
	// candTTL is how long admission candidates are kept (SetCandidateTTL).
	candTTL time.Duration
	// cluster: keys of one batch live on different slots, so they cannot go to one script
	// call; each key gets its own call, all in one pipeline.
	cluster bool
	// maxDelay and skew: the delivery window a fact's stage timestamp must lie in
	// (SetFactWindow); now is the clock arrivals are read from.
	maxDelay, skew time.Duration
	now            func() time.Time
	log            *slog.Logger
	metrics        *Metrics
}

// NewStore returns a Store. ttl <= 0 means DefaultFactTTL.
func NewStore(rdb redis.UniversalClient, prefix keyspace.Prefix, ttl time.Duration) *Store {
	if ttl <= 0 {
		ttl = DefaultFactTTL
	}
	_, cluster := rdb.(*redis.ClusterClient)
	return &Store{rdb: rdb, prefix: prefix, ttl: ttl, candTTL: DefaultCandidateTTL, cluster: cluster,
		maxDelay: DefaultFactMaxDelay, skew: DefaultFactClockSkew, now: time.Now, log: slog.New(slog.DiscardHandler)}
}

// SetFactWindow sets how old (maxDelay) a fact's stage timestamp may be when the fact arrives,
// and the clock-skew allowance added on both sides; a value <= 0 keeps its default. Call it
// before the store is used.
func (s *Store) SetFactWindow(maxDelay, skew time.Duration) {
	if maxDelay > 0 {
		s.maxDelay = maxDelay
	}
	if skew > 0 {
		s.skew = skew
	}
}

// SetObservability makes the store log refused facts to log and count them in m (either may
// be nil). Call it before the store is used.
func (s *Store) SetObservability(log *slog.Logger, m *Metrics) {
	if log != nil {
		s.log = log
	}
	s.metrics = m
}

// plausible reports whether a stage timestamp can be that of an event the apiserver delivers
// at received, and if not, why.
func (s *Store) plausible(stage, received time.Time) (string, bool) {
	switch {
	case stage.Before(received.Add(-s.maxDelay - s.skew)):
		return refusedStale, false
	case stage.After(received.Add(s.skew)):
		return refusedFuture, false
	}
	return "", true
}

// DefaultCandidateTTL is how long an admission candidate is kept: a candidate that no watch
// event confirms within it expires silently.
const DefaultCandidateTTL = 2 * time.Minute

// SetCandidateTTL sets how long admission candidates are kept; ttl <= 0 keeps the default.
// Call it before the store is used.
func (s *Store) SetCandidateTTL(ttl time.Duration) {
	if ttl > 0 {
		s.candTTL = ttl
	}
}

func (s *Store) writeKey(route, uid, rv string) string {
	return s.prefix.Key("fact", route, uid, "rv", rv)
}

func (s *Store) deleteKey(route, uid string) string {
	return s.prefix.Key("fact", route, uid, "delete")
}

func (s *Store) channel() string { return s.prefix.Key("facts") }

// RecordDelivery records that a batch of route was stored at t (audit.RouteHistory).
func (s *Store) RecordDelivery(ctx context.Context, route string, t time.Time) error {
	return s.rdb.Set(ctx, s.prefix.Key("delivered", route), t.UnixMilli(), audit.RouteHistoryWindow).Err()
}

// LastDelivery returns when a batch of route was last stored, by any process sharing this Redis
// (audit.RouteHistory); zero when none was in RouteHistoryWindow.
func (s *Store) LastDelivery(ctx context.Context, route string) (time.Time, error) {
	return s.lastTime(ctx, s.prefix.Key("delivered", route), "delivered")
}

// RecordFailure records that a batch of route could not be stored at t (audit.RouteHistory):
// any process's changes observed up to audit.DeliverySlack before it wait for its retry. Kept
// deliveryFailureTTL.
func (s *Store) RecordFailure(ctx context.Context, route string, t time.Time) error {
	return s.rdb.Set(ctx, s.prefix.Key("deliveryfailed", route), t.UnixMilli(), deliveryFailureTTL).Err()
}

// LastFailure returns when a batch of route last failed, zero when none did lately
// (audit.RouteHistory).
func (s *Store) LastFailure(ctx context.Context, route string) (time.Time, error) {
	return s.lastTime(ctx, s.prefix.Key("deliveryfailed", route), "failed to deliver")
}

// recordNewest sets KEYS[1] to ARGV[1] (Unix ms) unless it holds a newer time, for ARGV[2] ms.
var recordNewest = redis.NewScript(`
local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if tonumber(ARGV[1]) > cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 0
`)

// RecordReviewLoss records that an admission review of route was lost at t, kept ttl unless a
// newer loss is recorded already (admission.LossHistory).
func (s *Store) RecordReviewLoss(ctx context.Context, route string, t time.Time, ttl time.Duration) error {
	return recordNewest.Run(ctx, s.rdb, []string{s.prefix.Key("reviewlost", route)}, t.UnixMilli(), ttl.Milliseconds()).Err()
}

// LastReviewLoss returns when an admission review of route was last lost, by any process
// sharing this Redis; zero when none was lately (admission.LossHistory).
func (s *Store) LastReviewLoss(ctx context.Context, route string) (time.Time, error) {
	return s.lastTime(ctx, s.prefix.Key("reviewlost", route), "lost an admission review")
}

// deliveryFailureTTL is longer than any change waits for its fact.
const deliveryFailureTTL = 10 * time.Minute

func (s *Store) lastTime(ctx context.Context, key, what string) (time.Time, error) {
	v, err := s.rdb.Get(ctx, key).Int64()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading when a route last %s: %w", what, err)
	}
	return time.UnixMilli(v), nil
}

// WaitingSince returns when a change of the object uid in cluster route (the write that
// produced rv, or its delete) was first seen waiting for its fact: now, recorded for ttl, the
// first time it is asked, and the recorded time after that, even from another process. The
// join measures the wait for a fact the apiserver may still be retrying from it, so a second
// restart does not start that wait over.
func (s *Store) WaitingSince(ctx context.Context, route, uid, rv string, isDelete bool, now time.Time, ttl time.Duration) (time.Time, error) {
	key := s.prefix.Key("wait", route, uid, "rv", rv)
	if isDelete {
		key = s.prefix.Key("wait", route, uid, "delete")
	}
	old, err := s.rdb.SetArgs(ctx, key, now.UnixMilli(), redis.SetArgs{Mode: "NX", Get: true, TTL: ttl}).Result()
	if errors.Is(err, redis.Nil) {
		return now, nil // recorded now
	}
	if err != nil {
		return now, fmt.Errorf("recording when a change began to wait: %w", err)
	}
	ms, err := strconv.ParseInt(old, 10, 64)
	if err != nil {
		return now, fmt.Errorf("%s holds %q, not a time", key, old)
	}
	if t := time.UnixMilli(ms); t.Before(now) {
		return t, nil
	}
	return now, nil
}

// batch holds the encoding of one StoreFacts call; reused through batches.
type batch struct {
	buf     []byte   // every value, then the announcement
	ends    []int    // buf[ends[i-1]:ends[i]] is the value of key i
	keyBuf  []byte   // every key, back to back
	keyEnds []int    // keyBuf[keyEnds[i-1]:keyEnds[i]] is key i
	keys    []string // the keys, cut from one string
	args    []any
}

// batches keeps a few batches for reuse. Unlike a sync.Pool it is not emptied by every garbage
// collection, so a steady stream of audit batches allocates no encoding buffers.
var batches = make(chan *batch, 4)

func getBatch() *batch {
	select {
	case b := <-batches:
		return b
	default:
		return new(batch)
	}
}

func putBatch(b *batch) {
	clear(b.keys)
	clear(b.args)
	b.buf, b.ends, b.keyBuf, b.keyEnds, b.keys, b.args = b.buf[:0], b.ends[:0], b.keyBuf[:0], b.keyEnds[:0], b.keys[:0], b.args[:0]
	select {
	case batches <- b:
	default:
	}
}

// appendKey appends the key P:fact:<route>:<uid>:<suffix...> (as writeKey and deleteKey).
func (s *Store) appendKey(b *batch, route, uid string, suffix ...string) {
	b.keyBuf = append(b.keyBuf, s.prefix.String()...)
	b.keyBuf = append(b.keyBuf, ":fact:"...)
	b.keyBuf = append(b.keyBuf, route...)
	b.keyBuf = append(b.keyBuf, ':')
	b.keyBuf = append(b.keyBuf, uid...)
	for _, p := range suffix {
		b.keyBuf = append(b.keyBuf, ':')
		b.keyBuf = append(b.keyBuf, p...)
	}
	b.keyEnds = append(b.keyEnds, len(b.keyBuf))
}

// StoreFacts stores facts durably and announces them, in one round trip to Redis: a single
// script call (one pipeline of calls, one per key, on Redis Cluster). It returns nil only once
// every fact is written, so the audit handler acknowledges a batch only when nothing in it can
// be lost. It does not keep facts.
func (s *Store) StoreFacts(ctx context.Context, facts []audit.Fact) error {
	if len(facts) == 0 {
		return nil
	}
	b := getBatch()
	defer putBatch(b)

	// Arrival: when the batch is handed over, right after the handler read and decoded it.
	received := s.now()
	var refused refusal
	// Values: the record is encoded once per fact and repeated for each of its keys.
	for i := range facts {
		f := &facts[i]
		if reason, ok := s.plausible(f.StageTimestamp, received); !ok {
			refused.add(reason, f)
			continue
		}
		first := len(b.keyEnds)
		s.appendKeys(b, f)
		if len(b.keyEnds) == first {
			continue
		}
		start := len(b.buf)
		b.buf = appendRank(b.buf, f)
		b.buf = appendRecord(b.buf, f)
		b.ends = append(b.ends, len(b.buf))
		for range len(b.keyEnds) - first - 1 {
			b.buf = append(b.buf, b.buf[start:b.ends[len(b.ends)-1]]...)
			b.ends = append(b.ends, len(b.buf))
		}
	}
	s.report(&refused, received)
	if len(b.keyEnds) == 0 {
		return nil
	}
	// One allocation for every key of the batch.
	all := string(b.keyBuf)
	for i, end := range b.keyEnds {
		start := 0
		if i > 0 {
			start = b.keyEnds[i-1]
		}
		b.keys = append(b.keys, all[start:end])
	}
	// The announcement: "<route>/<uid>" per key, one per line; the uid is the key's.
	annStart := len(b.buf)
	for i := range facts {
		if _, ok := s.plausible(facts[i].StageTimestamp, received); ok {
			b.buf = appendAnnouncement(b.buf, annStart, &facts[i])
		}
	}
	announcement := b.buf[annStart:]
	value := func(i int) []byte {
		start := 0
		if i > 0 {
			start = b.ends[i-1]
		}
		return b.buf[start:b.ends[i]]
	}

	ttl := s.ttl.Milliseconds()
	if !s.cluster {
		b.args = append(b.args, ttl, s.channel(), announcement)
		for i := range b.keys {
			b.args = append(b.args, value(i))
		}
		if err := storeBatch.Run(ctx, s.rdb, b.keys, b.args...).Err(); err != nil {
			return fmt.Errorf("storing %d attribution facts: %w", len(b.keys), err)
		}
		return nil
	}
	// Redis Cluster: one call per key (each goes to its key's node), the announcement with
	// the last; one pipeline.
	pipe := s.rdb.Pipeline()
	for i, k := range b.keys {
		ann := []byte(nil)
		if i == len(b.keys)-1 {
			ann = announcement
		}
		storeBatch.Eval(ctx, pipe, []string{k}, ttl, s.channel(), ann, value(i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("storing %d attribution facts: %w", len(b.keys), err)
	}
	return nil
}

// refusal sums up the facts of one batch refused as evidence.
type refusal struct {
	stale, future int
	// first is the first refused fact's (for the log: no user, no object).
	route, auditID, reason string
	stage                  time.Time
}

func (r *refusal) add(reason string, f *audit.Fact) {
	if r.stale+r.future == 0 {
		r.route, r.auditID, r.reason, r.stage = f.Route, f.AuditID, reason, f.StageTimestamp
	}
	if reason == refusedStale {
		r.stale++
	} else {
		r.future++
	}
}

// report counts a batch's refused facts and logs them, once.
func (s *Store) report(r *refusal, received time.Time) {
	if r.stale+r.future == 0 {
		return
	}
	if s.metrics != nil {
		s.metrics.factsRefused.WithLabelValues(refusedStale).Add(float64(r.stale))
		s.metrics.factsRefused.WithLabelValues(refusedFuture).Add(float64(r.future))
	}
	s.log.Warn("audit facts refused as evidence: their stage timestamps lie outside the apiserver's delivery window",
		"route", r.route, "stale", r.stale, "future", r.future, "firstAuditID", r.auditID, "firstReason", r.reason,
		"firstStageTimestamp", r.stage, "received", received, "maxDelay", s.maxDelay, "clockSkew", s.skew)
}

// appendRank appends the rank of f: facts claiming the same key keep the lowest.
func appendRank(b []byte, f *audit.Fact) []byte {
	class := byte('1')
	if f.Verb == "delete" || f.Verb == "deletecollection" {
		class = '0'
	}
	ns := f.StageTimestamp.UnixNano()
	if ns < 0 {
		ns = 0
	}
	b = append(b, class)
	var digits [19]byte
	for i := len(digits) - 1; i >= 0; i-- {
		digits[i] = byte('0' + ns%10)
		ns /= 10
	}
	return append(b, digits[:]...)
}

// appendKeys appends the keys a fact is stored under (writeKey, deleteKey) to b.
func (s *Store) appendKeys(b *batch, f *audit.Fact) {
	switch f.Verb {
	case "delete":
		if f.UID != "" {
			s.appendKey(b, f.Route, f.UID, "delete")
		}
	case "deletecollection":
		for _, uid := range f.DeletedUIDs {
			s.appendKey(b, f.Route, uid, "delete")
		}
		return
	}
	if f.UID != "" && f.ResourceVersion != "" {
		s.appendKey(b, f.Route, f.UID, "rv", f.ResourceVersion)
	}
}

// appendAnnouncement appends "<route>/<uid>" for the object of each key appendKeys gives f
// (each object once), newline-separated; start is where the announcement began in b.
func appendAnnouncement(b []byte, start int, f *audit.Fact) []byte {
	one := func(uid string) {
		if len(b) > start {
			b = append(b, '\n')
		}
		b = append(b, f.Route...)
		b = append(b, '/')
		b = append(b, uid...)
	}
	switch {
	case f.Verb == "deletecollection":
		for _, uid := range f.DeletedUIDs {
			one(uid)
		}
	case f.UID != "" && (f.Verb == "delete" || f.ResourceVersion != ""):
		one(f.UID)
	}
	return b
}

// Lookup returns the fact that explains a change of the object uid in cluster route: for a
// delete, the delete fact; otherwise the fact that produced resourceVersion rv. It returns
// (nil, nil) when there is none yet. A record of a version this build does not know is no
// fact: Lookup returns an error naming the version (the joiner logs it and counts it in
// kubescribe_attribution_lookup_errors_total) and the change waits on, or is unresolved.
func (s *Store) Lookup(ctx context.Context, route, uid, rv string, isDelete bool) (*audit.Fact, error) {
	key := s.writeKey(route, uid, rv)
	if isDelete {
		key = s.deleteKey(route, uid)
	}
	val, err := s.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up attribution fact: %w", err)
	}
	if len(val) < rankWidth {
		return nil, fmt.Errorf("attribution fact %s is truncated", key)
	}
	f, err := decodeRecord(val[rankWidth:])
	if err != nil {
		return nil, fmt.Errorf("attribution fact %s: %w", key, err)
	}
	return f, nil
}

// Announcements delivers "<route>/<uid>" for every fact stored by any replica, until ctx ends.
// go-redis re-subscribes by itself after a connection loss.
func (s *Store) Announcements(ctx context.Context) <-chan string {
	out := make(chan string, 256)
	sub := s.rdb.Subscribe(ctx, s.channel())
	go func() {
		defer close(out)
		defer sub.Close()
		msgs := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				for _, id := range strings.Split(m.Payload, "\n") {
					select {
					case out <- id:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return out
}

// Ping reports whether Redis answers; used by readiness.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }
