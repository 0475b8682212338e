// Package notify holds the one small type the data path uses to tell its readers (the
// controller) that something changed, without calling them: a set of dirty keys and a channel
// that signals it is not empty. It imports nothing of kubescribe, so any package may use it.
package notify

import "sync"

// Set is a set of keys marked since its reader last took them, and a signal that it is not
// empty. Marking never blocks: however many marks come between two takes, the reader wakes
// once and takes them all. The zero value is not usable; NewSet makes one.
type Set[K comparable] struct {
	mu    sync.Mutex
	dirty map[K]struct{}
	c     chan struct{}
}

// NewSet returns an empty Set.
func NewSet[K comparable]() *Set[K] {
	return &Set[K]{dirty: map[K]struct{}{}, c: make(chan struct{}, 1)}
}

// Mark adds keys and signals C. Marking no key signals nothing.
func (s *Set[K]) Mark(keys ...K) {
	if len(keys) == 0 {
		return
	}
	s.mu.Lock()
	for _, k := range keys {
		s.dirty[k] = struct{}{}
	}
	s.mu.Unlock()
	select {
	case s.c <- struct{}{}:
	default:
	}
}

// C receives a value after keys were marked; Take then returns them. C is never closed.
func (s *Set[K]) C() <-chan struct{} { return s.c }

// Take returns the keys marked since the last call, in no particular order, and forgets them.
func (s *Set[K]) Take() []K {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]K, 0, len(s.dirty))
	for k := range s.dirty {
		out = append(out, k)
	}
	clear(s.dirty)
	return out
}
