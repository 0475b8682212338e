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
// Fact keys are written with SET NX: the first fact for a key wins. A no-op patch or apply
// answers with the unchanged resourceVersion, and the patch that removes the last finalizer of an
// object held in deletion answers with the resourceVersion of the delete; neither may take the
// credit of the write that really produced that resourceVersion, which was audited first.

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
		for _, k := range keys {
			pipe.SetArgs(ctx, k.key, val, redis.SetArgs{Mode: "NX", TTL: s.ttl})
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
	var f audit.Fact
	if err := json.Unmarshal(val, &f); err != nil {
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
