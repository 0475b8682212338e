package admission

import (
	"context"
	"sync"
)

// byteBudget bounds how many bytes of request body are being read and decoded at once, in all
// and per credential. A request takes its share before its body is read and gives it back once
// its candidate is built; a request that cannot get its share within a short wait is refused
// (429), so that N concurrent large reviews cost at most the budget, not N bodies. The cap per
// credential keeps one credential (a leaked token, a misbehaving apiserver) from holding the
// whole budget: the reviews of every other credential still find room.
//
// It is not fair: a large share may wait while small ones pass. The wait is short and the
// apiserver retries a 429 that carries Retry-After, so a large review is delayed, never queued
// without bound.
type byteBudget struct {
	mu     sync.Mutex
	free   int64
	perKey int64
	held   map[string]int64
	// changed is closed (and replaced) whenever bytes are given back.
	changed chan struct{}
}

// newByteBudget returns a budget of size bytes, of which one key may hold perKey at most.
func newByteBudget(size, perKey int64) *byteBudget {
	return &byteBudget{free: size, perKey: perKey, held: map[string]int64{}, changed: make(chan struct{})}
}

// acquire takes n bytes for key, waiting until ctx ends; it reports whether it took them. n
// must not be larger than the budget nor the cap per key (NewHandler checks the largest
// share, MaxBodyBytes, against both).
func (b *byteBudget) acquire(ctx context.Context, key string, n int64) bool {
	for {
		b.mu.Lock()
		if b.free >= n && b.held[key]+n <= b.perKey {
			b.free -= n
			b.held[key] += n
			b.mu.Unlock()
			return true
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// release gives n bytes of key back.
func (b *byteBudget) release(key string, n int64) {
	b.mu.Lock()
	b.free += n
	if b.held[key] -= n; b.held[key] <= 0 {
		delete(b.held, key)
	}
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}
