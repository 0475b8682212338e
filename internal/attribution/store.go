package attribution

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
//
// Several facts can claim one key. A no-op patch or apply answers with the unchanged
// resourceVersion; the patch that removes the last finalizer of an object held in deletion
// answers with the resourceVersion of the delete. Neither may take the credit of the write that
// really produced that resourceVersion, and the apiserver may deliver their batches in any order
// (it retries a failed batch while later ones go through). So a key keeps the best fact by rank:
// a delete beats any other verb, then the earliest stage timestamp wins. The stored value is the
// fixed-width rank followed by the fact's JSON, and the comparison is one atomic script.

// rankWidth is the length of the rank prefix: one class digit and 19 digits of Unix nanoseconds.
const rankWidth = 20

// keepBest stores ARGV[1]..ARGV[2] (rank, fact) under KEYS[1] unless the key holds a fact of a
// lower or equal rank; ARGV[3] is the TTL in milliseconds.
var keepBest = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, 20) <= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. ARGV[2], 'PX', ARGV[3])
return 1
`)

// DefaultFactTTL is how long a fact is kept when no TTL is configured: far longer than any grace
// window, short enough that Redis does not fill with facts nobody joins.
const DefaultFactTTL = 10 * time.Minute

// Store keeps attribution facts in Redis so that any replica can answer for a fact any replica
// received. It implements audit.FactStore.
type Store struct {
	rdb    redis.UniversalClient
	prefix keyspace.Prefix
	ttl    time.Duration
}

// NewStore returns a Store. ttl <= 0 means DefaultFactTTL.
func NewStore(rdb redis.UniversalClient, prefix keyspace.Prefix, ttl time.Duration) *Store {
	if ttl <= 0 {
		ttl = DefaultFactTTL
	}
	return &Store{rdb: rdb, prefix: prefix, ttl: ttl}
}

func (s *Store) writeKey(route, uid, rv string) string {
	return s.prefix.Key("fact", route, uid, "rv", rv)
}

func (s *Store) deleteKey(route, uid string) string {
	return s.prefix.Key("fact", route, uid, "delete")
}

func (s *Store) channel() string { return s.prefix.Key("facts") }

// StoreFacts stores facts durably, then announces them. It returns nil only once every fact is
// written, so the audit handler acknowledges a batch only when nothing in it can be lost.
func (s *Store) StoreFacts(ctx context.Context, facts []audit.Fact) error {
	if len(facts) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	var announce []string
	for i := range facts {
		f := &facts[i]
		keys := s.keysFor(f)
		if len(keys) == 0 {
			continue
		}
		val, err := json.Marshal(f)
		if err != nil {
			return fmt.Errorf("encoding fact %s: %w", f.AuditID, err)
		}
		rank := factRank(f)
		for _, k := range keys {
			keepBest.Eval(ctx, pipe, []string{k.key}, rank, val, s.ttl.Milliseconds())
			announce = append(announce, f.Route+"/"+k.uid)
		}
	}
	if len(announce) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("storing %d attribution facts: %w", len(announce), err)
	}
	// Waiters are woken by the announcement; one that misses it still looks once more at its
	// deadline, so a failed publish delays nothing but an attribution already past its grace.
	_ = s.rdb.Publish(ctx, s.channel(), strings.Join(announce, "\n")).Err()
	return nil
}

type factKey struct{ key, uid string }

// factRank orders facts claiming the same key; the lowest wins.
func factRank(f *audit.Fact) string {
	class := 1
	if f.Verb == "delete" || f.Verb == "deletecollection" {
		class = 0
	}
	ns := f.StageTimestamp.UnixNano()
	if ns < 0 {
		ns = 0
	}
	return fmt.Sprintf("%d%019d", class, ns)
}

// keysFor lists the keys a fact is stored under.
func (s *Store) keysFor(f *audit.Fact) []factKey {
	var keys []factKey
	switch f.Verb {
	case "delete":
		if f.UID != "" {
			keys = append(keys, factKey{s.deleteKey(f.Route, f.UID), f.UID})
		}
	case "deletecollection":
		for _, uid := range f.DeletedUIDs {
			keys = append(keys, factKey{s.deleteKey(f.Route, uid), uid})
		}
		return keys
	}
	if f.UID != "" && f.ResourceVersion != "" {
		keys = append(keys, factKey{s.writeKey(f.Route, f.UID, f.ResourceVersion), f.UID})
	}
	return keys
}

// Lookup returns the fact that explains a change of the object uid in cluster route: for a
// delete, the delete fact; otherwise the fact that produced resourceVersion rv. It returns
// (nil, nil) when there is none yet.
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
	var f audit.Fact
	if err := json.Unmarshal(val[rankWidth:], &f); err != nil {
		return nil, fmt.Errorf("decoding attribution fact %s: %w", key, err)
	}
	return &f, nil
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
