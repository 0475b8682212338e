package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// lifecycle is a stack of stop functions: each part registers its stop as it starts, and stop
// runs them in reverse order. A failure part-way through start therefore stops exactly what
// already started, and a new part is one more registration, not an edit to a hand-written
// shutdown sequence.
type lifecycle struct {
	mu    sync.Mutex
	stops []namedStop
	done  bool
}

type namedStop struct {
	name string
	fn   func(context.Context) error
}

// onStop registers fn to run at stop, before everything registered earlier.
func (l *lifecycle) onStop(name string, fn func(context.Context) error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stops = append(l.stops, namedStop{name, fn})
}

// stop runs the registered stops, newest first, each once, and joins their errors, each named
// after its part. Every stop runs even when ctx has ended, so each can release what it holds;
// it is up to each to bound its own wait by ctx. stop is idempotent.
func (l *lifecycle) stop(ctx context.Context) error {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return nil
	}
	l.done = true
	stops := l.stops
	l.stops = nil
	l.mu.Unlock()
	var errs []error
	for _, s := range slices.Backward(stops) {
		if err := s.fn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}
