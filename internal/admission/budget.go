package admission

import (
	"context"
	"sync"
)

// byteBudget bounds how many bytes of request body are being read and decoded at once. A
// request takes its share before its body is read and gives it back once its candidate is
// built; a request that cannot get its share within a short wait is refused (429), so that N
// concurrent large reviews cost at most the budget, not N bodies.
//
// It is not fair: a large share may wait while small ones pass. The wait is short and the
// apiserver retries a 429 that carries Retry-After, so a large review is delayed, never queued
// without bound.
type byteBudget struct {
	mu   sync.Mutex
	free int64
	// changed is closed (and replaced) whenever bytes are given back.
	changed chan struct{}
}

func newByteBudget(size int64) *byteBudget {
	return &byteBudget{free: size, changed: make(chan struct{})}
}

// acquire takes n bytes, waiting until ctx ends; it reports whether it took them. n must not
// be larger than the budget (NewHandler checks the largest share, MaxBodyBytes, against it).
func (b *byteBudget) acquire(ctx context.Context, n int64) bool {
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
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

// release gives n bytes back.
func (b *byteBudget) release(n int64) {
	b.mu.Lock()
	b.free += n
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}
